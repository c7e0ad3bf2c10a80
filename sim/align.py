"""Records to dense per-op arrays: ``(N ops, S steps, D dp ranks)``, one cell per record.

Legend: N = ops of the model (one step, one DP rank), S = steps, D = DP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import OpGraph
from rankwatch.sim.naming import list_names, op_label
from rankwatch.sim.trace import Trace


@dataclass(frozen=True)
class OpTimes:
    """Recorded start and duration of every modelled op, seconds from its step's start."""

    steps: np.ndarray  # (S,) step numbers, ascending
    start_NSD: np.ndarray
    duration_NSD: np.ndarray

    @property
    def end_NSD(self) -> np.ndarray:
        return self.start_NSD + self.duration_NSD


def align(graph: OpGraph, trace: Trace) -> OpTimes:
    """Place each record at its (op, step, dp_rank) cell; every cell must be filled once.

    Records of ops modelled as no-ops are dropped. The result does not depend on the
    order of the records. Raises :class:`ModelError` naming unknown, missing or
    duplicated ops.
    """
    if len(trace) == 0:
        raise ModelError("the trace has no ops")
    _check_ranges(graph, trace)
    node = _nodes(graph, trace)
    keep: np.ndarray | slice = slice(None)
    if (node < 0).any():
        unknown = node == -1
        if unknown.any():
            raise ModelError(
                "ops not in the model inferred from dp_rank 0 (every step and DP rank must "
                f"run the same ops): {_describe(trace, np.flatnonzero(unknown))}"
            )
        keep = np.flatnonzero(node >= 0)  # rows of no-op records left out, not copied
        node = node[keep]
    step = trace.step[keep]
    steps, step_index = _step_index(step)
    shape = (graph.size, steps.size, graph.dp_size)
    # flat cell of each record, in place: one int64 per record, no other temporary
    flat = node.astype(np.int64, copy=False)  # our own array: reused in place
    del node
    flat *= steps.size
    if step_index is None:  # steps first, first + 1, ...: the index is step - first
        flat += step
        flat -= steps[0]
    else:
        flat += step_index
    flat *= graph.dp_size
    flat += trace.dp_rank[keep]
    cells = int(np.prod(shape))
    seen = np.zeros(cells, dtype=bool)
    seen[flat] = True
    if flat.size != cells or not seen.all():  # some cell empty or filled twice
        counts = np.bincount(flat, minlength=cells)
        if (counts > 1).any():
            raise ModelError(f"ops recorded twice: {_cells(graph, steps, shape, counts > 1)}")
        raise ModelError(f"ops missing: {_cells(graph, steps, shape, counts == 0)}")
    del seen
    start = np.empty(shape)
    duration = np.empty(shape)
    start.reshape(-1)[flat] = trace.start_ts[keep]
    duration.reshape(-1)[flat] = trace.duration[keep]
    # times from the step's first start
    start -= start.min() if steps.size == 1 else start.min(axis=(0, 2), keepdims=True)
    return OpTimes(steps=steps, start_NSD=start, duration_NSD=duration)


def _step_index(step: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The distinct steps, ascending, and each record's index among them; None for the
    index when the steps are consecutive (it is then ``step - first step``)."""
    first, last = int(step.min()), int(step.max())
    if last - first > 4 * step.size:  # sparse step numbers: sort
        steps, index = np.unique(step.astype(np.int64), return_inverse=True)
        return steps, index.reshape(-1)
    present = np.zeros(last - first + 1, dtype=bool)
    present[step - first] = True
    steps = np.flatnonzero(present) + first
    if steps.size == present.size:
        return steps, None
    return steps, (np.cumsum(present) - 1)[step - first]


def _nodes(graph: OpGraph, trace: Trace) -> np.ndarray:
    """Node of each record: -1 not in the model, -2 a no-op record (ignored)."""
    table = graph.lookup
    _, seqs, stages = table.shape
    seq = trace.seq_id
    inside = None
    if seq.size and (seq.min() < 0 or seq.max() >= seqs):
        inside = (seq >= 0) & (seq < seqs)
        seq = np.where(inside, seq, 0)
    # flat index into the table, made in place (faster than indexing with three arrays)
    cell = trace.optype.astype(np.int64)
    cell *= seqs
    cell += seq
    cell *= stages
    cell += trace.stage
    node = table.reshape(-1).take(cell)
    del cell
    if inside is not None:
        node[~inside] = -1
    return node


def _check_ranges(graph: OpGraph, trace: Trace) -> None:
    for column, size, what in (
        (trace.dp_rank, graph.dp_size, "dp_rank"),
        (trace.stage, graph.pp_size, "stage"),
    ):
        if column.size and column.min() >= 0 and column.max() < size:
            continue
        bad = (column < 0) | (column >= size)
        if bad.any():
            raise ModelError(
                f"{what} {int(column[bad][0])} is outside the job's {what}s 0..{size - 1}"
            )


def _describe(trace: Trace, rows: np.ndarray) -> str:
    t = trace
    labels = [
        f"{op_label(int(t.optype[r]), int(t.seq_id[r]), int(t.stage[r]), int(t.mb_id[r]))}"
        f" in step {int(t.step[r])} of dp_rank {int(t.dp_rank[r])}"
        for r in rows[:6]
    ]
    return list_names(labels, total=int(rows.size))


def _cells(graph: OpGraph, steps: np.ndarray, shape: tuple[int, int, int], bad: np.ndarray) -> str:
    cells = np.flatnonzero(bad)
    node, s, d = np.unravel_index(cells[:6], shape)
    labels = [
        f"{graph.label(int(n))} in step {int(steps[i])} of dp_rank {int(r)}"
        for n, i, r in zip(node, s, d, strict=True)
    ]
    return list_names(labels, total=int(cells.size))
