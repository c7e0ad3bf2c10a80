"""What the simulation takes from a trace: costs and launch delays per op.

- compute op: its cost is its recorded duration;
- communication op: its cost is its *transfer duration*, end minus the latest start in
  its group (across DP ranks for DP-wide groups), clamped at 0 — the rest was blocking,
  which the schedule decides;
- launch delay: recorded start minus the latest end of the op's dependencies (the step
  start for an op with none), clamped at 0 — CPU-side work the trace does not show.

Legend: N ops, S steps, D DP ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rankwatch.sim.align import OpTimes
from rankwatch.sim.graph import OpGraph

_CHUNK_CELLS = 1 << 19
"""Steps are measured a chunk of at most this many (op, step, rank) cells at a time (the
temporaries' memory), unless one step alone is larger."""


@dataclass(frozen=True)
class Measured:
    """Inputs of the simulation for S steps, and the recorded step times.

    Costs and delays are kept as measured, not clamped at 0 (they replay the recorded
    times exactly; clocks overlap by a few µs); ``cost_NSD`` and ``delay_NSD`` are the
    clamped ones the what-if uses, made on first use (the analysis itself clamps a chunk
    at a time and never makes them: 8 bytes per op each).
    """

    steps: np.ndarray  # (S,)
    exact_cost_NSD: np.ndarray  # duration (compute) or transfer duration (communication)
    exact_delay_NSD: np.ndarray  # launch delay
    base_S: np.ndarray  # recorded step time: latest end of the step

    @cached_property
    def cost_NSD(self) -> np.ndarray:
        """Costs clamped at 0."""
        return np.maximum(self.exact_cost_NSD, 0.0)

    @property
    def delay_NSD(self) -> np.ndarray:
        """Launch delays clamped at 0."""
        return np.maximum(self.exact_delay_NSD, 0.0)


def measure(graph: OpGraph, times: OpTimes, *, in_place: bool = False) -> Measured:
    """Costs and launch delays of every recorded op (vectorised over ops, steps, ranks).

    Steps are independent: a chunk of steps at a time keeps the temporaries small.
    ``in_place``: write the costs over ``times``' durations and the delays over its
    starts (for a caller that made ``times`` only for this: 16 bytes per op less).
    """
    start_NSD, duration_NSD = times.start_NSD, times.duration_NSD
    n, s, d = start_NSD.shape
    cost_NSD = duration_NSD if in_place else np.empty_like(start_NSD)
    delay_NSD = start_NSD if in_place else np.empty_like(start_NSD)
    base_S = np.empty(s)
    per_step = max(1, _CHUNK_CELLS // max(n * d, 1))
    local = ~graph.is_comm
    for first in range(0, s, per_step):
        steps = slice(first, first + per_step)
        # a copy unless the chunk is the whole table (gathers from a strided view are
        # slow); in place, the delays are written over it only once it is no longer read
        start = np.ascontiguousarray(start_NSD[:, steps])
        end = start + duration_NSD[:, steps]
        # cost = end - (latest start in the group) for communication ops, else
        # end - start; made in place in the group-start table
        cost = group_latest(graph, start)
        cost[local] = start[local]
        np.subtract(end, cost, out=cost)
        cost_NSD[:, steps] = cost
        del cost
        ready = np.zeros_like(start)
        for nodes, deps in graph.dep_buckets:
            ready[nodes] = latest_of(end, deps)
        np.subtract(start, ready, out=delay_NSD[:, steps])
        base_S[steps] = end.max(axis=(0, 2))
    return Measured(
        steps=times.steps,
        exact_cost_NSD=cost_NSD,
        exact_delay_NSD=delay_NSD,
        base_S=base_S,
    )


def group_latest(graph: OpGraph, start_NSD: np.ndarray) -> np.ndarray:
    """Latest start among each op's group members (the op itself for compute ops)."""
    latest = start_NSD.copy()
    for nodes, members in graph.member_buckets:
        latest[nodes] = latest_of(start_NSD, members)
    wide = graph.dp_wide
    latest[wide] = latest[wide].max(axis=-1, keepdims=True)
    return latest


def latest_of(table: np.ndarray, rows_BK: np.ndarray) -> np.ndarray:
    """``table[rows_BK].max(axis=1)``: elementwise maxima over the K columns, a few times
    faster than a reduction over a short middle axis, and without the (B, K, ...) copy."""
    out = table.take(rows_BK[:, 0], axis=0)
    for k in range(1, rows_BK.shape[1]):
        np.maximum(out, table.take(rows_BK[:, k], axis=0), out=out)
    return out


def joined(parts: Sequence[Measured]) -> Measured:
    """Steps measured one at a time (under one graph) as one set, in order: what
    :func:`~rankwatch.sim.analysis.analyse_each` takes for steps that closed apart."""
    if len(parts) == 1:
        return parts[0]
    return Measured(
        steps=np.concatenate([p.steps for p in parts]),
        exact_cost_NSD=np.concatenate([p.exact_cost_NSD for p in parts], axis=1),
        exact_delay_NSD=np.concatenate([p.exact_delay_NSD for p in parts], axis=1),
        base_S=np.concatenate([p.base_S for p in parts]),
    )
