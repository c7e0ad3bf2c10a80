"""Replay an op trace as the hooks would have sent it.

The hooks cut a rank's records into messages by the batching rule
(``rankwatch.schemas.batching``); the replay applies the same rule to the trace's
timeline, each record "put" at its op's end: a step's records leave at the rank's last
op end of the step, together with the rank's earlier finished steps still held (short
steps share a message, at most ``window_s`` late); a step longer than ``partial_s``
sends its earlier records before it ends; the rank's last step leaves at its end (the
hooks close). With the default rule and steps longer than the window (the shipped
traces' steps take seconds) this is one message per rank and step. Batches come out in
send-time order, the order a broker would see them. Pure: the shells (``rankwatch
replay``, the embedded demo) encode and ship what this yields.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rankwatch.schemas.batching import MAX_STEPS, BatchingRule, Bundler, RelayRule, StepHold
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.sim.trace import JobMeta, Trace

STEP_GAP_S = 0.05
"""Pause between replayed steps (traces are a sample of steps, not a timeline)."""

RANKS_PER_HOST = 8


@dataclass(frozen=True)
class ReplayedBatch:
    batch: OpBatch
    sent_ns: int


def replay_batches(
    trace: Trace,
    meta: JobMeta,
    job: str,
    origin_ns: int,
    rule: BatchingRule | None = None,
    time_scale: float = 1.0,
) -> Iterator[ReplayedBatch]:
    """The batches of ``trace`` as the hooks cut them (``rule``, the hooks' default when
    None), laid on a timeline starting at ``origin_ns``.

    Steps are placed one after another (their recorded length plus a small gap), in
    step order; inside a step the recorded start times are kept. ``time_scale`` < 1
    replays the job as if every op took that fraction of its recorded time (shorter
    steps: the hooks' rule then puts several in one message).
    """
    rule = rule or BatchingRule()
    step_offset_ns = {
        step: origin_ns + at for step, at in _step_offsets_ns(trace, time_scale).items()
    }
    # integers for the epoch part: float64 has ~100 ns resolution at today's epoch ns
    offsets = np.array([step_offset_ns[s] for s in trace.step.tolist()], dtype=np.int64)
    start_ns = offsets + np.round(trace.start_ts * (1e9 * time_scale)).astype(np.int64)
    duration_ns = np.round(trace.duration * (1e9 * time_scale)).astype(np.int64)
    order = np.lexsort((start_ns + duration_ns, trace.step, trace.rank))
    batches = list(_cut(trace, meta, job, order, start_ns, duration_ns, rule))
    batches.sort(key=lambda b: (b.sent_ns, b.batch.rank))
    yield from batches


def span_ns(trace: Trace, time_scale: float = 1.0) -> int:
    """Length of the replay's timeline: a replay that should end now starts at
    ``now - span_ns(trace)`` (a job's rows must not lie in the future)."""
    ends = trace.start_ts + trace.duration
    offsets = _step_offsets_ns(trace, time_scale)
    if not offsets:
        return 0
    last = max(offsets)
    return offsets[last] + round(float(ends[trace.step == last].max()) * 1e9 * time_scale)


def _step_offsets_ns(trace: Trace, time_scale: float = 1.0) -> dict[int, int]:
    """Start of each step from the start of the first: recorded lengths plus a gap."""
    ends = trace.start_ts + trace.duration
    out: dict[int, int] = {}
    cursor = 0
    for step in np.unique(trace.step).tolist():
        out[step] = cursor
        length = float(ends[trace.step == step].max()) + STEP_GAP_S
        cursor += round(length * 1e9 * time_scale)
    return out


@dataclass
class _Part:
    """Records of one step of one rank waiting to leave (rows of the trace)."""

    step: int
    rows: np.ndarray
    n_ops: int = 0
    """The step's record count once its end is known (0: still running)."""


def _cut(
    trace: Trace,
    meta: JobMeta,
    job: str,
    order: np.ndarray,
    start_ns: np.ndarray,
    duration_ns: np.ndarray,
    rule: BatchingRule,
) -> Iterator[ReplayedBatch]:
    """Per rank, the messages the hooks' rule makes of its records (``order``: rows by
    rank, step and op end)."""
    end_ns = start_ns + duration_ns
    rank_sorted = trace.rank[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(rank_sorted)) + 1, [order.size]))
    for lo, hi in itertools.pairwise(bounds.tolist()):
        rows = order[lo:hi]
        rank = int(trace.rank[rows[0]])
        sends = _rank_sends(trace.step[rows], end_ns[rows], rows, rule)
        for seq, (sent_ns, parts) in enumerate(sends):
            yield ReplayedBatch(_batch(trace, meta, job, rank, seq, sent_ns, parts, start_ns,
                                       duration_ns), sent_ns)  # fmt: skip


def _rank_sends(
    steps: np.ndarray, ends: np.ndarray, rows: np.ndarray, rule: BatchingRule
) -> list[tuple[int, list[_Part]]]:
    """(send time, the parts in it) of one rank's messages, in send order. ``ends``: each
    record's op end (when the hooks put it), ns; the hold runs on the same clock."""
    out: list[tuple[int, list[_Part]]] = []
    hold = StepHold(rule.window_s * 1e9)
    held: list[_Part] = []

    def release_held(before: int) -> None:
        """Send the held steps if they fall due by ``before``."""
        deadline = hold.deadline
        if held and deadline is not None and deadline <= before:
            out.extend(_chunks(int(deadline), held, rule))
            held.clear()
            hold.sent()

    partial_ns = round(rule.partial_s * 1e9)
    cut = np.concatenate(([0], np.flatnonzero(np.diff(steps)) + 1, [steps.size]))
    segments = list(itertools.pairwise(cut.tolist()))
    for i, (lo, hi) in enumerate(segments):
        step, step_end = int(steps[lo]), int(ends[hi - 1])
        release_held(int(ends[lo]))
        # a step that runs long: partial_s after the first pending record, the records
        # ended by then leave, all but the latest (the hooks' partial flush)
        at, flush_at = lo, int(ends[lo]) + partial_ns
        while (upto := lo + int(np.searchsorted(ends[lo:hi], flush_at, side="right"))) < hi:
            release_held(flush_at)
            if upto - 1 > at:
                out.extend(_chunks(flush_at, [_Part(step, rows[at : upto - 1])], rule))
                at = upto - 1
            flush_at += partial_ns
        hold.ended(float(step_end))
        held.append(_Part(step, rows[at:hi], n_ops=hi - lo))
        size = sum(part.rows.size for part in held)
        if i == len(segments) - 1 or hold.due(float(step_end)) or size >= rule.max_records:
            out.extend(_chunks(step_end, held, rule))  # the last step: the hooks close
            held.clear()
            hold.sent()
    out.sort(key=lambda item: item[0])
    return out


def _chunks(sent_ns: int, parts: list[_Part], rule: BatchingRule) -> list[tuple[int, list[_Part]]]:
    """``parts`` in messages of at most ``max_records`` records and ``MAX_STEPS`` ends."""
    out: list[tuple[int, list[_Part]]] = []
    current: list[_Part] = []
    size = ends = 0
    for part in parts:
        at = 0
        while at < part.rows.size:
            take = min(part.rows.size - at, rule.max_records - size)
            whole = at == 0 and take == part.rows.size
            piece = part if whole else _Part(part.step, part.rows[at : at + take])
            if not whole and at + take == part.rows.size:
                piece.n_ops = part.n_ops  # the step's end rides with its last record
            current.append(piece)
            size, at = size + take, at + take
            ends += 1 if piece.n_ops else 0
            if size >= rule.max_records or ends >= MAX_STEPS:
                out.append((sent_ns, current))
                current, size, ends = [], 0, 0
    if current:
        out.append((sent_ns, current))
    return out


def _batch(
    trace: Trace,
    meta: JobMeta,
    job: str,
    rank: int,
    seq: int,
    sent_ns: int,
    parts: list[_Part],
    start_ns: np.ndarray,
    duration_ns: np.ndarray,
) -> OpBatch:
    rows = parts[0].rows if len(parts) == 1 else np.concatenate([p.rows for p in parts])
    return OpBatch(
        job=job,
        host=f"host-{rank // RANKS_PER_HOST}",
        rank=rank,
        dp_rank=int(trace.dp_rank[rows[0]]),
        pp_rank=int(trace.stage[rows[0]]),
        tp_rank=0,
        cp_rank=0,
        dp_size=meta.dp_size,
        pp_size=meta.pp_size,
        batch_seq=seq,
        sent_ns=sent_ns,
        step=trace.step[rows],
        optype=trace.optype[rows],
        seq_id=trace.seq_id[rows],
        mb_id=trace.mb_id[rows],
        chunk=trace.mc[rows],
        gmc=trace.gmc[rows],
        start_ns=start_ns[rows],
        duration_ns=duration_ns[rows],
        steps_done=tuple((p.step, p.n_ops) for p in parts if p.n_ops),
    )


def replay_repeated(
    trace: Trace,
    meta: JobMeta,
    job: str,
    origin_ns: int,
    copies: int,
    rule: BatchingRule | None = None,
    time_scale: float = 1.0,
) -> Iterator[ReplayedBatch]:
    """``trace`` replayed ``copies`` times back to back as one longer job (steps and
    batch sequence numbers continue): long replays for benchmarks of bounded memory."""
    span = int(trace.step.max() - trace.step.min()) + 1
    seq: dict[int, int] = {}
    start = origin_ns
    for i in range(copies):
        shifted = dataclasses.replace(trace, step=trace.step + i * span)
        last = start
        for item in replay_batches(shifted, meta, job, start, rule, time_scale):
            rank = item.batch.rank
            seq[rank] = seq.get(rank, -1) + 1
            last = item.sent_ns
            yield ReplayedBatch(dataclasses.replace(item.batch, batch_seq=seq[rank]), item.sent_ns)
        start = last + round(STEP_GAP_S * 1e9 * time_scale)


@dataclass(frozen=True)
class Relayed:
    """One message a host's relay sends: the frames of one job it gathered (one frame
    alone is sent as it is), and the batches they hold."""

    sent_ns: int
    job: str
    frames: tuple[bytes, ...]
    batches: tuple[OpBatch, ...]


def relay_timeline(
    sent: Iterator[tuple[ReplayedBatch, bytes]] | list[tuple[ReplayedBatch, bytes]],
    rule: RelayRule,
) -> list[Relayed]:
    """Encoded batches in send-time order (``replay_batches`` and each one's frame) as
    each host's relay would pass them on (``rule``, one :class:`Bundler` per host), in
    the order they leave: a bundle leaves when it is full, or ``linger_s`` after its
    first frame, at the latest when the replay ends."""
    bundlers: dict[str, Bundler] = {}
    held: dict[int, OpBatch] = {}  # id(frame) -> its batch, while the frame is held
    out: list[Relayed] = []

    def emit(at_s: float, ready: list[tuple[str, list[bytes]]]) -> None:
        for job, frames in ready:
            batches = tuple(held.pop(id(f)) for f in frames)
            out.append(Relayed(round(at_s * 1e9), job, tuple(frames), batches))

    for item, frame in sent:
        now = item.sent_ns / 1e9
        for bundler in bundlers.values():  # bundles due before this frame came
            while (deadline := bundler.deadline) is not None and deadline <= now:
                emit(deadline, bundler.due(deadline))
        bundler = bundlers.setdefault(item.batch.host, Bundler(rule))
        held[id(frame)] = item.batch
        emit(now, bundler.add(now, item.batch.job, frame))
    for bundler in bundlers.values():
        while (deadline := bundler.deadline) is not None:
            emit(deadline, bundler.due(deadline))
    out.sort(key=lambda r: r.sent_ns)
    return out
