"""What the ``jobs`` table says about each job: its sizes, hosts and time span.

The op batches carry everything needed: DP and PP sizes in the header, TP/CP and
model-chunk counts as the largest rank or chunk seen, the host of each rank. The
GPU-hour panels multiply step time by ``world_size``, so the worker that analyses a
job also keeps its row current. Pure: no I/O, no clock.

Times are the ops' own (earliest start, latest end), not the worker's clock, so a
re-processed batch yields the same row, and the row with the latest ``last_seen``
(``version``) is the one ReplacingMergeTree keeps. Rows are asked for when a step
closes (every rank of it has been seen by then, so the first row already has the
whole job): one is due when something other than ``last_seen`` changed (a new job,
host or size), and otherwise at most every ``refresh_ns`` of op time, so a long job
costs one row a minute, not one per step.
A worker that meets a job again after a restart gets its stored ``first_seen`` and
hosts back through :meth:`JobBook.restore`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from rankwatch.schemas.opbatch import OpBatch

REFRESH_NS = 60 * 10**9
"""At most one row per job per minute of op time when only ``last_seen`` moved."""


@dataclass(frozen=True)
class JobFacts:
    job: str
    dp_size: int
    pp_size: int
    tp_size: int
    cp_size: int
    vpp_size: int
    max_rank: int
    hosts: frozenset[str]
    first_seen_ns: int
    last_seen_ns: int

    @property
    def world_size(self) -> int:
        """Every rank of the job: the product of the sizes, or more ranks if seen."""
        product = self.dp_size * self.pp_size * self.tp_size * self.cp_size
        return max(product, self.max_rank + 1)

    def shape(self) -> tuple[object, ...]:
        """Everything but the time span: a change here is worth a row at once."""
        return (
            self.dp_size, self.pp_size, self.tp_size, self.cp_size, self.vpp_size,
            self.world_size, self.hosts,
        )  # fmt: skip

    def row(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "dp_size": self.dp_size,
            "pp_size": self.pp_size,
            "tp_size": self.tp_size,
            "cp_size": self.cp_size,
            "vpp_size": self.vpp_size,
            "world_size": self.world_size,
            "schedule": "",  # not in the op batches: 1F1B and GPipe look alike there
            "hosts": sorted(self.hosts),
            "first_seen": _utc(self.first_seen_ns),
            "last_seen": _utc(self.last_seen_ns),
            "version": self.last_seen_ns,
        }


def facts_of(batch: OpBatch) -> JobFacts | None:
    """One batch's view of its job (None for a batch without ops)."""
    if len(batch) == 0:
        return None
    return JobFacts(
        job=batch.job,
        dp_size=batch.dp_size,
        pp_size=batch.pp_size,
        tp_size=batch.tp_rank + 1,
        cp_size=batch.cp_rank + 1,
        vpp_size=max(int(batch.chunk.max()) + 1, 1),
        max_rank=batch.rank,
        hosts=frozenset((batch.host,)),
        first_seen_ns=int(batch.start_ns.min()),
        last_seen_ns=int((batch.start_ns + batch.duration_ns).max()),
    )


def merge(a: JobFacts, b: JobFacts) -> JobFacts:
    """What two views of the same job say together."""
    return replace(
        a,
        dp_size=max(a.dp_size, b.dp_size),
        pp_size=max(a.pp_size, b.pp_size),
        tp_size=max(a.tp_size, b.tp_size),
        cp_size=max(a.cp_size, b.cp_size),
        vpp_size=max(a.vpp_size, b.vpp_size),
        max_rank=max(a.max_rank, b.max_rank),
        hosts=a.hosts if b.hosts <= a.hosts else a.hosts | b.hosts,
        first_seen_ns=min(a.first_seen_ns, b.first_seen_ns),
        last_seen_ns=max(a.last_seen_ns, b.last_seen_ns),
    )


@dataclass
class JobBook:
    """Per job: what is known, and what the last row written said."""

    refresh_ns: int = REFRESH_NS
    _facts: dict[str, JobFacts] = field(default_factory=dict)
    _written: dict[str, JobFacts] = field(default_factory=dict)
    _restored: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)

    def observe(self, batch: OpBatch) -> None:
        """Take in an accepted batch."""
        seen = facts_of(batch)
        if seen is None:
            return
        known = self._facts.get(batch.job)
        self._facts[batch.job] = merge(known, seen) if known is not None else self._first(seen)

    def due(self, job: str) -> dict[str, Any] | None:
        """The job's row if one is due (call when one of its steps closes)."""
        facts = self._facts.get(job)
        if facts is None:
            return None
        last = self._written.get(job)
        if last is not None and not self._worth_a_row(last, facts):
            return None
        self._written[job] = facts
        return facts.row()

    def unwritten(self) -> list[dict[str, Any]]:
        """Rows of every job that moved since its last row (at shutdown or end of replay)."""
        stale = [f for job, f in self._facts.items() if self._written.get(job) != f]
        self._written.update((f.job, f) for f in stale)
        return [f.row() for f in stale]

    def restore(self, job: str, first_seen_ns: int, hosts: frozenset[str]) -> None:
        """What the store holds for a job this process has not seen yet."""
        self._restored[job] = (first_seen_ns, hosts)

    def forget(self, job: str) -> None:
        for book in (self._facts, self._written, self._restored):
            book.pop(job, None)

    def _first(self, seen: JobFacts) -> JobFacts:
        stored = self._restored.pop(seen.job, None)
        if stored is None:
            return seen
        first_seen_ns, hosts = stored
        return replace(
            seen, first_seen_ns=min(first_seen_ns, seen.first_seen_ns), hosts=seen.hosts | hosts
        )

    def _worth_a_row(self, last: JobFacts, now: JobFacts) -> bool:
        moved = now.last_seen_ns - last.last_seen_ns >= self.refresh_ns
        return moved or last.shape() != now.shape()


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)
