"""The ops pipeline: bytes from the wire in, table rows out.

decode -> assemble -> (analyse) -> rows. No I/O and no clock: the faust agent and
the embedded runner call it with the message bytes, where they came from, and the
current time, then store what it returns. A message that fails to decode becomes a
dead-letter row with the reason; nothing raises out of :meth:`Pipeline.on_message`
for bad input.

Every call says which open steps the message still feeds (``Output.pending``): a
consumer must not commit the message's offset before those steps closed and their rows,
and the rows of this call, are stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from rankwatch.schemas.codec import DEFAULT_MAX_BYTES, InvalidMessage, Member, decode_ops_members
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.tables import CONTRACTS, table_row
from rankwatch.sim import waste_of
from rankwatch.sim.ideal import StepSummary
from rankwatch.streams.kit.deadletter import dead_letter, dead_letter_row
from rankwatch.streams.kit.output import Output, Source, alert_row, keyless
from rankwatch.streams.kit.times import utc
from rankwatch.streams.kit.versions import row_version
from rankwatch.streams.ops.alerts import (
    DIMENSIONS,
    Alert,
    JobAlertState,
    StepMark,
    StragglerAlerts,
)
from rankwatch.streams.ops.assembly import AssembledStep, AssemblyConfig, StepAssembler
from rankwatch.streams.ops.blame import ranks_of
from rankwatch.streams.ops.identity import Coordinates, JobIdentities
from rankwatch.streams.ops.jobs import JobBook
from rankwatch.streams.slowdown.detector import SlowdownDetector
from rankwatch.streams.slowdown.signals import RankStep, Signals, step_signals

MAX_OPEN_RANK_STEPS = 100_000
"""Rank summaries held for steps not closed yet; past it the oldest steps' go."""


@dataclass(frozen=True)
class StepAnalysis:
    """What the what-if engine adds to a step row (None when not analysed)."""

    t_sim: float
    t_ideal: float
    slowdown: float
    attributions: tuple[tuple[str, str, float], ...] = ()
    """(dimension, group, S_g) rows: dimension in optype | dp_rank | stage | worker."""


class StepAnalyser(Protocol):
    """The seam for the what-if engine: closed steps in (in the order they closed),
    each one's analysis out, as if they had come one at a time."""

    def analyse_many(self, steps: Sequence[AssembledStep]) -> list[StepAnalysis | None]: ...


@dataclass
class Pipeline:
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    analyser: StepAnalyser | None = None
    alerts: StragglerAlerts | None = None
    max_message_bytes: int = DEFAULT_MAX_BYTES
    """Larger messages are dead letters (reason ``too-large``)."""
    keep_ops: bool = False
    """Also emit the accepted op batches for the raw ``ops`` table (``Output.ops``)."""
    slowdown: SlowdownDetector | None = field(default_factory=SlowdownDetector)
    """Signals the what-if cannot see, from ops v2 ``rank_steps`` (None: off)."""
    rank_steps_late: int = 0
    """Rank summaries that came after their step closed (not judged)."""
    dead_letters: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    steps_analysed: int = 0
    generation: int = 0
    """The consumer group's generation of the assignment this pipeline's jobs came with
    (0: embedded, no group): part of every row's version, so that a later owner's rows
    win over an earlier one's (:mod:`~rankwatch.streams.kit.versions`). The worker sets
    it at each assignment."""
    defer_ops: int = 0
    """Closed steps wait, unanalysed, until their ops reach this many or
    :meth:`take_closed` is called (0: each message's closed steps are analysed at once).
    A worker takes them before each store: the steps of a job closed since the last
    one share one simulation pass (the same numbers; under a backlog numpy's cost per
    call is paid once a store, not once a step). The output of the message that closes
    a step names it (``Output.steps``); its rows come with the take."""

    def __post_init__(self) -> None:
        self.assembler = StepAssembler(self.assembly)
        self.jobs = JobBook()
        self.identity = JobIdentities(step_window=self.assembly.step_window)
        self._stored_batches: dict[str, set[tuple[int, int, int]]] = {}
        self._open_batches: dict[str, dict[int, set[tuple[int, int]]]] = {}
        """job -> open step -> (rank, batch_seq) of the batches stored for it."""
        self._rank_steps: dict[tuple[str, int], list[RankStep]] = {}
        self._closed: list[AssembledStep] = []
        """Closed steps not yet analysed, in the order they closed (:attr:`defer_ops`)."""
        self._closed_ops = 0

    def on_message(self, data: bytes, source: Source, now_ns: int) -> Output:
        """One op-batch message (a batch, or a bundle of them); bad input becomes a
        dead-letter row, never an exception."""
        refused = keyless(source)
        if refused is not None:
            return self._dead_letter(data, source, now_ns, refused.reason, refused.detail)
        try:
            members = decode_ops_members(data, max_bytes=self.max_message_bytes)
        except InvalidMessage as exc:
            return self._dead_letter(data, source, now_ns, exc.reason, exc.detail)
        return self.on_members(members, data, source, now_ns)

    def on_members(
        self, members: Sequence[Member], data: bytes, source: Source, now_ns: int
    ) -> Output:
        """The batches of one message ``data``: a bundle's members, or the message alone
        (``decode_ops_members``). Each member is taken as if it had come alone; those
        refused make one dead letter for the message that names each of them (the
        table keeps one row per message), the others go on. A record of a topic without
        a key is refused whole, whatever it holds (``no-key``)."""
        unkeyed = keyless(source)
        if unkeyed is not None:
            return self._dead_letter(data, source, now_ns, unkeyed.reason, unkeyed.detail)
        if len(members) == 1:
            got = members[0][1]
            if isinstance(got, InvalidMessage):
                return self._dead_letter(data, source, now_ns, got.reason, got.detail)
            return self.on_batch(got, data, source, now_ns)
        together = self._take_together(members, source, now_ns)
        if together is not None:
            return together
        out, refused = Output(), []
        job = _bundle_job(members, source.key)
        for i, (_, decoded) in enumerate(members):
            got = decoded
            if isinstance(decoded, OpBatch):
                got = _other_job(decoded, job, source.key) or decoded
            if isinstance(got, InvalidMessage):
                self._count_refusal(got.reason)
                refused.append((i, got.reason, got.detail, ""))
                continue
            one = self.on_batch(got, data, source, now_ns)
            if one.dead_letters:  # refused (and counted): the output is its letter alone
                letter = one.dead_letters[0]
                refused.append((i, letter.reason, letter.detail, got.job))
                continue
            out.extend(one)
        closed = {(step.job, step.step) for step in out.steps}  # a later member closed it
        out.pending = tuple(key for key in dict.fromkeys(out.pending) if key not in closed)
        if refused:
            n = len(members)
            detail = "; ".join(f"bundle member {i} of {n}: {d}" for i, _, d, _ in refused)
            named = next((j for *_, j in refused if j), "")
            out.extend(self._letter(data, source, now_ns, refused[0][1], detail, named))
        return out

    def _take_together(
        self, members: Sequence[Member], source: Source, now_ns: int
    ) -> Output | None:
        """A bundle whose members are all batches of one step of a job met before, each
        passing its identity check, from distinct ranks: taken as one
        (:meth:`StepAssembler.add_together`), with the result of one at a time. None,
        having changed nothing, for any other bundle."""
        batches = [got for _, got in members if isinstance(got, OpBatch)]
        job = _bundle_job(members, source.key)
        if len(batches) < len(members) or len({b.rank for b in batches}) < len(batches):
            return None  # distinct ranks: no member can fix another's coordinates
        if any(b.job != job or self.identity.check(b, source.key) for b in batches):
            return None
        added = self.assembler.add_together(batches, now_ns)
        if added is None:
            return None
        for batch in batches:
            self.identity.accept(batch)
            self.jobs.observe(batch)
            self._keep_rank_steps(batch, added.late)
        out = self._rows_for(added.closed, now_ns)
        out.pending = tuple((job, step) for step in added.pending)
        if self.keep_ops:
            out.ops.extend(b for b in batches if not self._stored_before(b))
            for batch in batches if added.pending else ():
                self._note_stored(batch, added.pending)
        return out

    def on_batch(self, batch: OpBatch, data: bytes, source: Source, now_ns: int) -> Output:
        """One decoded batch (``data`` is its message, for a dead letter). A batch that
        contradicts its job's identity is a dead letter and changes nothing."""
        rejected = self.identity.check(batch, source.key)
        if rejected is not None:
            return self._dead_letter(
                data, source, now_ns, rejected.reason, rejected.detail, batch.job
            )
        try:
            added = self.assembler.add_batch(batch, now_ns)
        except (ValueError, TypeError) as exc:  # values the schema cannot express
            return self._dead_letter(data, source, now_ns, "bad-value", str(exc), batch.job)
        if added.fresh:
            self.identity.accept(batch)
            self.jobs.observe(batch)
            self._keep_rank_steps(batch, added.late)
        out = self._rows_for(added.closed, now_ns)
        out.pending = tuple((batch.job, step) for step in added.pending)
        if added.fresh and self.keep_ops:
            if not self._stored_before(batch):
                kept = _without_steps(batch, added.late) if added.late else batch
                if kept is not None:
                    out.ops.append(kept)
            if added.pending:  # stored (now or before) while its steps are open
                self._note_stored(batch, added.pending)
        return out

    def _note_stored(self, batch: OpBatch, steps: tuple[int, ...]) -> None:
        """Remember that ``batch``'s records of open ``steps`` are stored: a worker that
        takes the job over re-reads the batch and must not store it again."""
        by_step = self._open_batches.setdefault(batch.job, {})
        for step in steps:
            by_step.setdefault(step, set()).add((batch.rank, batch.batch_seq))

    def _keep_rank_steps(self, batch: OpBatch, late: frozenset[int]) -> None:
        """Hold the batch's step summaries until their steps close (all ranks in)."""
        if self.slowdown is None or not batch.rank_steps:
            return
        for item in batch.rank_steps:
            if item["step"] in late:
                self.rank_steps_late += 1
                continue
            rs = RankStep(batch.job, batch.rank, batch.host, batch.dp_rank, batch.pp_rank, item)
            self._rank_steps.setdefault((batch.job, rs.step), []).append(rs)
        if sum(len(v) for v in self._rank_steps.values()) > MAX_OPEN_RANK_STEPS:
            del self._rank_steps[min(self._rank_steps, key=lambda k: k[1])]

    def _signals(self, step: AssembledStep, now_ns: int, out: Output) -> None:
        """The step's per-rank signals, their rows, and the alerts they change."""
        held = self._rank_steps.pop((step.job, step.step), None)
        if self.slowdown is None or not held:
            return
        latest = {rs.rank: rs for rs in held}  # a repeated batch: its last copy counts
        signals = step_signals(list(latest.values()))
        open_now, alerts = self.slowdown.observe(signals)
        for s in signals:
            message = signals_message(s, open_now.get(s.rank, []))
            version = row_version(now_ns, generation=self.generation)
            out.add("rank_signals", CONTRACTS["rank_signals"].row(message, version=version))
            out.messages.append(("signals", step.job, message))
        for alert in alerts:
            out.add("alerts", alert_row(alert.message()))
            out.messages.append(("alerts", alert.job, alert.message()))

    def _stored_before(self, batch: OpBatch) -> bool:
        """Whether the batch's records were stored before a restart (see JobHistory)."""
        stored = self._stored_batches.get(batch.job)
        if not stored:
            return False
        # Any of its steps will do: a step closed before the restart was left out of
        # what was stored, and the batch's first step may be that one.
        keys = {(batch.rank, batch.batch_seq, s) for s in np.unique(batch.step).tolist()}
        if stored.isdisjoint(keys):
            return False
        stored.difference_update(keys)
        return True

    def precheck(self, batch: OpBatch, key: bytes | None) -> bool:
        """Whether ``batch`` passes the identity rules that need no job state (a batch
        that fails them must not make a worker restore the job it names)."""
        if self.knows(batch.job):
            return True
        return self.identity.check(batch, key) is None

    def knows(self, job: str) -> bool:
        return self.assembler.knows(job)

    def restore(self, job: str, layout: tuple[int, int], history: JobHistory) -> None:
        """State of a job this process has not seen, from what was stored before (a
        restart or a partition moved here): its closed steps are late from now on, its
        windows hold its latest analysed steps, its open alert stays open, its jobs row
        keeps when it was first seen and on which hosts."""
        layout = history.layout or layout
        self.assembler.restore_closed(job, layout, history.closed_steps)
        newest = max(history.closed_steps) if history.closed_steps else None
        self.identity.restore(job, layout, newest, history.coordinates)
        self._stored_batches[job] = set(history.stored_batches)
        if history.first_seen_ns is not None:
            self.jobs.restore(job, history.first_seen_ns, history.hosts)
        if history.summaries is not None:
            restore_summaries = getattr(self.analyser, "restore_summaries", None)
            if restore_summaries is not None:
                restore_summaries(job, history.summaries)
        else:
            restore = getattr(self.analyser, "restore", None)
            if restore is not None:
                restore(history.analysed)
        if self.alerts is not None:
            saved = JobAlertState(
                history.marks, history.open_alert, history.alert_group, history.last_alert
            )
            self.alerts.load(job, saved)
        if self.slowdown is not None:
            if history.detector is not None:
                self.slowdown.load(job, history.detector)
            else:
                self.slowdown.restore(history.signals, history.slowdown_alerts)

    def history(self, job: str) -> JobHistory:
        """What this process holds of ``job``, as :meth:`restore` takes it: the state a
        worker hands over when the job's partition moves (:mod:`~.handover`). Exact where
        the store's history is rebuilt: the window summaries and the slowdown detector's
        baselines as they are, not recomputed."""
        alerts = self.alerts.state(job) if self.alerts is not None else None
        summaries = getattr(self.analyser, "summaries", None)
        first_seen_ns, hosts = self.jobs.first_seen(job)
        closed = self.assembler.closed_steps(job)
        stored = {
            (rank, seq, step)
            for step, pairs in self._open_batches.get(job, {}).items()
            for rank, seq in pairs
        }
        stored |= self._stored_batches.get(job, set())
        done = set(closed)
        return JobHistory(
            closed_steps=closed,
            marks=alerts.marks if alerts else {},
            last_alert=alerts.last if alerts else None,
            first_seen_ns=first_seen_ns,
            hosts=hosts,
            layout=self.identity.layout(job),
            coordinates=self.identity.coordinates(job),
            stored_batches=frozenset(b for b in stored if b[2] not in done),
            summaries=summaries(job) if summaries is not None else None,
            detector=self.slowdown.state(job) if self.slowdown is not None else None,
        )

    def retire(self, job: str) -> Output:
        """Drop a job that has gone silent (:meth:`forget`); the output holds its
        ``jobs`` row if it moved since the last one, so the store has its last sight."""
        out = Output()
        row = self.jobs.unwritten_row(job)
        if row is not None:
            out.add("jobs", row)
        self.forget(job)
        return out

    def forget(self, job: str) -> None:
        """Drop a job's state (its partition was revoked from this worker), its closed
        steps not analysed yet included (their messages are not acknowledged)."""
        self._closed = [step for step in self._closed if step.job != job]
        self._closed_ops = sum(step.n_ops for step in self._closed)
        self.assembler.forget(job)
        self.jobs.forget(job)
        self.identity.forget(job)
        self._stored_batches.pop(job, None)
        self._open_batches.pop(job, None)
        for key in [k for k in self._rank_steps if k[0] == job]:
            del self._rank_steps[key]
        if self.slowdown is not None:
            self.slowdown.forget(job)
        forget = getattr(self.analyser, "forget", None)
        if forget is not None:
            forget(job)
        if self.alerts is not None:
            self.alerts.forget(job)

    def on_tick(self, now_ns: int) -> Output:
        """Close steps whose grace period ran out (call every second or so)."""
        return self._rows_for(self.assembler.expire(now_ns), now_ns)

    def flush(self, now_ns: int) -> Output:
        """Close every open step (end of replay or shutdown), and analyse every closed
        step, deferred or not."""
        out = self._rows_for(self.assembler.flush(), now_ns)
        out.extend(self.take_closed(now_ns))
        for row in self.jobs.unwritten():
            out.add("jobs", row)
        return out

    def _rows_for(self, closed: list[AssembledStep], now_ns: int) -> Output:
        """The output of closing ``closed``: the steps, in step order per job, and the
        rows of every closed step once :attr:`defer_ops` of their ops wait."""
        out = Output()
        for step in sorted(closed, key=lambda s: (s.job, s.step)):
            self._open_batches.get(step.job, {}).pop(step.step, None)
            out.steps.append(step)
            self._closed_ops += step.n_ops
        self._closed.extend(out.steps)
        if self._closed and self._closed_ops >= self.defer_ops:
            out.extend(self.take_closed(now_ns))
        return out

    def has_closed(self) -> bool:
        """Whether closed steps wait for :meth:`take_closed`."""
        return bool(self._closed)

    def take_closed(self, now_ns: int) -> Output:
        """Rows, messages and alerts of the closed steps not analysed yet, analysed in
        the order they closed (its ``steps`` are empty: each was named when it closed)."""
        closed, self._closed, self._closed_ops = self._closed, [], 0
        out = Output()
        analyses = self.analyser.analyse_many(closed) if self.analyser else [None] * len(closed)
        for step, analysis in zip(closed, analyses, strict=True):
            message = step_message(step, analysis)
            out.add("steps", step_row(message, now_ns, self.generation))
            attributions = analysis.attributions if analysis else ()
            for row in attribution_rows(step, attributions, now_ns, self.generation):
                out.add("step_attribution", row)
            out.messages.append(("steps", step.job, message))
            self._signals(step, now_ns, out)
            job_row = self.jobs.due(step)
            if job_row is not None:
                out.add("jobs", job_row)
            if analysis is not None:
                self.steps_analysed += 1
                self._alert(step, analysis, out)
        return out

    def _alert(self, step: AssembledStep, analysis: StepAnalysis, out: Output) -> None:
        if self.alerts is None:
            return
        job = step.job

        def locate(dimension: str, group: str) -> tuple[list[int], list[str]]:
            ranks = ranks_of(dimension, group, self.identity.coordinates(job))
            return ranks, self.jobs.hosts_of(job, ranks)

        def explain(ranks: list[int]) -> frozenset[str] | None:
            return None if self.slowdown is None else self.slowdown.open_kinds(job, ranks)

        alert = self.alerts.observe(
            job, step.step, step.start_ns, analysis.slowdown, analysis.attributions, locate,
            explain,
        )  # fmt: skip
        if alert is not None:
            out.add("alerts", alert_row(alert.message()))
            out.messages.append(("alerts", alert.job, alert.message()))

    def _dead_letter(
        self, data: bytes, source: Source, now_ns: int, reason: str, detail: str, job: str = ""
    ) -> Output:
        self._count_refusal(reason)
        return self._letter(data, source, now_ns, reason, detail, job)

    def _count_refusal(self, reason: str) -> None:
        """One refused batch (a bundle's refused members count one each)."""
        self.dead_letters += 1
        self.dead_letter_reasons[reason] = self.dead_letter_reasons.get(reason, 0) + 1

    @staticmethod
    def _letter(
        data: bytes, source: Source, now_ns: int, reason: str, detail: str, job: str
    ) -> Output:
        out = Output()
        out.add("dead_letters", dead_letter_row(data, source, now_ns, reason, detail))
        out.dead_letters.append(dead_letter(data, source, reason, detail, job))
        return out


def _bundle_job(members: Sequence[Member], key: bytes | None) -> str:
    """The job a bundle's members must name: its key's (a member naming another is
    refused by the identity check, as a message alone), else the first member's that
    decoded (one message feeds one job's steps: its acknowledgement follows them)."""
    if key:
        return key.decode("utf-8", "replace")
    return next((got.job for _, got in members if isinstance(got, OpBatch)), "")


def _other_job(batch: OpBatch, job: str, key: bytes | None) -> InvalidMessage | None:
    """Why an unkeyed bundle's member must be refused (a keyed one's: the identity
    check's ``key-mismatch``, as for a message alone)."""
    if key is None and batch.job != job:
        return InvalidMessage("schema", f"$.job: {batch.job!r} in a bundle of {job!r}")
    return None


@dataclass(frozen=True)
class JobHistory:
    """What the store remembers of a job, for :meth:`Pipeline.restore`."""

    closed_steps: list[int] = field(default_factory=list)
    analysed: list[AssembledStep] = field(default_factory=list)
    """The latest complete, analysed steps, rebuilt from the stored ops."""
    marks: dict[int, StepMark] = field(default_factory=dict)
    """The latest analysed steps' slowdown, blame and cause (the straggler alerts')."""
    last_alert: Alert | None = None
    """The job's latest stored straggler alert (firing: its episode is still open)."""
    first_seen_ns: int | None = None
    """From the job's stored ``jobs`` rows (None when there are none)."""
    hosts: frozenset[str] = frozenset()
    layout: tuple[int, int] | None = None
    """(dp_size, pp_size) of the job's stored ``jobs`` row: its identity outlives the
    process (None when there is no row yet)."""
    coordinates: dict[int, Coordinates] = field(default_factory=dict)
    """rank -> (dp, pp, tp, cp) of the ranks of the job's newest stored step."""
    signals: list[tuple[list[Signals], dict[int, list[str]]]] = field(default_factory=list)
    """The latest stored steps' slowdown signals, oldest first, each with the kinds open
    per rank (``rank_signals.anomalies``): the slowdown detector's history."""
    slowdown_alerts: list[dict[str, Any]] = field(default_factory=list)
    """The job's slowdown alerts whose latest stored state is firing (alert messages)."""
    stored_batches: frozenset[tuple[int, int, int]] = frozenset()
    """(rank, batch_seq, step) of the records stored for steps not closed yet: a batch
    re-read after a restart that matches one of them (same rank and batch_seq, one of
    its steps) feeds its steps but is not stored again."""
    summaries: dict[int, StepSummary] | None = None
    """The window's step summaries as another worker held them (the changelog): used
    instead of rebuilding them from ``analysed``."""
    detector: dict[str, Any] | None = None
    """The slowdown detector's state as another worker held it (the changelog): used
    instead of replaying ``signals``."""

    @property
    def open_alert(self) -> str | None:
        alert = self.last_alert
        return alert.alert_id if alert is not None and alert.state == "firing" else None

    @property
    def alert_group(self) -> tuple[str, str] | None:
        """The group the open straggler episode blames (from its firing alert)."""
        if self.open_alert is None or self.last_alert is None:
            return None
        blame = self.last_alert.evidence.get("blame")
        if not isinstance(blame, dict) or blame.get("dimension") not in DIMENSIONS:
            return None  # spread, or evidence no version of the alerts writes
        return str(blame["dimension"]), str(blame.get("group", ""))


def step_row(message: dict[str, Any], now_ns: int, generation: int = 0) -> dict[str, Any]:
    """The ``steps`` row of a step's message (:func:`step_message`), as the table's
    contract says (``schemas/tables.py``): ``time`` the step's start as a DateTime,
    ``partial`` as 0 or 1, when it was analysed as bookkeeping; its version ranks an
    analysed row over a partial one, then the newer owner's (``generation``)."""
    complete = not message["partial"] and message["t_sim"] is not None
    version = row_version(now_ns, generation=generation, complete=complete)
    row = CONTRACTS["steps"].row(message, analysed_at=utc(now_ns), version=version)
    row["time"] = utc(message["start_ns"])
    row["partial"] = int(message["partial"])
    return row


def step_message(step: AssembledStep, analysis: StepAnalysis | None) -> dict[str, Any]:
    """The ``rankwatch.steps`` message of a closed step (see steps.v1.schema.json)."""
    top = None
    if analysis and analysis.attributions:
        dimension, group, value = max(analysis.attributions, key=lambda a: a[2])
        top = {"dimension": dimension, "group": group, "slowdown": value}
    slowdown = analysis.slowdown if analysis else None
    return {
        "schema": "steps",
        "version": 1,
        "job": step.job,
        "step": step.step,
        "start_ns": step.start_ns,
        "t_base": step.t_base,
        "t_sim": analysis.t_sim if analysis else None,
        "t_ideal": analysis.t_ideal if analysis else None,
        "slowdown": slowdown,
        "waste": None if slowdown is None else waste_of(slowdown),
        "partial": step.partial,
        "missing_workers": [f"{d},{p}" for d, p in step.missing_workers],
        "n_ops": step.n_ops,
        "top_attribution": top,
    }


def signals_message(s: Signals, anomalies: list[str]) -> dict[str, Any]:
    """The ``rankwatch.signals`` message of one rank's step (see signals.v1.schema.json)."""
    fields = dict(vars(s))
    fields["v_inter"] = min(1.0, max(0.0, s.v_inter))
    fields["v_minority"] = min(1.0, max(0.0, s.v_minority))
    return {"schema": "signals", "version": 1, **fields, "anomalies": anomalies}


def attribution_rows(
    step: AssembledStep,
    attributions: Sequence[tuple[str, str, float]],
    now_ns: int,
    generation: int = 0,
) -> list[dict[str, Any]]:
    """The step's ``step_attribution`` rows: about a hundred a step of a DP-32 job, so
    the step's time is converted and the row's columns checked once, not once a row."""
    job, number, time = step.job, step.step, utc(step.start_ns)
    version = row_version(now_ns, generation=generation)
    rows = [
        {
            "job": job,
            "step": number,
            "time": time,
            "dimension": dimension,
            "group": group,
            "slowdown": value,
            "version": version,
        }
        for dimension, group, value in attributions
    ]
    if rows:
        table_row("step_attribution", **rows[0])  # the same columns in every row
    return rows


def _without_steps(batch: OpBatch, steps: frozenset[int]) -> OpBatch | None:
    """``batch`` less its records of ``steps`` (late: their step is stored already, so
    storing them again would double the raw ``ops`` rows); None when nothing is left."""
    keep = ~np.isin(batch.step, np.fromiter(steps, dtype=np.int64, count=len(steps)))
    if not keep.any():
        return None
    columns: dict[str, Any] = {name: column[keep] for name, column in batch.columns().items()}
    return replace(batch, **columns)
