"""What the ``jobs`` table says about each job: its sizes, hosts and time span.

The op batches carry everything needed: DP and PP sizes in the header (fixed by the
job's first batch: :mod:`~rankwatch.streams.ops.identity` refuses a batch that disagrees),
TP/CP and model-chunk counts as the largest rank or chunk seen, the host of each rank. The
GPU-hour panels multiply step time by ``world_size``, so the worker that analyses a
job also keeps its row current. Pure: no I/O, no clock.

Times are the ops' own (earliest start and latest end over the closed steps), not the
worker's clock, so re-processed batches yield the same row, and the row with the
latest ``last_seen`` (``version``) is the one ReplacingMergeTree keeps. Rows are asked
for when a step closes (every rank of a complete step has been seen by then, so the
first row already has the whole job): one is due when something other than
``last_seen`` changed (a new job, host or size), and otherwise at most every
``refresh_ns`` of op time, so a long job costs one row a minute, not one per step.
A worker that meets a job again after a restart gets its stored ``first_seen`` and
hosts back through :meth:`JobBook.restore`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.tables import table_row
from rankwatch.streams.kit.times import utc
from rankwatch.streams.ops.assembly import AssembledStep

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
    hosts: frozenset[str]
    first_seen_ns: int
    last_seen_ns: int

    @property
    def world_size(self) -> int:
        """Every rank of the job, from its coordinates: DP x PP x TP x CP. Not the
        highest rank + 1: rank numbers need not be dense (a trace of only the even
        ranks, a job that numbers ranks by host slot)."""
        return self.dp_size * self.pp_size * self.tp_size * self.cp_size

    def shape(self) -> tuple[object, ...]:
        """Everything but the time span: a change here is worth a row at once."""
        return (
            self.dp_size, self.pp_size, self.tp_size, self.cp_size, self.vpp_size,
            self.world_size, self.hosts,
        )  # fmt: skip

    def row(self) -> dict[str, Any]:
        return table_row(
            "jobs",
            job=self.job,
            dp_size=self.dp_size,
            pp_size=self.pp_size,
            tp_size=self.tp_size,
            cp_size=self.cp_size,
            vpp_size=self.vpp_size,
            world_size=self.world_size,
            schedule="",  # not in the op batches: 1F1B and GPipe look alike there
            hosts=sorted(self.hosts),
            first_seen=utc(self.first_seen_ns),
            last_seen=utc(self.last_seen_ns),
            version=self.last_seen_ns,
        )


@dataclass(slots=True)
class _Seen:
    """What a job's batches said so far; updated in place (it runs for every batch)."""

    dp_size: int = 0
    pp_size: int = 0
    tp_size: int = 0
    cp_size: int = 0
    vpp_size: int = 1
    hosts: set[str] = field(default_factory=set)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    """rank -> the host its latest batch named (a straggler alert names the blamed
    ranks' hosts)."""
    first_seen_ns: int | None = None
    last_seen_ns: int | None = None

    def take(self, batch: OpBatch) -> None:
        """Header fields only: this runs for every batch (the columns are read per step)."""
        self.dp_size = max(self.dp_size, batch.dp_size)
        self.pp_size = max(self.pp_size, batch.pp_size)
        self.tp_size = max(self.tp_size, batch.tp_rank + 1)
        self.cp_size = max(self.cp_size, batch.cp_rank + 1)
        if batch.host not in self.hosts:
            self.hosts.add(batch.host)
        self.rank_hosts[batch.rank] = batch.host

    def take_step(self, step: AssembledStep) -> None:
        trace = step.trace
        if len(trace) == 0:
            return
        self.vpp_size = max(self.vpp_size, int(trace.mc.max()) + 1)
        end_s = float((trace.start_ts + trace.duration).max())
        first, last = step.start_ns, step.start_ns + round(end_s * 1e9)
        self.first_seen_ns = first if self.first_seen_ns is None else min(self.first_seen_ns, first)
        self.last_seen_ns = last if self.last_seen_ns is None else max(self.last_seen_ns, last)

    def facts(self, job: str) -> JobFacts:
        assert self.first_seen_ns is not None and self.last_seen_ns is not None
        return JobFacts(
            job, self.dp_size, self.pp_size, self.tp_size, self.cp_size, self.vpp_size,
            frozenset(self.hosts), self.first_seen_ns, self.last_seen_ns,
        )  # fmt: skip


@dataclass
class JobBook:
    """Per job: what is known, and what the last row written said."""

    refresh_ns: int = REFRESH_NS
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _written: dict[str, JobFacts] = field(default_factory=dict)

    def observe(self, batch: OpBatch) -> None:
        """Take in an accepted batch."""
        seen = self._seen.get(batch.job)
        if seen is None:
            seen = self._seen[batch.job] = _Seen()
        seen.take(batch)

    def due(self, step: AssembledStep) -> dict[str, Any] | None:
        """Take in a closed step; its job's row if one is due."""
        job = step.job
        seen = self._seen.get(job)
        if seen is None:
            return None
        seen.take_step(step)
        if seen.first_seen_ns is None:
            return None
        facts = seen.facts(job)
        last = self._written.get(job)
        if last is not None and not self._worth_a_row(last, facts):
            return None
        self._written[job] = facts
        return facts.row()

    def unwritten(self) -> list[dict[str, Any]]:
        """Rows of every job that moved since its last row (at shutdown or end of replay)."""
        rows = (self.unwritten_row(job) for job in self._seen)
        return [row for row in rows if row is not None]

    def unwritten_row(self, job: str) -> dict[str, Any] | None:
        """``job``'s row if it moved since its last one (None: it did not, or unknown)."""
        seen = self._seen.get(job)
        if seen is None or seen.first_seen_ns is None:
            return None
        facts = seen.facts(job)
        if self._written.get(job) == facts:
            return None
        self._written[job] = facts
        return facts.row()

    def restore(self, job: str, first_seen_ns: int, hosts: frozenset[str]) -> None:
        """What the store holds for a job this process has not seen yet."""
        if job not in self._seen:
            self._seen[job] = _Seen(hosts=set(hosts), first_seen_ns=first_seen_ns)

    def first_seen(self, job: str) -> tuple[int | None, frozenset[str]]:
        """(first_seen_ns, hosts) known of ``job``: what :meth:`restore` takes back."""
        seen = self._seen.get(job)
        if seen is None:
            return None, frozenset()
        return seen.first_seen_ns, frozenset(seen.hosts)

    def hosts_of(self, job: str, ranks: list[int]) -> list[str]:
        """The hosts ``ranks`` of ``job`` run on, as their batches named them (sorted)."""
        seen = self._seen.get(job)
        known = seen.rank_hosts if seen is not None else {}
        return sorted({known[r] for r in ranks if r in known})

    def forget(self, job: str) -> None:
        self._seen.pop(job, None)
        self._written.pop(job, None)

    def _worth_a_row(self, last: JobFacts, now: JobFacts) -> bool:
        moved = now.last_seen_ns - last.last_seen_ns >= self.refresh_ns
        return moved or last.shape() != now.shape()
