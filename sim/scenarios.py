"""Scenarios: which ops keep their real cost and which get the ideal one.

Every analysis is the same simulation with a different choice per op (and DP rank):
real (recorded) cost or ideal cost. A scenario set is a cost function over lanes
``(X scenarios, S steps, D dp ranks)`` for :func:`rankwatch.sim.simulate.simulate`.

Legend: N ops, S steps, D DP ranks, X scenarios, L ops of one level.
"""

from __future__ import annotations

import numpy as np


class NodeMasked:
    """Scenario x keeps the real cost of op n where ``real_NX[n, x]``, else the ideal.

    ``real_NX`` may also be ``(N, X, D)`` to choose per DP rank (workers).
    """

    def __init__(self, cost_NSD: np.ndarray, ideal_N: np.ndarray, real_NX: np.ndarray) -> None:
        self.cost_NSD = cost_NSD
        self.ideal = ideal_N[:, None, None, None]
        self.mask = real_NX[:, :, None, None] if real_NX.ndim == 2 else real_NX[:, :, None, :]

    def lanes(self) -> tuple[int, int, int]:
        _, s, d = self.cost_NSD.shape
        return (self.mask.shape[1], s, d)

    def __call__(self, nodes: np.ndarray) -> np.ndarray:
        return np.where(self.mask[nodes], self.cost_NSD[nodes][:, None], self.ideal[nodes])


class OneRankReal:
    """Scenario x: DP rank x keeps its real costs, every other rank is ideal.

    The other ranks then all run the same ideal ops, so one lane stands for all of
    them: lanes are ``(X = D, S, 2)`` (rank x, the others) instead of ``(D, S, D)``.
    With a single DP rank there are no others and the lanes are ``(1, S, 1)``.
    """

    def __init__(self, cost_NSD: np.ndarray, ideal_N: np.ndarray) -> None:
        self.cost_NDS = cost_NSD.transpose(0, 2, 1)
        self.ideal = ideal_N
        self.width = 2 if cost_NSD.shape[2] > 1 else 1

    def lanes(self) -> tuple[int, int, int]:
        _n, d, s = self.cost_NDS.shape
        return (d, s, self.width)

    def __call__(self, nodes: np.ndarray) -> np.ndarray:
        real = self.cost_NDS[nodes]
        if self.width == 1:
            return real[..., None]
        ideal = np.broadcast_to(self.ideal[nodes][:, None, None], real.shape)
        return np.stack([real, ideal], axis=-1)
