"""What every in-process benchmark reports for one case: wall-clock median and spread,
median CPU time, and the tracemalloc peak of one more run (numpy reports its arrays)."""

from __future__ import annotations

import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path


def measure(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median, min and max over ``repeat`` runs after one warm-up (first-touch page
    faults, lazy imports), in ms, and the peak allocated by one more run, in MiB."""
    fn()
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "max_ms": 1e3 * max(times),
        "cpu_median_ms": 1e3 * statistics.median(cpu),
        "peak_mib": peak / 2**20,
        "runs": repeat,
    }


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all its threads) process ``pid`` used so far: the
    benchmarks that time a worker or relay subprocess read it before and after."""
    return _cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat: str) -> int:
    """User + system clock ticks in a ``/proc/.../stat`` line (after the command name,
    which may hold spaces and parentheses)."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class ThreadCpu:
    """CPU seconds of the threads of process ``pid`` that carry its own name (the
    interpreter's; embedded chDB names its threads ``ThreadPool``, ``MergeMutate``...),
    from construction on. ``/proc/<pid>/stat`` keeps an ended thread's CPU but a
    thread's own entry goes with it, so call :meth:`sample` often (a drain's wait loop):
    a thread that ends is counted to its last sample. What this cannot split: work the
    store does on the calling Python thread counts as the interpreter's, and so would a
    native thread that never names itself."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.name = Path(f"/proc/{pid}/comm").read_text()
        self.last: dict[int, int] = {}
        self.sample()
        self.first = dict(self.last)

    def sample(self) -> None:
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                if (task / "comm").read_text() != self.name:
                    continue
                self.last[int(task.name)] = _cpu_ticks((task / "stat").read_text())
            except OSError:  # the thread ended meanwhile
                continue

    def seconds(self) -> float:
        """Since construction, up to the last sample."""
        ticks = sum(v - self.first.get(tid, 0) for tid, v in self.last.items())
        return ticks / os.sysconf("SC_CLK_TCK")
