"""The hooks' side of the slowdown signals: step notes, the union of timed ops, the
``rank_steps`` item a step's closing message carries (docs/detection.md, section 3)."""

from __future__ import annotations

import gc
import itertools

import pytest

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.integrations import (
    LocalTimings,
    linear_flops,
    timed_batches,
    watch_gc_pauses,
)
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.signals import covered_ns
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.codec import decode_ops

IDENT = Identity(job="j", host="h", rank=1, dp_rank=1, pp_rank=0, dp_size=2, pp_size=1)


def test_covered_is_the_union_clipped_to_the_step() -> None:
    # [0,10) and [5,15) overlap -> [2,15) once clipped at 2; [30,35) clipped at 33
    assert covered_ns([(30, 5), (0, 10), (5, 10)], 2, 33) == 13 + 3
    assert covered_ns([], 0, 100) == 0
    assert covered_ns([(0, 100)], 10, 20) == 10
    assert covered_ns([(0, 5), (1, 2), (2, 1)], 0, 100) == 5  # nested


def test_linear_flops_from_shapes() -> None:
    assert linear_flops(tokens=64, in_features=128, out_features=256) == 2 * 64 * 128 * 256


def _tracker(sent: list[bytes]) -> RankWatch:
    ticks = itertools.count(0, 10)
    clock = Clock(read=lambda: next(ticks))
    return RankWatch(
        IDENT,
        SinkTransport(lambda kind, value: sent.append(value) if kind == "ops" else None),
        clock=clock,
        publisher=PublisherConfig(batch_window_s=0.0),
        start=False,
    )


def test_a_step_closes_with_its_summary() -> None:
    sent: list[bytes] = []
    rw = _tracker(sent)
    rw.step_begin(0)  # read 0
    with rw.op("optimizer"):  # reads 10, 20
        pass
    rw.step_end()  # read 30: the first step has no previous end
    rw.note_data_wait(7)
    rw.step_begin(1)  # read 40
    with rw.op("forward-compute", mb=0):  # reads 50, 60
        rw.note_gc(4)  # inside forward
    rw.work("forward-compute", 1.5e9)
    rw.comm("grads-reduce-scatter", 4096, group=2, algo="all-reduce")
    with rw.op("grads-reduce-scatter"):  # reads 70, 80
        pass
    rw.samples(16, dtype="float32")
    rw.step_end()  # read 90
    rw.publisher.step_once(0.0)
    items = [item for value in sent for item in decode_ops(value).rank_steps]
    assert [i["step"] for i in items] == [0, 1]
    one = items[1]
    assert one["begin_ns"] - one["prev_end_ns"] == 10  # reads 30 -> 40
    assert one["end_ns"] - one["begin_ns"] == 50  # reads 40 -> 90
    assert one["covered_ns"] == 20  # [50,60) and [70,80)
    assert (one["samples"], one["dtype"], one["data_wait_ns"]) == (16, "float32", 7)
    assert (one["gc_ns"], one["gc_count"]) == (4, 1)
    assert one["ops"] == [
        {"optype": "forward-compute", "n": 1, "time_ns": 10, "gc_ns": 4, "flops": 1.5e9},
        {
            "optype": "grads-reduce-scatter",
            "n": 1,
            "time_ns": 10,
            "bytes": 4096,
            "group": 2,
            "algo": "all-reduce",
        },
    ]
    assert items[0]["prev_end_ns"] is None and items[0]["data_wait_ns"] == 0


def test_unknown_algorithm_is_ignored_with_a_warning() -> None:
    rw = _tracker([])
    rw.step_begin(0)
    with pytest.warns(RuntimeWarning, match="algorithm"):
        rw.comm("grads-reduce-scatter", 10, group=2, algo="butterfly")
    assert rw.notes.work == {}


def test_gc_pauses_and_data_waits_reach_the_notes() -> None:
    rw = _tracker([])
    undo = watch_gc_pauses(rw)
    try:
        gc.collect()
    finally:
        undo()
    assert rw.notes.gc_count >= 1 and rw.notes.gc_ns > 0
    reads = iter([0, 5, 10, 30, 40])
    timings = LocalTimings()
    assert list(timed_batches([1, 2], timings, read=lambda: next(reads), rw=rw)) == [1, 2]
    assert rw.notes.data_wait_ns == 5 + 20 == timings.total_ns
