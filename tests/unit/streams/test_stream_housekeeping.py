"""chDB's background threads lowered in priority: by name, once each, never the rest.

Real threads of this process, named as chDB names its own (a thread may rename itself
through ``/proc/thread-self/comm``); the engine's real thread names are checked on
chDB itself in ``tests/integration/test_store_chdb.py``."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rankwatch.streams.kit import housekeeping
from rankwatch.streams.kit.housekeeping import Housekeeping

if not sys.platform.startswith("linux"):
    pytest.skip("per-thread nice values are Linux's", allow_module_level=True)


@contextmanager
def named_thread(name: str) -> Iterator[int]:
    """A live thread of this process named ``name``; yields its thread id."""
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def run() -> None:
        Path("/proc/thread-self/comm").write_text(name)
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield tid[0]
    finally:
        done.set()
        thread.join()


def nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


BASE = nice(threading.get_native_id())
"""This process's own nice value (a test run may itself be niced); new threads inherit it."""
pytestmark = pytest.mark.skipif(BASE >= 19, reason="this process runs at nice 19 already")


def test_background_threads_are_lowered_and_query_threads_are_not() -> None:
    with named_thread("MergeMutate") as merge, named_thread("ThreadPool") as pool:
        keep = Housekeeping(19)
        keep()
        assert nice(merge) == 19
        assert nice(pool) == BASE  # an insert's own threads: a step waits for them
        assert nice(threading.get_native_id()) == BASE
        # at least: chDB's own background threads count too when an earlier test of this
        # process opened a store
        assert keep.threads_lowered >= 1


def test_threads_started_later_are_lowered_at_the_next_call_not_sooner() -> None:
    now = [0.0]
    keep = Housekeeping(19, every_s=1.0, clock=lambda: now[0])
    keep()
    with named_thread("BgSchPool") as late:
        keep()  # within every_s of the last look: no look
        assert nice(late) == BASE
        now[0] = 1.0
        keep()
        assert nice(late) == 19


def test_zero_leaves_every_thread_alone() -> None:
    with named_thread("MergeMutate") as merge:
        Housekeeping(0)()
        assert nice(merge) == BASE


def test_without_proc_it_gives_up_quietly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(housekeeping, "TASKS", tmp_path / "absent")
    keep = Housekeeping(19, every_s=0.0)
    keep()
    keep()
    assert keep.nice == 0
    assert keep.threads_lowered == 0
