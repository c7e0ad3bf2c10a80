"""The cyclic garbage collector in a long-running worker: what it costs, and the objects
of start-up frozen out of its reach.

CPython frees most objects by reference counting; its cyclic collector also scans, in
each full collection, every container object still tracked. A worker's start-up leaves
tens of thousands of them alive for good (the modules of faust, aiokafka,
clickhouse-connect, pyarrow and numpy, the app and its clients), and every full
collection scanned them all again: in an SE-shaped drain, full collections took 55 ms
each and the collector 6.7% of the worker's CPU (benchmarks/README.md, "The garbage
collector"). ``gc.freeze()`` moves every object alive at that moment into a generation
the collector never scans, so a full collection looks only at what the worker made
since: its jobs' state, held messages and rows. Objects frozen are still freed by
reference counting; only a cycle among them would outlive its use, and start-up objects
live as long as the process anyway.

The collector's own figures (collections per generation, seconds, objects frozen at
start-up) go into every worker's health file (:class:`GcClock`), so its share is seen,
not guessed. The frozen count is the one taken at the freeze: ``gc.get_freeze_count()``
walks the whole frozen list, and asked once a tick it took 2.5% of an SE-shaped drain's
CPU (a py-spy profile: cold memory, an estimated 19 ms a call for 127k objects).
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcClock:
    """Collections per generation and the seconds they took, since it was installed
    (``gc.callbacks``: two calls per collection, a few hundred a second at most)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self._started: float | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1
            self._started = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "gc_s": round(self.seconds, 3),
            "gc_collections": list(self.collections),
            "gc_frozen": _frozen[0] if _frozen else 0,
        }


_clock: GcClock | None = None
_frozen: list[int] = []
"""How many objects :func:`freeze_startup` froze (empty until it has)."""


def gc_clock() -> GcClock:
    """The process's one clock (installed on first use)."""
    global _clock
    if _clock is None:
        _clock = GcClock()
    return _clock


def freeze_startup() -> bool:
    """Freeze every object alive now, once per process (True the time it does). Called
    when a worker first gets its partitions: its libraries are loaded and its clients
    made by then, and no job's state exists yet."""
    if gc.get_freeze_count():
        return False
    gc.collect()  # what start-up left as garbage goes first, not into the frozen set
    gc.freeze()
    _frozen[:] = [gc.get_freeze_count()]
    return True
