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

from dataclasses import dataclass

import numpy as np

from rankwatch.sim.align import OpTimes
from rankwatch.sim.graph import OpGraph


@dataclass(frozen=True)
class Measured:
    """Inputs of the simulation for S steps, and the recorded step times."""

    steps: np.ndarray  # (S,)
    cost_NSD: np.ndarray  # duration (compute) or transfer duration (communication)
    delay_NSD: np.ndarray  # launch delay
    base_S: np.ndarray  # recorded step time: latest end of the step
    exact_cost_NSD: np.ndarray  # the same, not clamped at 0: they replay the
    exact_delay_NSD: np.ndarray  # recorded times exactly (clocks overlap by a few µs)


def measure(graph: OpGraph, times: OpTimes) -> Measured:
    """Costs and launch delays of every recorded op (vectorised over ops, steps, ranks)."""
    start, end = times.start_NSD, times.end_NSD
    group_start = group_latest(graph, start)
    cost = np.where(graph.is_comm[:, None, None], end - group_start, end - start)
    ready = np.zeros_like(start)
    for nodes, deps in graph.dep_buckets:
        ready[nodes] = end[deps].max(axis=1)
    delay = start - ready
    return Measured(
        steps=times.steps,
        cost_NSD=np.maximum(cost, 0.0),
        delay_NSD=np.maximum(delay, 0.0),
        base_S=end.max(axis=(0, 2)),
        exact_cost_NSD=cost,
        exact_delay_NSD=delay,
    )


def group_latest(graph: OpGraph, start_NSD: np.ndarray) -> np.ndarray:
    """Latest start among each op's group members (the op itself for compute ops)."""
    latest = start_NSD.copy()
    for nodes, members in graph.member_buckets:
        latest[nodes] = start_NSD[members].max(axis=1)
    wide = graph.dp_wide
    latest[wide] = latest[wide].max(axis=-1, keepdims=True)
    return latest
