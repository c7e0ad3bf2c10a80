"""Evaluate an op graph for every (step, dp_rank) at once: the generator's event model.

Array legend: N ops of the graph, S steps, D DP ranks; ``x_NSD`` has shape (N, S, D).

The graph is turned once into a topological order over three kinds of nodes: an op's
start (latest end of its dependencies + launch delay), a communication group's ready
time (latest start of its members; across DP ranks for DP collectives and the clip),
and an op's end (its start + duration for compute-like ops, its group's ready time +
transfer for communication ops). The Python loop runs over the N ops of one step; each
node is one numpy operation over the (S, D) plane.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rankwatch.sim.tracegen.graph import ScheduleError, ScheduleGraph


def evaluation_order(graph: ScheduleGraph) -> list[int]:
    """Nodes in dependency order: op i's start is i, its end N + i, group g is 2N + g.

    Raises ScheduleError naming ops on a cycle (a schedule that would deadlock).
    """
    n, n_groups = len(graph), len(graph.groups)
    succ: list[list[int]] = [[] for _ in range(2 * n + n_groups)]
    indegree = [0] * (2 * n + n_groups)

    def edge(a: int, b: int) -> None:
        succ[a].append(b)
        indegree[b] += 1

    for i, deps in enumerate(graph.deps):
        for d in deps:
            edge(n + d, i)
        g = int(graph.group[i])
        edge(i, 2 * n + g if g >= 0 else n + i)
        if g >= 0:
            edge(2 * n + g, n + i)
    ready = deque(v for v, k in enumerate(indegree) if k == 0)
    order: list[int] = []
    while ready:
        v = ready.popleft()
        order.append(v)
        for w in succ[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    if len(order) < len(indegree):
        stuck = [graph.labels[v] for v in range(n) if indegree[v] > 0][:8]
        raise ScheduleError(f"schedule deadlocks; ops waiting forever include {', '.join(stuck)}")
    return order


def simulate(
    graph: ScheduleGraph,
    duration_NSD: np.ndarray,
    delay_NSD: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every op, seconds from the step's start (``start_NSD, end_NSD``).

    ``duration_NSD``: compute time, or transfer time for communication ops.
    ``delay_NSD``: CPU-side gap before each op starts (None = none). Times are shifted
    so that each step's earliest op starts at 0.
    """
    n = len(graph)
    start = np.empty_like(duration_NSD)
    end = np.empty_like(duration_NSD)
    ready = np.empty((len(graph.groups), *duration_NSD.shape[1:]))
    zero = np.zeros(duration_NSD.shape[1:])
    for v in evaluation_order(graph):
        if v < n:
            start[v] = _latest(end, graph.deps[v], zero)
            if delay_NSD is not None:
                start[v] += delay_NSD[v]
        elif v < 2 * n:
            i = v - n
            g = int(graph.group[i])
            end[i] = (start[i] if g < 0 else ready[g]) + duration_NSD[i]
        else:
            g = v - 2 * n
            ready[g] = _latest(start, graph.groups[g], zero)
            if graph.group_across_dp[g]:
                ready[g] = ready[g].max(axis=-1, keepdims=True)
    origin_S = start.min(axis=(0, 2))
    return start - origin_S[None, :, None], end - origin_S[None, :, None]


def _latest(times_NSD: np.ndarray, ops: tuple[int, ...], zero: np.ndarray) -> np.ndarray:
    if not ops:
        return zero.copy()
    if len(ops) == 1:
        return times_NSD[ops[0]].copy()
    return times_NSD[list(ops)].max(axis=0)
