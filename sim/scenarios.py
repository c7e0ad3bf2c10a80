"""Scenarios: which ops keep their real cost and which get the ideal one.

Every analysis is the same simulation with a different choice per op and lane:
real (recorded) cost or ideal cost. A scenario set is a :class:`Costs`: a few
candidate cost blocks per op (real, ideal, ...) and, per plan row and scenario, the
block to use. The simulator gathers a level's blocks when it needs them, so the full
``(R, X, S, D)`` cost table never exists (it would be the largest array of a pass).

Legend: N ops (graph order), R plan rows, S steps, D DP ranks, X scenarios,
F = S * D' values of one block (D' = the lanes' last axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.sim.graph import OpGraph


@dataclass(frozen=True)
class Costs:
    """Cost of plan row r on scenario x: ``blocks_BF[pick_RX[r, x]]`` shaped ``lanes[1:]``."""

    blocks_BF: np.ndarray
    pick_RX: np.ndarray
    lanes: tuple[int, int, int]  # (X, S, D')

    def rows(self, begin: int, end: int) -> np.ndarray:
        """Costs of plan rows ``begin:end`` on every lane: ``(L, X, S, D')``."""
        picked = np.take(self.blocks_BF, self.pick_RX[begin:end], axis=0)
        return picked.reshape(end - begin, *self.lanes)


def masked_costs(
    graph: OpGraph,
    cost_NSD: np.ndarray,
    ideal_N: np.ndarray,
    real_NX: np.ndarray,
    dtype: type = np.float32,
) -> Costs:
    """Scenario x keeps the real cost of op n where ``real_NX[n, x]``, else the ideal."""
    rows = graph.plan_nodes
    r, s, d = cost_NSD.shape
    blocks = np.empty((2 * r, s * d), dtype=dtype)
    blocks[:r] = cost_NSD[rows].reshape(r, s * d)
    blocks[r:] = ideal_N[rows][:, None]
    pick = np.arange(r)[:, None] + r * (~real_NX[rows]).astype(np.int64)
    return Costs(blocks_BF=blocks, pick_RX=pick, lanes=(real_NX.shape[1], s, d))


def one_rank_real(
    graph: OpGraph, cost_NSD: np.ndarray, ideal_N: np.ndarray, dtype: type = np.float32
) -> Costs:
    """Scenario x: DP rank x keeps its real costs, every other rank is ideal.

    The other ranks then all run the same ideal ops, so one lane stands for all of
    them: lanes are ``(X = D, S, 2)`` (rank x, the others) instead of ``(D, S, D)``.
    With a single DP rank there are no others and the lanes are ``(1, S, 1)``.
    """
    rows = graph.plan_nodes
    r, s, d = cost_NSD.shape
    real = cost_NSD[rows].astype(dtype).transpose(0, 2, 1)[..., None]  # (R, D, S, 1)
    width = 1 if d == 1 else 2
    if width == 2:
        ideal = np.broadcast_to(ideal_N[rows].astype(dtype)[:, None, None, None], real.shape)
        real = np.concatenate([real, ideal], axis=-1)
    pick = np.arange(r * d).reshape(r, d)
    return Costs(blocks_BF=real.reshape(r * d, s * width), pick_RX=pick, lanes=(d, s, width))


def recorded_costs(
    graph: OpGraph,
    exact_NSD: np.ndarray,
    clamped_NSD: np.ndarray,
    ideal_N: np.ndarray,
    fixed_NXD: np.ndarray,
) -> Costs:
    """Float64 scenarios of recorded costs: as measured (the replay), clamped at 0 (T),
    then clamped with the ideal where ``fixed_NXD[n, x, d]`` (what fixing a group gives).
    """
    rows = graph.plan_nodes
    r, s, d = exact_NSD.shape
    x = 2 + fixed_NXD.shape[1]
    table = np.empty((r, x, s, d))
    table[:, 0] = exact_NSD[rows]
    table[:, 1] = clamped_NSD[rows]
    ideal = ideal_N[rows][:, None, None, None]
    table[:, 2:] = np.where(fixed_NXD[rows][:, :, None, :], ideal, clamped_NSD[rows][:, None])
    pick = np.arange(r * x).reshape(r, x)
    return Costs(blocks_BF=table.reshape(r * x, s * d), pick_RX=pick, lanes=(x, s, d))
