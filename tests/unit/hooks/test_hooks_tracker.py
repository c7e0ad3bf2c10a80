"""The training-thread API: seq ids, coordinates, misuse, the module-level switch."""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from rankwatch import hooks
from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.integrations import (
    LocalTimings,
    announce_checkpoints,
    timed_batches,
    timed_comm_hook,
    timed_optimizer,
    watch_gc,
    watch_pipeline,
)
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.codec import decode

IDENT = Identity(job="j", host="h", rank=5, dp_rank=1, pp_rank=2, dp_size=2, pp_size=4)


def tracker() -> RankWatch:
    ticks = itertools.count(0, 10)
    return RankWatch(
        IDENT, SinkTransport(lambda k, v: None), clock=Clock(read=lambda: next(ticks)), start=False
    )


def records(rw: RankWatch) -> list[tuple]:
    return rw.buffer.take()[0]


def test_seq_ids_count_per_optype_in_start_order_and_restart_each_step() -> None:
    rw = tracker()
    rw.step_begin(3)
    with rw.op("forward-compute", mb=0), rw.op("gc"):
        pass
    with rw.op("forward-compute", mb=1):
        pass
    rw.step_begin(4)
    with rw.op("forward-compute", mb=0):
        pass
    got = [(r[0], r[1], r[2]) for r in records(rw)]
    # the gc inside forward 0 ends first but both were numbered at their start
    assert got == [
        (3, "gc", 0),
        (3, "forward-compute", 0),
        (3, "forward-compute", 1),
        (4, "forward-compute", 0),
    ]


def test_compute_ops_carry_chunk_and_global_chunk_others_minus_one() -> None:
    rw = tracker()
    with rw.op("forward-compute", mb=3, chunk=1):
        pass
    with rw.op("optimizer", mb=3, chunk=1):
        pass
    fwd, opt = records(rw)
    assert fwd[3:6] == (3, 1, 1 * 4 + 2)
    assert opt[3:6] == (-1, -1, -1)
    assert fwd[7] == 10  # two reads 10 ticks apart


def test_unknown_op_type_warns_once_and_is_ignored() -> None:
    rw = tracker()
    with pytest.warns(RuntimeWarning, match="unknown op type"), rw.op("forward"):
        pass
    with rw.op("forward"):
        pass
    assert records(rw) == []


def test_module_api_is_a_no_op_until_init_and_when_switched_off() -> None:
    hooks.shutdown()
    with hooks.op("forward-compute", mb=0):
        hooks.step_end()
    got: list[tuple[str, bytes]] = []
    off = hooks.HooksConfig(enabled=False)
    assert hooks.init(off, identity=IDENT, sink=lambda k, v: got.append((k, v))) is None
    rw = hooks.init(hooks.HooksConfig(), identity=IDENT, sink=lambda k, v: got.append((k, v)))
    assert rw is hooks.current()
    hooks.step_begin(0)
    with hooks.op("optimizer"):
        pass
    hooks.step_end()
    hooks.shutdown()
    assert [k for k, _ in got].count("ops") == 1


def test_gc_pauses_on_the_training_thread_become_gc_ops() -> None:
    rw = tracker()
    undo = watch_gc(rw)
    try:
        gc.collect()
    finally:
        undo()
    assert [r[1] for r in records(rw)] == ["gc"]


def test_optimizer_and_data_waits() -> None:
    rw = tracker()
    opt = SimpleNamespace(step=lambda: None)
    undo = timed_optimizer(rw, opt)
    opt.step()
    undo()
    opt.step()
    assert [r[1] for r in records(rw)] == ["optimizer"]
    timings = LocalTimings()
    ticks = itertools.count(0, 5)
    assert list(timed_batches([1, 2], timings, read=lambda: next(ticks))) == [1, 2]
    assert (timings.count, timings.total_ns) == (2, 10)


class FakeStage:
    """The duck-typed surface of a torch PipelineStage that the integration touches."""

    stage_index = 6  # chunk 1 of a 4-stage pipeline, global chunk 6

    def forward_one_chunk(self, mb: int, *a: Any) -> str:
        return f"F{mb}"

    def backward_one_chunk(self, mb: int, **k: Any) -> str:
        return f"B{mb}"

    def get_fwd_recv_ops(self, mb: int) -> list[object]:
        return [object()]

    def get_fwd_send_ops(self, mb: int) -> list[object]:
        return [object(), object()]

    def get_bwd_recv_ops(self, mb: int) -> list[object]:
        return [object()]

    def get_bwd_send_ops(self, mb: int) -> list[object]:
        return []


def test_pipeline_stages_and_batched_p2p() -> None:
    rw = tracker()
    stage = FakeStage()

    def post(ops: list[object], desc: str | None = None) -> list[object]:
        return [object() for _ in ops]  # one work per op, like gloo

    schedules = SimpleNamespace(_batch_p2p=post, _wait_batch_p2p=lambda ws: None)
    watch = watch_pipeline(rw, [stage], schedules)
    assert stage.forward_one_chunk(0, (), {}) == "F0"
    fused = schedules._batch_p2p(stage.get_fwd_send_ops(0) + stage.get_bwd_recv_ops(0))
    assert stage.backward_one_chunk(0, loss=None) == "B0"
    schedules._wait_batch_p2p(fused[:2])
    schedules._wait_batch_p2p(fused[2:])  # the batch ends with its last work
    watch.undo()
    assert "forward_one_chunk" not in vars(stage)
    got = [(r[1], r[2], r[3], r[4], r[5]) for r in records(rw)]
    assert got == [
        ("forward-compute", 0, 0, 1, 6),
        ("backward-compute", 0, 0, 1, 6),
        ("backward-recv", 0, -1, -1, -1),
        ("forward-send", 0, -1, -1, -1),
    ]


class Work:
    def __init__(self) -> None:
        self.completed = False

    def is_completed(self) -> bool:
        return self.completed


def test_a_send_waited_late_ends_at_the_compute_after_which_it_completed() -> None:
    rw = tracker()
    stage = FakeStage()
    posted: list[Work] = []

    def post(ops: list[object], desc: str | None = None) -> list[Work]:
        posted.extend(Work() for _ in ops)
        return posted[-len(ops) :]

    schedules = SimpleNamespace(_batch_p2p=post, _wait_batch_p2p=lambda ws: None)
    watch_pipeline(rw, [stage], schedules)
    works = schedules._batch_p2p(stage.get_fwd_send_ops(0))
    stage.forward_one_chunk(1)  # sends not complete yet: still open
    for w in works:
        w.completed = True
    stage.forward_one_chunk(2)  # now they are: the send ends here
    schedules._wait_batch_p2p(works)  # the late wait adds nothing
    got = [(r[1], r[6] - rw.clock.shift_ns, r[7]) for r in records(rw)]
    assert [g[0] for g in got] == ["forward-compute", "forward-compute", "forward-send"]
    assert got[2][1] + got[2][2] == got[1][1] + got[1][2] + 10  # one clock tick later


def test_a_send_still_open_ends_when_the_next_send_of_its_type_is_posted() -> None:
    rw = tracker()
    stage = FakeStage()

    def post(ops: list[object], desc: str | None = None) -> list[Work]:
        return [Work() for _ in ops]  # never complete on their own

    schedules = SimpleNamespace(_batch_p2p=post, _wait_batch_p2p=lambda ws: None)
    watch_pipeline(rw, [stage], schedules)
    first = schedules._batch_p2p(stage.get_fwd_send_ops(0))
    second = schedules._batch_p2p(stage.get_fwd_send_ops(1))
    schedules._wait_batch_p2p(first + second)
    got = [(r[1], r[2], r[6] - rw.clock.shift_ns, r[7]) for r in records(rw)]
    assert [g[:2] for g in got] == [("forward-send", 0), ("forward-send", 1)]
    assert got[0][2] + got[0][3] == got[1][2]  # the first ends where the second starts


class Future:
    """Completes when ``finish`` is called, running its callbacks there (another thread
    in DDP)."""

    def __init__(self, value: object) -> None:
        self._value = value
        self.callbacks: list[Any] = []

    def then(self, fn: Any) -> Future:
        nxt = Future(None)
        self.callbacks.append(lambda: setattr(nxt, "_value", fn(self)))
        return nxt

    def value(self) -> object:
        return self._value

    def finish(self) -> None:
        for cb in self.callbacks:
            cb()


def test_ddp_comm_hook_buckets_are_timed_and_emitted_at_step_end() -> None:
    rw = tracker()
    futures: list[Future] = []

    def allreduce(state: object, bucket: object) -> Future:
        futures.append(Future(f"reduced {bucket}"))
        return futures[-1]

    timed = timed_comm_hook(rw, allreduce)
    rw.step_begin(2)
    outs = [timed(None, b) for b in ("b0", "b1")]

    def finish_all() -> None:
        for f in futures:
            f.finish()

    backend = threading.Thread(target=finish_all)
    backend.start()
    backend.join()
    assert outs[0].value() == "reduced b0"
    assert records(rw) == []  # queued, not yet emitted from the backend's thread
    rw.step_end()
    assert [(r[0], r[1], r[2]) for r in records(rw)] == [
        (2, "grads-reduce-scatter", 0),
        (2, "grads-reduce-scatter", 1),
    ]


def test_importing_the_hooks_loads_neither_numpy_nor_kafka_nor_torch() -> None:
    code = (
        "import sys, rankwatch.hooks, rankwatch.hooks.integrations;"
        "print(sorted(m for m in ('numpy','aiokafka','torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_checkpoint_calls_are_announced_as_phases_and_undone() -> None:
    """``announce_checkpoints(rw, torch)`` wraps the module's save and load: each runs
    inside its phase (what the heartbeats carry), an error still ends the phase, and
    the undo puts the originals back."""
    rw = tracker()
    seen: list[str | None] = []

    def where() -> str | None:  # what a heartbeat sent now would say
        got = decode("heartbeats", rw._heartbeat()).get("phase")
        return None if got is None else got["name"]

    def save(obj: object, path: str) -> None:
        seen.append(where())

    def load(path: str) -> object:
        seen.append(where())
        raise OSError("no such file")

    module = SimpleNamespace(save=save, load=load, other=save)
    undo = announce_checkpoints(rw, module, bound_s=900)
    module.save({}, "x")
    with pytest.raises(OSError):
        module.load("x")
    assert seen == ["checkpoint-save", "checkpoint-load"] and where() is None
    undo()
    assert module.save is save and module.load is load
    rw.close()
