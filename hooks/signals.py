"""What the slowdown signals need from a rank, gathered cheaply (docs/detection.md, §3).

Two halves, so the training thread does almost nothing:

- :class:`StepNotes` lives on the training thread. Between two step ends it sums what
  the training code or the integrations declare: FLOPs per op type (from shapes),
  message bytes with the group size and algorithm of collectives, samples, GC pauses
  (and the part of them that fell inside a timed op, which is not that op's work),
  data-loader waits and, on a GPU, issue latencies. Each call is a dict update.
- :class:`StepSummaries` lives on the publisher thread. It sees every record of a step
  as the publisher takes it, sums time per op type, and keeps the op intervals, so
  that when the step's notes arrive it can say how much of the step timed ops covered
  (their union) and write the step's ``rank_steps`` item of the ops v2 message.

Nothing here reads torch or a GPU; times are the aligned clock in ns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankwatch.schemas.optypes import COLLECTIVE_ALGORITHMS

ALGORITHMS = COLLECTIVE_ALGORITHMS
"""Collective algorithms the ops v2 schema knows (they set the bus-bandwidth factor)."""
MAX_STEPS_KEPT = 1024


@dataclass
class _Work:
    flops: float = 0.0
    bytes: int = 0
    group: int = 0
    algo: str = ""
    gc_ns: int = 0


@dataclass
class StepNotes:
    """Declared work and pauses of the current step (one training thread writes it)."""

    work: dict[str, _Work] = field(default_factory=dict)
    samples: int = 0
    gc_ns: int = 0
    gc_count: int = 0
    data_wait_ns: int = 0
    issue_ns: list[int] = field(default_factory=list)
    begin_ns: int = 0
    dtype: str = ""

    def _of(self, optype: str) -> _Work:
        w = self.work.get(optype)
        if w is None:
            w = self.work[optype] = _Work()
        return w

    def add_flops(self, optype: str, flops: float) -> None:
        self._of(optype).flops += flops

    def add_bytes(self, optype: str, nbytes: int, group: int, algo: str) -> None:
        w = self._of(optype)
        w.bytes += nbytes
        w.group, w.algo = group, algo

    def add_gc(self, pause_ns: int, inside: str | None) -> None:
        self.gc_ns += pause_ns
        self.gc_count += 1
        if inside is not None:
            self._of(inside).gc_ns += pause_ns

    def close(self, step: int, end_ns: int, prev_end_ns: int | None) -> dict[str, Any]:
        """The notes of ``step`` as the publisher's input (the ops part is added there)."""
        return {
            "step": step,
            "begin_ns": self.begin_ns,
            "end_ns": end_ns,
            "prev_end_ns": prev_end_ns,
            "samples": self.samples,
            "gc_ns": self.gc_ns,
            "gc_count": self.gc_count,
            "data_wait_ns": self.data_wait_ns,
            "dtype": self.dtype,
            "issue": _issue(self.issue_ns),
            "work": self.work,
        }


def _issue(latencies: list[int]) -> dict[str, int] | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    n = len(ordered)
    return {
        "n": n,
        "p50_ns": ordered[(n - 1) // 2],
        "p99_ns": ordered[min(n - 1, (99 * n) // 100)],
        "max_ns": ordered[-1],
    }


def covered_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``(start, duration)`` intervals clipped to ``[lo, hi]``."""
    total, reach = 0, lo
    for start, duration in sorted(intervals):
        a, b = max(start, reach), min(start + duration, hi)
        if b > a:
            total += b - a
            reach = b
    return total


@dataclass
class StepSummaries:
    """Per-step sums of the records the publisher took (publisher thread only)."""

    times: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    """step -> optype -> [n, total duration ns]."""
    intervals: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add_records(self, records: list[tuple]) -> None:
        for r in records:
            step, optype, start, duration = r[0], r[1], r[6], r[7]
            per = self.times.get(step)
            if per is None:
                per = self.times[step] = {}
                self.intervals[step] = []
            acc = per.get(optype)
            if acc is None:
                per[optype] = [1, duration]
            else:
                acc[0] += 1
                acc[1] += duration
            self.intervals[step].append((start, duration))
        self._bound()

    def add_notes(self, notes: list[dict[str, Any]]) -> None:
        for n in notes:
            self.notes[n["step"]] = n
        self._bound()

    def pop(self, step: int) -> dict[str, Any] | None:
        """The ``rank_steps`` item of an ended step (None when its notes never came)."""
        notes = self.notes.pop(step, None)
        times = self.times.pop(step, {})
        intervals = self.intervals.pop(step, [])
        if notes is None:
            return None
        begin, end = notes["begin_ns"], notes["end_ns"]
        item = {k: v for k, v in notes.items() if k not in ("work", "dtype")}
        if notes["dtype"]:
            item["dtype"] = notes["dtype"]
        item["covered_ns"] = covered_ns(intervals, begin, end)
        item["ops"] = _ops(times, notes["work"])
        return item

    def _bound(self) -> None:
        for book in (self.times, self.intervals, self.notes):
            if len(book) > MAX_STEPS_KEPT:  # ends lost: forget the oldest steps
                for old in sorted(book)[: len(book) - MAX_STEPS_KEPT]:
                    del book[old]


def _ops(times: dict[str, list[int]], work: dict[str, _Work]) -> list[dict[str, Any]]:
    out = []
    for optype, (n, total) in sorted(times.items()):
        entry: dict[str, Any] = {"optype": optype, "n": n, "time_ns": total}
        w = work.get(optype)
        if w is not None:
            if w.gc_ns:
                entry["gc_ns"] = min(w.gc_ns, total)
            if w.flops:
                entry["flops"] = w.flops
            if w.bytes and w.algo in ALGORITHMS and w.group >= 1:
                entry.update(bytes=w.bytes, group=w.group, algo=w.algo)
        out.append(entry)
    return out
