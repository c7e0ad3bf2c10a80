"""Replay an op trace as the hooks would have sent it: one batch per rank and step.

A hook flushes its buffer when the step ends on its rank, so a replayed batch holds
one rank's ops of one step and is "sent" at that rank's last op end. Batches come
out in send-time order, the order a broker would see them. Pure: the shells
(``rankwatch replay``, the embedded demo) encode and ship what this yields.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

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
    trace: Trace, meta: JobMeta, job: str, origin_ns: int
) -> Iterator[ReplayedBatch]:
    """Per-(rank, step) batches of ``trace`` laid on a timeline starting at ``origin_ns``.

    Steps are placed one after another (their recorded length plus a small gap), in
    step order; inside a step the recorded start times are kept.
    """
    step_offset_ns = {step: origin_ns + at for step, at in _step_offsets_ns(trace).items()}
    # integers for the epoch part: float64 has ~100 ns resolution at today's epoch ns
    offsets = np.array([step_offset_ns[s] for s in trace.step.tolist()], dtype=np.int64)
    start_ns = offsets + np.round(trace.start_ts * 1e9).astype(np.int64)
    duration_ns = np.round(trace.duration * 1e9).astype(np.int64)
    order = np.lexsort((start_ns, trace.rank, trace.step))
    batches = list(_cut(trace, meta, job, order, start_ns, duration_ns))
    batches.sort(key=lambda b: (b.sent_ns, b.batch.rank))
    yield from batches


def span_ns(trace: Trace) -> int:
    """Length of the replay's timeline: a replay that should end now starts at
    ``now - span_ns(trace)`` (a job's rows must not lie in the future)."""
    ends = trace.start_ts + trace.duration
    offsets = _step_offsets_ns(trace)
    if not offsets:
        return 0
    last = max(offsets)
    return offsets[last] + round(float(ends[trace.step == last].max()) * 1e9)


def _step_offsets_ns(trace: Trace) -> dict[int, int]:
    """Start of each step from the start of the first: recorded lengths plus a gap."""
    ends = trace.start_ts + trace.duration
    out: dict[int, int] = {}
    cursor = 0
    for step in np.unique(trace.step).tolist():
        out[step] = cursor
        cursor += round((float(ends[trace.step == step].max()) + STEP_GAP_S) * 1e9)
    return out


def _cut(
    trace: Trace,
    meta: JobMeta,
    job: str,
    order: np.ndarray,
    start_ns: np.ndarray,
    duration_ns: np.ndarray,
) -> Iterator[ReplayedBatch]:
    key = trace.step[order] * (1 << 24) + trace.rank[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1, [key.size]))
    seq_by_rank: dict[int, int] = {}
    for lo, hi in itertools.pairwise(bounds.tolist()):
        rows = order[lo:hi]
        rank = int(trace.rank[rows[0]])
        sent_ns = int((start_ns[rows] + duration_ns[rows]).max())
        seq_by_rank[rank] = seq_by_rank.get(rank, -1) + 1
        batch = OpBatch(
            job=job,
            host=f"host-{rank // RANKS_PER_HOST}",
            rank=rank,
            dp_rank=int(trace.dp_rank[rows[0]]),
            pp_rank=int(trace.stage[rows[0]]),
            tp_rank=0,
            cp_rank=0,
            dp_size=meta.dp_size,
            pp_size=meta.pp_size,
            batch_seq=seq_by_rank[rank],
            sent_ns=sent_ns,
            step=trace.step[rows],
            optype=trace.optype[rows],
            seq_id=trace.seq_id[rows],
            mb_id=trace.mb_id[rows],
            chunk=trace.mc[rows],
            gmc=trace.gmc[rows],
            start_ns=start_ns[rows],
            duration_ns=duration_ns[rows],
            steps_done=((int(trace.step[rows[0]]), int(hi - lo)),),
        )
        yield ReplayedBatch(batch, sent_ns)


def replay_repeated(
    trace: Trace, meta: JobMeta, job: str, origin_ns: int, copies: int
) -> Iterator[ReplayedBatch]:
    """``trace`` replayed ``copies`` times back to back as one longer job (steps and
    batch sequence numbers continue): long replays for benchmarks of bounded memory."""
    span = int(trace.step.max() - trace.step.min()) + 1
    seq: dict[int, int] = {}
    start = origin_ns
    for i in range(copies):
        shifted = dataclasses.replace(trace, step=trace.step + i * span)
        last = start
        for item in replay_batches(shifted, meta, job, start):
            rank = item.batch.rank
            seq[rank] = seq.get(rank, -1) + 1
            last = item.sent_ns
            yield ReplayedBatch(dataclasses.replace(item.batch, batch_seq=seq[rank]), item.sent_ns)
        start = last + round(STEP_GAP_S * 1e9)
