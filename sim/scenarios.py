"""Scenarios: which ops keep their real cost and which get the ideal one.

Every analysis is the same simulation with a different choice per op and lane:
real (recorded) cost or ideal cost. A scenario set is a :class:`Costs`: a few
candidate cost blocks per op (real, ideal, ...) and, per plan row and scenario, the
block to use. The simulator gathers a level's blocks when it needs them, so the full
``(R, X, S, D)`` cost table never exists (it would be the largest array of a pass).

Legend: N ops (graph order), R plan rows, S steps, D DP ranks, X scenarios,
F = S * D' values of one block (D' = the lanes' last axis), C candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
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
        picked = self.blocks_BF.take(self.pick_RX[begin:end], axis=0, mode="clip")
        return picked.reshape(end - begin, *self.lanes)

    def scenarios(self, which: slice) -> Costs:
        """The same costs on scenarios ``which`` only (the blocks are shared, not copied)."""
        pick = np.ascontiguousarray(self.pick_RX[:, which])
        return Costs(blocks_BF=self.blocks_BF, pick_RX=pick, lanes=(pick.shape[1], *self.lanes[1:]))


def choose(
    graph: OpGraph,
    candidates: Sequence[np.ndarray],
    pick_NX: np.ndarray,
    dtype: type = np.float32,
) -> Costs:
    """Scenario x gives op n the cost ``candidates[pick_NX[n, x]][n]``.

    A candidate is ``(N, S, D)`` (a cost per step and rank), ``(N, S)`` (one per op and
    step: an ideal cost of each step's own window) or ``(N,)`` (one per op).
    """
    rows = graph.plan_nodes
    r = rows.size
    s, d = next(c.shape[1:] for c in candidates if c.ndim == 3)
    blocks = np.empty((len(candidates) * r, s * d), dtype=dtype)
    for k, cand in enumerate(candidates):
        block = blocks[k * r : (k + 1) * r]
        if cand.ndim == 3:  # cast, then gather straight into the block: one temporary
            values: np.ndarray = np.ascontiguousarray(cand, dtype=dtype).reshape(
                cand.shape[0], s * d
            )
            values.take(rows, axis=0, out=block, mode="clip")
        elif cand.ndim == 2:
            block.reshape(r, s, d)[:] = cand[rows][:, :, None]
        else:
            block[:] = cand[rows][:, None]
    pick = pick_NX[rows] * r + np.arange(r)[:, None]
    return Costs(blocks_BF=blocks, pick_RX=pick, lanes=(pick_NX.shape[1], s, d))


def masked_costs(
    graph: OpGraph, cost_NSD: np.ndarray, ideal: np.ndarray, real_NX: np.ndarray
) -> Costs:
    """Scenario x keeps the real cost of op n where ``real_NX[n, x]``, else the ideal
    (``ideal``: per op ``(N,)``, or per op and step ``(N, S)``)."""
    return choose(graph, (cost_NSD, ideal), (~real_NX).astype(np.int64))


def one_rank_real(
    graph: OpGraph, cost_NSD: np.ndarray, ideal: np.ndarray, dtype: type = np.float32
) -> Costs:
    """Scenario x: DP rank x keeps its real costs, every other rank is ideal.

    The other ranks then all run the same ideal ops, so one lane stands for all of
    them: lanes are ``(X = D, S, 2)`` (rank x, the others) instead of ``(D, S, D)``.
    With a single DP rank there are no others and the lanes are ``(1, S, 1)``.
    ``ideal``: per op ``(N,)``, or per op and step ``(N, S)``.
    """
    rows = graph.plan_nodes
    r, s, d = cost_NSD.shape
    width = 1 if d == 1 else 2
    blocks: np.ndarray = np.empty(
        (r, d, s, width), dtype=dtype
    )  # (R, D, S, lane): rank x, the others
    real = np.asarray(cost_NSD, dtype=dtype)[rows]  # (R, S, D)
    blocks[..., 0] = real.transpose(0, 2, 1)
    del real
    if width == 2:
        ideal_RS = _per_step(ideal, s)[rows].astype(dtype)
        blocks[..., 1] = ideal_RS[:, None, :]
    pick = np.arange(r * d).reshape(r, d)
    return Costs(blocks_BF=blocks.reshape(r * d, s * width), pick_RX=pick, lanes=(d, s, width))


def recorded_costs(
    graph: OpGraph,
    exact_NSD: np.ndarray,
    clamped_NSD: np.ndarray,
    ideal: np.ndarray,
    fixed_SPD: np.ndarray,
) -> Costs:
    """Four float64 scenarios of recorded costs: as measured (the replay, which must
    hit the recorded times), clamped at 0 (T), and T with fixes: the workers ideal
    where ``fixed_SPD[step, stage, dp_rank]`` (M_W), the last stage ideal (M_S).
    ``ideal``: per op ``(N,)``, or per op and step ``(N, S)``."""
    fix_NSD = fixed_SPD[:, graph.stage].transpose(1, 0, 2)
    ideal_NSD = _per_step(ideal, exact_NSD.shape[1])[:, :, None]
    with_workers = np.where(fix_NSD, ideal_NSD, clamped_NSD)
    pick = np.empty((graph.size, 4), dtype=np.int64)
    pick[:] = (0, 1, 3, 1)
    pick[graph.stage == graph.pp_size - 1, 3] = 2
    candidates = (exact_NSD, clamped_NSD, ideal, with_workers)
    return choose(graph, candidates, pick, dtype=np.float64)


def _per_step(ideal: np.ndarray, steps: int) -> np.ndarray:
    """An ideal cost per op ``(N,)`` or per op and step ``(N, S)`` as ``(N, S)``."""
    return ideal if ideal.ndim == 2 else np.broadcast_to(ideal[:, None], (ideal.size, steps))
