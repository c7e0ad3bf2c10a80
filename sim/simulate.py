"""The simulator: op start and end times over many lanes at once, level by level.

A lane is one (scenario X, step S, dp rank D). All lanes share the graph, so each
level of the plan is a handful of numpy operations over arrays ``(L ops, X, S, D)``;
the only Python loop is over levels. The last lane axis must be the DP axis: groups
that span DP ranks take their latest start over it.

Rules (WHATIF.md): start = latest end of the dependencies (0 for none) + launch
delay; a compute op ends at start + duration; a communication op ends at the latest
start in its group + its transfer duration; the step ends with the latest final op.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rankwatch.sim.graph import OpGraph

CostFn = Callable[[np.ndarray], np.ndarray]
"""Cost (duration or transfer duration) of the given ops on every lane:
an array broadcastable to ``(L, X, S, D)``."""


def simulate(
    graph: OpGraph,
    cost: CostFn,
    lanes: tuple[int, int, int],
    delay_NSD: np.ndarray | None = None,
) -> np.ndarray:
    """Step times ``(X, S)``: latest end of the final ops over all DP ranks."""
    n = graph.size
    start = np.empty((n, *lanes))
    end = np.zeros((n + 1, *lanes))  # row n: the step start
    for level in graph.levels:
        first = end[level.dep_rows].max(axis=1)
        if delay_NSD is not None:
            first += delay_NSD[level.nodes][:, None]
        start[level.nodes] = first
        if level.compute.size:
            end[level.compute] = start[level.compute] + cost(level.compute)
        if level.local.size:
            ready = start[level.local_members].max(axis=1)
            end[level.local] = ready + cost(level.local)
        if level.dp_wide.size:
            ready = start[level.dp_wide_members].max(axis=1).max(axis=-1, keepdims=True)
            end[level.dp_wide] = ready + cost(level.dp_wide)
    return end[graph.final].max(axis=(0, 3))
