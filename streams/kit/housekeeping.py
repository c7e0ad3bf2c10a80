"""Embedded chDB's housekeeping yields the CPU to the worker it lives in.

A ClickHouse server merges a table's parts in the background; embedded, chDB does the
same on threads of the worker's own process. A merge that starts while a step's
messages arrive competes for the worker's core with the step's analysis and insert:
in the 10,240-GPU benchmark one merge took 0.2-0.5 s of CPU at once, and the steps it
overlapped were announced that much later (benchmarks/README.md, "Merges at nice 19,
jobstate read ahead"). ClickHouse servers offer the same remedy as a setting
(``os_threads_nice_value_merge_mutate``); embedded, there is no server configuration,
so the store gives chDB's background threads a nice value itself. The insert's own
threads (``ThreadPool``, ``Query*``) are left as they are: a step waits for them. Linux
threads inherit their creator's nice value, so the shared pool threads that a merge
starts run at this priority too, also when they later serve an insert (seen in
``tests/integration/test_store_chdb.py``); an insert then competes with merges as an
equal, as every thread did before, and never below the worker's Python thread.

Merges still run whenever the core has nothing else to do (a worker that keeps up is
idle most of each step); on a core busy throughout, nice 19 still gets a thread a small
share (a scheduler weight of 15 against 1,024). Should parts pile up regardless,
ClickHouse's own limit (``parts_to_delay_insert``) delays inserts, slowing the worker
rather than failing it. The cost measured: drains that kept the worker busy held 50-60
MiB more at peak.

Linux only (``/proc/self/task`` and per-thread ``setpriority``); elsewhere a no-op.
Raising a thread's nice value needs no privilege.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("rankwatch.store")

DEFAULT_NICE = 19
"""The lowest priority: merges take what the worker leaves."""

BACKGROUND_THREADS = frozenset(
    {
        "MergeMutate",  # merges and mutations
        "Move",  # moving parts between disks
        "Fetch",  # fetching parts from replicas
        "Common",  # cleanup of old parts and temporary directories
        "BgSchPool",  # the schedule pool that picks merges
        "BgStrmSchPool",
        "BgBufSchPool",
        "BgDistSchPool",
        "BgMBSchPool",
        "PoolDelayExec",  # the schedule pools' delayed tasks
        "jemalloc_bg_thd",  # the allocator's purging
    }
)
"""Thread names (as chDB sets them, at most 15 characters) of work no query waits for.
Not ``MemoryWorker``: chDB runs one at nice -20 itself (memory accounting that must
keep up)."""

TASKS = Path("/proc/self/task")


class Housekeeping:
    """Lowers the priority of chDB's background threads: those started since the last
    call, at most once per ``every_s`` (threads start lazily, with the first merge)."""

    def __init__(
        self, nice: int, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.nice = nice
        self.every_s = every_s
        self.clock = clock
        self.threads_lowered = 0
        self._seen: set[int] = set()
        self._next = 0.0

    def __call__(self) -> None:
        if self.nice <= 0 or self.clock() < self._next:
            return
        self._next = self.clock() + self.every_s
        try:
            current = {int(name) for name in os.listdir(TASKS)}
        except OSError:  # not Linux: nothing to do, ever
            self.nice = 0
            return
        for tid in current - self._seen:
            self._lower(tid)
        self._seen = current  # pooled threads come and go: remember only the living

    def _lower(self, tid: int) -> None:
        try:
            name = (TASKS / str(tid) / "comm").read_text().strip()
            if name in BACKGROUND_THREADS and os.getpriority(os.PRIO_PROCESS, tid) < self.nice:
                os.setpriority(os.PRIO_PROCESS, tid, self.nice)
                self.threads_lowered += 1
        except OSError as exc:  # the thread ended meanwhile, or the call is refused
            log.debug("thread %d keeps its priority: %s", tid, exc)
