"""`rankwatch hang report` lists a culprit's own threads before the hooks' threads: the
stuck rank's main thread is what a person reads first, the publisher's idle wait is not."""

from __future__ import annotations

from rankwatch.commands.hang import is_hook_thread

THREADING = "/usr/lib/python3.11/threading.py"
PUBLISHER = (
    f"{THREADING}:Thread._bootstrap;{THREADING}:Thread._bootstrap_inner;"
    f"{THREADING}:Thread.run;/x/rankwatch/hooks/publisher.py:Publisher._run;"
    f"{THREADING}:Event.wait"
)
MAIN = (
    "<frozen runpy>:_run_module_as_main;/x/rankwatch/workload/train.py:Rank._step;"
    "/x/rankwatch/hooks/integrations.py:_wrap_compute.<locals>.timed;/x/model.py:forward"
)
LOADER = f"{THREADING}:Thread._bootstrap;{THREADING}:Thread.run;/x/torch/utils/data/worker.py:loop"


def test_only_threads_the_hooks_run_are_hook_threads() -> None:
    assert is_hook_thread({"stack": PUBLISHER})
    assert not is_hook_thread({"stack": MAIN})  # passes through a hook, runs the model
    assert not is_hook_thread({"stack": LOADER})  # a thread of the job's own


def test_older_py_spy_and_the_watchdog_name_the_frame_run() -> None:
    assert is_hook_thread({"stack": PUBLISHER.replace(":Thread.run;", ":run;")})


def test_the_main_thread_sorts_before_the_publisher() -> None:
    stacks = [{"stack": PUBLISHER}, {"stack": MAIN}, {"stack": LOADER}]
    assert [s["stack"] for s in sorted(stacks, key=is_hook_thread)] == [MAIN, LOADER, PUBLISHER]
