"""The collector's clock counts what it sees, and start-up is frozen once per process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rankwatch.streams.kit import heap
from rankwatch.streams.kit.heap import GcClock, freeze_startup


@pytest.fixture
def clock() -> Iterator[GcClock]:
    made = GcClock()
    yield made
    gc.callbacks.remove(made._on_gc)


def test_the_clock_counts_each_collection_by_generation(clock: GcClock) -> None:
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    counted = clock.snapshot()
    assert counted["gc_collections"][0] >= 1
    assert counted["gc_collections"][2] >= 2  # at least ours: the interpreter may add its own
    assert counted["gc_s"] >= 0.0


def test_startup_is_frozen_once_and_frozen_objects_stay_out_of_scans(clock: GcClock) -> None:
    if gc.get_freeze_count():
        pytest.skip("this process froze its heap before the test")
    try:
        kept = [[] for _ in range(1000)]  # alive at the freeze: never scanned after it
        assert freeze_startup()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        assert not freeze_startup()  # a second assignment freezes nothing more
        assert gc.get_freeze_count() <= frozen  # (frozen objects are still freed by refcount)
        scanned = gc.get_objects()  # what the collector's generations hold
        assert not any(o is kept[0] for o in scanned)
        assert gc.is_tracked(kept[0])
        assert clock.snapshot()["gc_frozen"] >= frozen  # the count taken at the freeze
    finally:
        gc.unfreeze()
        heap._frozen.clear()
