"""The simulator: op start and end times over many lanes at once, level by level.

A lane is one (scenario X, step S, dp rank D). All lanes share the graph, so each
level of the plan is a handful of numpy operations over arrays ``(L ops, X, S, D)``
written into consecutive rows of the time tables (see :class:`~rankwatch.sim.graph.Level`);
the only Python loop is over levels. Inputs come as tables in plan order
(``graph.plan_nodes``): row r holds the op ``plan_nodes[r]``. The last lane axis is
the DP axis: groups that span DP ranks take their latest start over it.

Rules (docs/whatif.md, "Simulation"): start = latest end of the dependencies (0 for none) + launch
delay; a compute op ends at start + duration; a communication op ends at the latest
start in its group + its transfer duration; the step ends with the latest final op.

Legend: R plan rows (one per op), X scenarios, S steps, D DP ranks.
"""

from __future__ import annotations

import numpy as np

from rankwatch.sim.graph import OpGraph
from rankwatch.sim.scenarios import Costs
from rankwatch.sim.workspace import Workspace


def simulate(
    graph: OpGraph,
    costs: Costs,
    delay_RSD: np.ndarray | None = None,
    delayed: int = 1,
    workspace: Workspace | None = None,
    tag: str = "",
) -> np.ndarray:
    """Step times ``(X, S)``: the latest end of the final ops over all DP ranks.

    ``costs``: duration (compute ops) or transfer duration (communication ops) per plan
    row and lane; their dtype is the arithmetic's (float32 halves the memory traffic).
    ``delay_RSD``: launch delays in plan order, added on the first ``delayed``
    scenarios only; None for none. ``workspace``: scratch memory to reuse (its tables
    are named after ``tag``), or None to allocate afresh.
    """
    n, lanes, dtype = graph.size, costs.lanes, costs.blocks_BF.dtype
    work = workspace or Workspace()
    # A communication op's start is read only by its own level's group ends: one level's
    # worth of rows, not a table like ``end`` (which later levels read from any row).
    comm_rows = max((lv.end - lv.compute_end for lv in graph.levels), default=0)
    start = work.empty(f"{tag}start", (comm_rows, *lanes), dtype)
    end = work.empty(f"{tag}end", (n + 1, *lanes), dtype)
    end[n] = 0.0  # the step start
    for lv in graph.levels:
        # plan rows: [begin, mid) compute ops, [mid, wide) local groups, [wide, stop) DP-wide
        begin, mid, _wide, stop = lv.begin, lv.compute_end, lv.local_end, lv.end
        if mid > begin:
            done = end[begin:mid]
            _latest(end, lv.compute_deps, done)
            if delay_RSD is not None:
                done[:, :delayed] += delay_RSD[begin:mid, None]
            done += costs.rows(begin, mid)
        if stop > mid:
            first = start[: stop - mid]  # row r of the level is start[r - mid]
            _latest(end, lv.comm_deps, first)
            if delay_RSD is not None:
                first[:, :delayed] += delay_RSD[mid:stop, None]
        for first_row, last_row, k in lv.local_runs:
            _group_end(start, end, costs, first_row, last_row, k, mid, dp_wide=False)
        for first_row, last_row, k in lv.wide_runs:
            _group_end(start, end, costs, first_row, last_row, k, mid, dp_wide=True)
    return end[graph.final_rows].max(axis=(0, 3))


def _group_end(
    start: np.ndarray,
    end: np.ndarray,
    costs: Costs,
    first: int,
    last: int,
    k: int,
    offset: int,
    *,
    dp_wide: bool,
) -> None:
    """End of communication ops in groups of ``k`` consecutive rows: the group's latest
    start (over DP ranks too when ``dp_wide``) plus each op's transfer duration.
    ``start`` holds the level's communication rows from plan row ``offset`` on."""
    lanes = start.shape[1:]
    members = start[first - offset : last - offset].reshape(-1, k, *lanes)
    ready = members[:, 0]
    for j in range(1, k):  # elementwise maxima: faster than a reduction over a short axis
        ready = np.maximum(ready, members[:, j])
    if dp_wide:
        ready = ready.max(axis=-1, keepdims=True)
    out = end[first:last].reshape(-1, k, *lanes)
    np.add(ready[:, None], costs.rows(first, last).reshape(-1, k, *lanes), out=out)


def _latest(table: np.ndarray, rows_LK: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = max_k table[rows_LK[i, k]]`` (padding repeats a row or points at 0).

    A loop over the few columns of elementwise maxima is much faster than a numpy
    reduction over a short middle axis.
    """
    # ndarray.take, not np.take: the same call without the Python dispatch layer, which
    # cost as much as the gather itself on a step's thousands of small levels
    table.take(rows_LK[:, 0], axis=0, out=out, mode="clip")
    for k in range(1, rows_LK.shape[1]):
        np.maximum(out, table.take(rows_LK[:, k], axis=0, mode="clip"), out=out)
