"""Step assembly: turn per-rank op batches into complete (job, step) traces.

Pure core (numpy, no clock, no I/O): the caller passes ``now_ns`` so that the
grace period is testable without sleeping, and the same object runs inside the
faust agent and in the embedded pipeline.

A *worker* is one (dp_rank, stage) pair; tensor/context-parallel peers move in
lockstep, so only the tp_rank 0 / cp_rank 0 rank of each worker feeds the
analysis (the others are counted and ignored). A worker has finished a step when
the batch carrying the step's end arrived (``steps_done`` in the batch, or an
``optimizer`` op for batches that do not declare it) and, when it declared how
many ops the step has, that many records arrived. A step is *complete* when every
expected worker finished it, *partial* when its grace ran out first: its job went on
sending for ``grace_s`` without completing it, or sent nothing at all for
``quiet_grace_s``. The grace runs on the job's own messages, not on the clock, because a
worker cannot tell a rank that is gone from records held up where it cannot see them
(in a spool while the broker is away): it waits while the whole job is silent, and
restarts the grace of every open step after a time it could not read at all
(:meth:`StepAssembler.restart_grace`).

Idempotence: a batch seen before (same ``OpBatch.delivery_key``: rank, batch_seq and
first step) is a duplicate and is skipped whole; records repeated across batches
collapse on (rank, optype, seq_id) when the step is closed. Batches for a step that
was already closed are *late*: counted, and dropped or (``AssemblyConfig.late =
"reanalyse"``) filed into one of the job's recently closed *partial* steps, whose
records are kept for this: when a late batch completes such a step, it closes again,
complete, and is analysed (its row replaces the partial one). A closed step's records
come out in one canonical order (by rank, op type, seq_id) whatever order they arrived
in, so a step rebuilt from the stored ops after a restart is the same array, bit for
bit, as the live one.

Restarts: :meth:`StepAssembler.restore_closed` marks steps already stored as closed,
so that re-delivered batches of those steps count as late instead of producing a
second, partial row.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from rankwatch.schemas.codec import OpBatch
from rankwatch.schemas.optypes import CODE
from rankwatch.sim.trace import Trace

_OPTIMIZER = CODE["optimizer"]
LATE_POLICIES = ("drop", "reanalyse")
_COLUMNS = ("step", "optype", "seq_id", "mb_id", "chunk", "gmc", "start_ns", "duration_ns")

Worker = tuple[int, int]
"""(dp_rank, stage)"""


@dataclass(frozen=True)
class AssemblyConfig:
    grace_s: float = 30.0
    """How long a job may go on sending after a step's first batch without completing
    it: then the step is closed as partial (its missing workers are missing, not slow).
    Counted on the job's messages, not the wall clock: a job none of whose ranks sends
    anything (its records held in spools by a broker outage, its ranks gone) does not
    run its steps' grace out; ``quiet_grace_s`` closes those."""
    quiet_grace_s: float = 600.0
    """How long the open steps of a job none of whose ranks sends anything wait before
    they are closed as partial: longer than a broker outage's spools take to come
    (a job that ended during one is sent by its host's agent or relay within seconds of
    the broker's return), short enough that a job that died mid-step has its last step
    stored within minutes."""
    max_open_steps: int = 1024
    """Per job; beyond it, or beyond ``max_open_records``, the oldest open step is closed
    as partial (bounded memory). Open steps pile up when ranks arrive far apart, as
    after a broker outage, when one rank's spool drains ahead of the others': 64, the
    bound before, closed 72 steps of a 20-s outage's 0.22-s steps as partial while their
    other ranks' records were on their way."""
    max_open_records: int = 2_000_000
    """Per job, records its open steps may hold at most (about 100 MB: the columns are
    views of their messages' bytes): the bound that matters for large jobs, whose steps
    hold 10^5 records each."""
    closed_memory: int = 4096
    """How many closed step ids per job are remembered to recognise late batches."""
    late: str = "drop"
    """A batch of a closed step: ``drop`` it (counted), or ``reanalyse``: file it into
    the step if it closed partial not long ago, and close the step again, complete,
    once every worker is in. Only in memory: a restart forgets the kept steps."""
    reopen_memory: int = 8
    """Per job, the latest partial steps kept for late batches (``late = "reanalyse"``)."""
    step_window: int = 4096
    """A batch naming a step farther than this from its job's newest accepted step is a
    dead letter (:mod:`~rankwatch.streams.ops.identity`). At most ``closed_memory``: a step
    inside the window behind is then always remembered as stored if it was."""

    def __post_init__(self) -> None:
        if not 1 <= self.step_window <= self.closed_memory:
            raise ValueError(
                f"step_window must be 1..closed_memory ({self.closed_memory}),"
                f" got {self.step_window}"
            )
        if self.late not in LATE_POLICIES:
            raise ValueError(f"late must be one of {', '.join(LATE_POLICIES)}, got {self.late!r}")
        if self.reopen_memory < 0:
            raise ValueError(f"reopen_memory must be >= 0, got {self.reopen_memory}")


@dataclass
class AssemblyCounters:
    batches_in: int = 0
    records_in: int = 0
    duplicate_batches: int = 0
    duplicate_records: int = 0
    late_batches: int = 0
    late_records: int = 0
    peer_records: int = 0
    """Records of tp/cp peers (not tp0/cp0), not needed for the analysis."""
    steps_complete: int = 0
    steps_partial: int = 0
    late_kept_batches: int = 0
    """Late batches filed into a kept partial step (``late = "reanalyse"``)."""
    steps_reanalysed: int = 0
    """Partial steps that late batches completed, closed again."""


@dataclass(frozen=True)
class AssembledStep:
    job: str
    step: int
    start_ns: int
    """Earliest op start of the step: the origin of ``trace.start_ts``."""
    trace: Trace
    partial: bool
    missing_workers: tuple[Worker, ...]
    layout: tuple[int, int]
    """(dp_size, pp_size) the step was expected to have."""

    @property
    def n_ops(self) -> int:
        return len(self.trace)

    @property
    def t_base(self) -> float:
        """Recorded step time: last optimizer end (any op's end if none) after step start."""
        trace = self.trace
        ends = trace.start_ts + trace.duration
        opt = trace.optype == _OPTIMIZER
        return float(ends[opt].max() if opt.any() else ends.max())


@dataclass(frozen=True)
class _Chunk:
    """One batch's records of one step: its op columns and who sent them (expanded to
    columns only when the step closes: three ``np.full`` per batch cost more than the
    rest of filing it)."""

    columns: dict[str, np.ndarray]
    worker: Worker
    rank: int


@dataclass
class _OpenStep:
    first_seen_ns: int
    chunks: list[_Chunk] = field(default_factory=list)
    received: dict[Worker, int] = field(default_factory=dict)
    declared: dict[Worker, int] = field(default_factory=dict)
    ended: set[Worker] = field(default_factory=set)

    def done_workers(self) -> set[Worker]:
        return {w for w in self.ended if self.received.get(w, 0) >= self.declared.get(w, 0)}

    def complete(self, expected: frozenset[Worker]) -> bool:
        # cheap test first: this runs once per batch, the set comprehension per worker
        return len(self.ended) >= len(expected) and expected <= self.done_workers()


@dataclass
class _Job:
    layout: tuple[int, int]
    open: OrderedDict[int, _OpenStep] = field(default_factory=OrderedDict)
    closed: OrderedDict[int, None] = field(default_factory=OrderedDict)
    kept: OrderedDict[int, _OpenStep] = field(default_factory=OrderedDict)
    """Partial steps whose records wait for late batches (``late = "reanalyse"``)."""
    seen_batches: OrderedDict[tuple[int, int, int], None] = field(default_factory=OrderedDict)
    heard_ns: int = 0
    """When the job's latest batch came (any rank, any step): its steps' grace runs on it."""
    open_records: int = 0
    """Records its open steps hold (``max_open_records``)."""
    expected: frozenset[Worker] = field(init=False)

    def __post_init__(self) -> None:
        dp, pp = self.layout
        self.expected = frozenset((d, p) for d in range(dp) for p in range(pp))


@dataclass(frozen=True)
class Added:
    """What one batch did: the steps it closed, and the still open steps it fed (whose
    rows do not exist yet, so the batch is not fully stored until they close)."""

    closed: list[AssembledStep]
    pending: tuple[int, ...]
    fresh: bool
    """False for a duplicate batch: nothing of it was kept."""
    late: frozenset[int] = frozenset()
    """Steps of the batch that were closed (and stored) already: their records are not
    stored again."""


class StepAssembler:
    """Collects op batches of many jobs and hands out closed steps."""

    def __init__(self, config: AssemblyConfig | None = None) -> None:
        self.config = config or AssemblyConfig()
        self.counters = AssemblyCounters()
        self._jobs: dict[str, _Job] = {}

    def add(self, batch: OpBatch, now_ns: int) -> list[AssembledStep]:
        """Take one batch; return the steps it completed (usually none or one)."""
        return self.add_batch(batch, now_ns).closed

    def add_batch(self, batch: OpBatch, now_ns: int) -> Added:
        """Take one batch; say what it closed and which open steps it now waits on."""
        self.counters.batches_in += 1
        self.counters.records_in += len(batch)
        job = self._job(batch)
        job.heard_ns = max(job.heard_ns, now_ns)
        if self._is_duplicate(job, batch):
            self.counters.duplicate_batches += 1
            self.counters.duplicate_records += len(batch)
            return Added([], (), fresh=False)
        late = self._late_steps(job, batch)
        if batch.tp_rank != 0 or batch.cp_rank != 0:
            self.counters.peer_records += len(batch)
            return Added([], (), fresh=True, late=late)
        worker = (batch.dp_rank, batch.pp_rank)
        touched = self._file_records(job, batch, worker, now_ns)
        self._file_step_ends(job, batch, worker, now_ns, touched)
        done = [s for s in sorted(touched) if s in job.open and job.open[s].complete(job.expected)]
        closed = [self._close(batch.job, job, s, partial=False) for s in done]
        closed += self._reclose_completed(batch.job, job, touched)
        closed += self._evict_overflow(batch.job, job)
        pending = tuple(s for s in sorted(touched) if s in job.open)
        return Added(closed, pending, fresh=True, late=late)

    def add_together(self, batches: Sequence[OpBatch], now_ns: int) -> Added | None:
        """Take several batches of one step from distinct workers of a job met before (a
        host's bundle) as :meth:`add_batch` would one after another, its work per batch
        done once; None, having changed nothing, when they are not such batches (the
        caller then adds them one at a time). Per batch, that bookkeeping, not the
        records, was most of the cost of a host's 4 frames of 39 records."""
        together = self._together(batches)
        if together is None:
            return None
        job, step, workers, keys = together
        job.heard_ns = max(job.heard_ns, now_ns)
        self.counters.batches_in += len(batches)
        self.counters.records_in += sum(len(b) for b in batches)
        job.seen_batches.update(dict.fromkeys(keys))
        while len(job.seen_batches) > 16 * self.config.closed_memory:
            job.seen_batches.popitem(last=False)
        open_step = self._open(job, step, now_ns)
        for batch, worker in zip(batches, workers, strict=True):
            columns = {c: getattr(batch, c) for c in _COLUMNS}
            open_step.chunks.append(_Chunk(columns, worker, batch.rank))
            open_step.received[worker] = len(batch)
            job.open_records += len(batch)
            if batch.steps_done:
                open_step.ended.add(worker)
                open_step.declared[worker] = batch.steps_done[0][1]
            elif bool((batch.optype == _OPTIMIZER).any()):
                open_step.ended.add(worker)
        if open_step.complete(job.expected):
            return Added([self._close(batches[0].job, job, step, partial=False)], (), fresh=True)
        return Added([], (step,), fresh=True)

    def _together(self, batches: Sequence[OpBatch]) -> _Together | None:
        """What :meth:`add_together` needs, when ``batches`` may be taken as one: all of
        one open or openable step of a job met before, ending no other step, none a
        duplicate or a peer rank's, from distinct workers the job expects that sent
        nothing of the step yet. No batch of them can then close the step before the
        last is filed, one at a time or together."""
        name, step = batches[0].job, batches[0].step_span[0]
        job = self._jobs.get(name)
        if job is None or step in job.closed:
            return None
        workers, keys = [], []
        for batch in batches:
            if not _alone_in(batch, name, step):
                return None
            workers.append((batch.dp_rank, batch.pp_rank))
            keys.append(batch.delivery_key)
        fresh = job.seen_batches.keys().isdisjoint(keys) and len(set(keys)) == len(keys)
        distinct = len(set(workers)) == len(workers) and job.expected.issuperset(workers)
        if not (fresh and distinct):
            return None
        open_step = job.open.get(step)
        if open_step is None:
            records = job.open_records + sum(len(b) for b in batches)
            room = (  # opening it evicts none
                len(job.open) < self.config.max_open_steps
                and records <= self.config.max_open_records
            )
            return (job, step, workers, keys) if room else None
        if any(w in open_step.received or w in open_step.ended for w in workers):
            return None
        return job, step, workers, keys

    def knows(self, job: str) -> bool:
        return job in self._jobs

    def restore_closed(self, job: str, layout: tuple[int, int], steps: list[int]) -> None:
        """Mark ``steps`` of ``job`` as closed (stored before a restart)."""
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _Job(layout=layout)
        for step in sorted(steps):
            dropped = state.open.pop(step, None)
            if dropped is not None:
                state.open_records -= sum(dropped.received.values())
            state.closed[step] = None
        while len(state.closed) > self.config.closed_memory:
            state.closed.popitem(last=False)

    def forget(self, job: str) -> None:
        """Drop everything about ``job`` (its partition went to another worker)."""
        self._jobs.pop(job, None)

    def closed_steps(self, job: str) -> list[int]:
        """The closed step ids remembered for ``job`` (at most ``closed_memory``), in the
        order they closed: what :meth:`restore_closed` takes back."""
        state = self._jobs.get(job)
        return list(state.closed) if state is not None else []

    def expire(self, now_ns: int) -> list[AssembledStep]:
        """Close, as partial, every step whose grace has run out: its job went on sending
        for ``grace_s`` after the step's first batch without completing it, or has sent
        nothing for ``quiet_grace_s``."""
        grace_ns = int(self.config.grace_s * 1e9)
        quiet = now_ns - int(max(self.config.quiet_grace_s, self.config.grace_s) * 1e9)
        out = []
        for name, job in self._jobs.items():
            stale = [
                s
                for s, o in job.open.items()
                if job.heard_ns - o.first_seen_ns >= grace_ns
                or max(job.heard_ns, o.first_seen_ns) <= quiet
            ]
            out += [self._close(name, job, s, partial=True) for s in stale]
        return out

    def restart_grace(self, now_ns: int) -> int:
        """Start every open step's grace period again at ``now_ns``; returns how many.

        For a worker that could not read its input for a while (its broker unreachable,
        the process paused or starved): the records its open steps wait for may be
        waiting in the broker, or in a producer's spool for the broker to come back, and
        that time must not count against them. Closed as partial when the worker reads
        again, before those records come, they would be late, and dropped (10,754 records
        and 288 partial steps after a 56-s broker outage, on main)."""
        n = 0
        for job in self._jobs.values():
            for open_step in job.open.values():
                if open_step.first_seen_ns < now_ns:
                    open_step.first_seen_ns = now_ns
                    n += 1
        return n

    def flush(self) -> list[AssembledStep]:
        """Close every open step now (end of a replay, shutdown)."""
        out = []
        for name, job in self._jobs.items():
            out += [self._close(name, job, s, partial=True) for s in list(job.open)]
        return out

    def has_open(self, job: str) -> bool:
        """Whether ``job`` has a step open."""
        state = self._jobs.get(job)
        return state is not None and bool(state.open)

    def open_steps(self) -> Iterator[tuple[str, int]]:
        for name, job in self._jobs.items():
            for step in job.open:
                yield name, step

    # -- internals ---------------------------------------------------------------

    def _job(self, batch: OpBatch) -> _Job:
        job = self._jobs.get(batch.job)
        if job is None:
            job = self._jobs[batch.job] = _Job(layout=(batch.dp_size, batch.pp_size))
        return job

    @staticmethod
    def _late_steps(job: _Job, batch: OpBatch) -> frozenset[int]:
        """The batch's steps that closed already and wait for no late batch."""
        if not job.closed:
            return frozenset()
        low, high = batch.step_span
        if low == high:  # the usual batch: one step
            return frozenset((low,)) if low in job.closed and low not in job.kept else frozenset()
        steps = set(np.unique(batch.step).tolist())
        return frozenset(s for s in steps if s in job.closed and s not in job.kept)

    def _is_duplicate(self, job: _Job, batch: OpBatch) -> bool:
        key = batch.delivery_key
        if key in job.seen_batches:
            return True
        job.seen_batches[key] = None
        while len(job.seen_batches) > 16 * self.config.closed_memory:
            job.seen_batches.popitem(last=False)
        return False

    def _file_records(self, job: _Job, batch: OpBatch, worker: Worker, now_ns: int) -> set[int]:
        order, uniq, bounds = _group_by_step(batch.step, batch.step_span)
        whole = order is None and uniq.size == 1  # one step: the batch's own columns
        touched: set[int] = set()
        for step, lo, hi in zip(uniq.tolist(), bounds[:-1], bounds[1:], strict=True):
            open_step = self._target(job, step, now_ns)
            if open_step is None:
                self.counters.late_batches += 1
                self.counters.late_records += int(hi - lo)
                continue
            if step in job.kept:
                self.counters.late_kept_batches += 1
            if whole:
                columns = {c: getattr(batch, c) for c in _COLUMNS}
            else:
                rows = order[lo:hi] if order is not None else slice(lo, hi)
                columns = {c: getattr(batch, c)[rows] for c in _COLUMNS}
            open_step.chunks.append(_Chunk(columns, worker, batch.rank))
            open_step.received[worker] = open_step.received.get(worker, 0) + int(hi - lo)
            if step in job.open:
                job.open_records += int(hi - lo)
            if not batch.steps_done and bool((columns["optype"] == _OPTIMIZER).any()):
                open_step.ended.add(worker)
            touched.add(step)
        return touched

    def _file_step_ends(
        self, job: _Job, batch: OpBatch, worker: Worker, now_ns: int, touched: set[int]
    ) -> None:
        for step, n_ops in batch.steps_done:
            open_step = self._target(job, step, now_ns)
            if open_step is None:
                continue
            open_step.ended.add(worker)
            open_step.declared[worker] = n_ops
            touched.add(step)

    def _target(self, job: _Job, step: int, now_ns: int) -> _OpenStep | None:
        """Where records of ``step`` go: its open step, the kept partial step it closed
        as (late, re-analysed), or nowhere (late, dropped)."""
        if step not in job.closed:
            return self._open(job, step, now_ns)
        return job.kept.get(step)

    def _reclose_completed(self, name: str, job: _Job, touched: set[int]) -> list[AssembledStep]:
        out = []
        for step in sorted(s for s in touched if s in job.kept):
            if job.kept[step].complete(job.expected):
                self.counters.steps_reanalysed += 1
                kept = job.kept.pop(step)
                out.append(self._assemble(name, job, step, kept, (), count_duplicates=False))
        return out

    def _open(self, job: _Job, step: int, now_ns: int) -> _OpenStep:
        open_step = job.open.get(step)
        if open_step is None:
            open_step = job.open[step] = _OpenStep(first_seen_ns=now_ns)
        return open_step

    def _evict_overflow(self, name: str, job: _Job) -> list[AssembledStep]:
        out = []
        cfg = self.config
        while len(job.open) > cfg.max_open_steps or (
            job.open_records > cfg.max_open_records and len(job.open) > 1
        ):
            oldest = min(job.open)
            out.append(self._close(name, job, oldest, partial=True))
        return out

    def _close(self, name: str, job: _Job, step: int, partial: bool) -> AssembledStep:
        open_step = job.open.pop(step)
        job.open_records -= sum(open_step.received.values())
        job.closed[step] = None
        while len(job.closed) > self.config.closed_memory:
            job.closed.popitem(last=False)
        missing = tuple(sorted(job.expected - open_step.done_workers())) if partial else ()
        if missing:
            self.counters.steps_partial += 1
            self._keep(job, step, open_step)
        else:
            self.counters.steps_complete += 1
        return self._assemble(name, job, step, open_step, missing)

    def _keep(self, job: _Job, step: int, open_step: _OpenStep) -> None:
        if self.config.late != "reanalyse" or self.config.reopen_memory == 0:
            return
        job.kept[step] = open_step
        while len(job.kept) > self.config.reopen_memory:
            job.kept.popitem(last=False)

    def _assemble(
        self,
        name: str,
        job: _Job,
        step: int,
        open_step: _OpenStep,
        missing: tuple[Worker, ...],
        count_duplicates: bool = True,
    ) -> AssembledStep:
        columns, dups = _merge(_concat(open_step.chunks))
        if count_duplicates:  # a re-closed step's were counted when it first closed
            self.counters.duplicate_records += dups
        return _assembled(name, step, columns, bool(missing), missing, job.layout)


_Together = tuple[_Job, int, list[Worker], list[tuple[int, int, int]]]
"""(job, step, workers, delivery keys) of batches taken as one."""


def _alone_in(batch: OpBatch, job: str, step: int) -> bool:
    """Whether ``batch`` is of ``job``, holds records of ``step`` only, declares no
    other step's end, and is a worker's own (tp and cp rank 0)."""
    return (
        batch.job == job
        and batch.step_span == (step, step)
        and all(done == step for done, _ in batch.steps_done)
        and len(batch.steps_done) <= 1
        and batch.tp_rank == 0
        and batch.cp_rank == 0
    )


def _group_by_step(
    steps: np.ndarray, span: tuple[int, int]
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Row order grouping ``steps`` (lowest and highest: ``span``; None: as they are),
    the distinct steps, and their group bounds. A batch usually holds one step, or
    several in step order (the hooks batch short steps): no sort then, and each step's
    records are a slice (a view)."""
    if span[0] == span[1]:
        return None, steps[:1], np.array([0, steps.size])
    change = np.diff(steps)
    if bool((change >= 0).all()):
        cut = np.flatnonzero(change) + 1
        return None, steps[np.concatenate(([0], cut))], np.concatenate(([0], cut, [steps.size]))
    order = np.argsort(steps, kind="stable")
    ordered = steps[order]
    cut = np.flatnonzero(np.diff(ordered)) + 1
    bounds = np.concatenate(([0], cut, [ordered.size]))
    return order, ordered[bounds[:-1]], bounds


def _concat(chunks: list[_Chunk]) -> dict[str, np.ndarray]:
    """The chunks' records as one set of columns, with ``dp_rank``, ``stage`` and ``rank``."""
    columns = {c: np.concatenate([ch.columns[c] for ch in chunks]) for c in _COLUMNS}
    sizes = [ch.columns["step"].shape[0] for ch in chunks]
    ids_CI = np.array([(*ch.worker, ch.rank) for ch in chunks], dtype=np.int64)
    for i, name in enumerate(("dp_rank", "stage", "rank")):
        columns[name] = np.repeat(ids_CI[:, i], sizes)
    return columns


def _merge(columns: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """Drop repeated (rank, optype, seq_id) records; the rest in canonical order."""
    first = _first_of_each_key(columns["rank"], columns["optype"], columns["seq_id"])
    dups = columns["rank"].size - first.size
    columns = {c: v[first] for c, v in columns.items()}
    return columns, int(dups)


def _first_of_each_key(rank: np.ndarray, optype: np.ndarray, seq_id: np.ndarray) -> np.ndarray:
    """Index of the first record of each distinct (rank, optype, seq_id), in key order.

    The three fit one int64 whenever their bit widths add up to 63 or less (ranks and op
    type codes are small, seq_ids count ops): one 1-D sort, ~10x cheaper than
    ``np.unique(axis=0)`` on the stacked columns, with the same result (a packed key of
    non-negative fields orders as the tuple does, and both sorts are stable).
    """
    if rank.size == 0:
        return np.zeros(0, dtype=np.int64)
    fields = [np.asarray(rank, dtype=np.int64), np.asarray(optype, dtype=np.int64)]
    fields.append(np.asarray(seq_id, dtype=np.int64))
    if min(int(f.min()) for f in fields) >= 0:
        widths = [int(f.max()).bit_length() for f in fields]
        if sum(widths) <= 63:
            key = (fields[0] << (widths[1] + widths[2])) | (fields[1] << widths[2]) | fields[2]
            _, first = np.unique(key, return_index=True)
            return first
    _, first = np.unique(np.stack(fields, axis=1), axis=0, return_index=True)
    return first


def step_from_columns(
    job: str, step: int, columns: dict[str, np.ndarray], layout: tuple[int, int]
) -> AssembledStep:
    """A complete step rebuilt from stored records (columns as in an op batch, plus
    ``dp_rank``, ``stage`` and ``rank``), in the same canonical order as a live one."""
    merged, _ = _merge(columns)
    return _assembled(job, step, merged, False, (), layout)


def _assembled(
    job: str,
    step: int,
    columns: dict[str, np.ndarray],
    partial: bool,
    missing: tuple[Worker, ...],
    layout: tuple[int, int],
) -> AssembledStep:
    start_ns = int(columns["start_ns"].min())
    trace = Trace(
        dp_rank=columns["dp_rank"],
        stage=columns["stage"],
        rank=columns["rank"],
        step=columns["step"].astype(np.int64),
        optype=columns["optype"].astype(np.int8),
        seq_id=columns["seq_id"].astype(np.int64),
        mc=columns["chunk"].astype(np.int64),
        gmc=columns["gmc"].astype(np.int64),
        mb_id=columns["mb_id"].astype(np.int64),
        start_ts=(columns["start_ns"] - start_ns) / 1e9,
        duration=columns["duration_ns"] / 1e9,
    )
    return AssembledStep(job, step, start_ns, trace, partial, missing, layout)
