"""Baseline: Mahalanobis-distance outlier detection on the same raw windows.

Each machine's window is summarised by its per-metric mean (no denoising, no
comparison between machines, no continuity); the distance of that vector to the
distribution of normal windows (mean and covariance, shrunk toward the diagonal so
that a short or collinear history still gives an invertible matrix) is the score.

Legend: M machines, T grid points, K metrics, N windows, S reference samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Reference:
    mean_K: F64
    precision_KK: F64
    """Inverse of the shrunk covariance."""


def window_means(x_MTK: NDArray[np.floating], starts: NDArray[np.int64], window: int) -> F64:
    """(N, M, K): each machine's per-metric mean over each window; NaN where the machine
    misses a point of the window (it is not scored there)."""
    x = np.asarray(x_MTK, dtype=np.float64)
    zeros = np.zeros((x.shape[0], 1, x.shape[2]))
    c = np.concatenate([zeros, np.cumsum(np.nan_to_num(x, nan=0.0), axis=1)], axis=1)
    gaps = np.concatenate([zeros, np.cumsum(np.isnan(x), axis=1)], axis=1)
    means = (c[:, starts + window] - c[:, starts]) / window
    means[(gaps[:, starts + window] - gaps[:, starts]) > 0] = np.nan
    return np.asarray(means).transpose(1, 0, 2)


def fit_reference(samples_SK: F64, shrinkage: float = 0.1, floor: float = 0.0) -> Reference:
    """Mean and shrunk precision of the reference rows (rows with a NaN are left out).

    ``floor`` is the smallest spread a metric is given: a metric that never moved in
    the reference (one machine's own history, often) would otherwise weigh 1e9 and
    turn any later change of it, however small, into a score of thousands."""
    samples_SK = samples_SK[~np.isnan(samples_SK).any(axis=1)]
    mean = samples_SK.mean(axis=0)
    cov = np.atleast_2d(np.cov(samples_SK, rowvar=False))
    target = np.diag(np.diag(cov)) + 1e-9 * np.eye(cov.shape[0])
    shrunk = (1.0 - shrinkage) * cov + shrinkage * target
    shrunk += np.diag(np.maximum(floor**2 - np.diag(shrunk), 0.0))
    return Reference(mean, np.asarray(np.linalg.pinv(shrunk), dtype=np.float64))


def mahalanobis(features_XK: F64, ref: Reference) -> F64:
    """Distance of each row (any leading shape) to the reference distribution."""
    d = features_XK - ref.mean_K
    q = np.einsum("...k,kl,...l->...", d, ref.precision_KK, d)
    return np.sqrt(np.maximum(q, 0.0))
