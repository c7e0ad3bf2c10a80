"""Metric priority: which metric tells a faulty machine apart best, learnt from labels.

Per labelled window and metric, the feature is the largest |Z-score| of any machine
against the others (at any point of the window): a metric in which a faulty machine
sticks out has large values on faulty windows and small ones on normal windows. A
small decision tree (CART, Gini impurity) is fitted on these features; metrics are
ranked by the impurity decrease they bring (the tree's feature importance), ties and
metrics the tree never used ranked by their best single split. The detector then
tries metrics in that order and stops at the first that detects.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def max_z_features(
    x_MTK: NDArray[np.floating], starts: NDArray[np.int64], window: int, eps: float = 1e-3
) -> F64:
    """(N, K): per window and metric, the largest |Z| of a machine against all machines
    (at each point, among the machines with a sample there; 0 where none stands out)."""
    x = np.asarray(x_MTK, dtype=np.float64)
    have = ~np.isnan(x)
    count = have.sum(axis=0)
    safe = np.maximum(count, 1)
    mean = np.where(have, x, 0.0).sum(axis=0) / safe
    var = np.where(have, (x - mean) ** 2, 0.0).sum(axis=0) / safe
    z = np.where(have, np.abs(x - mean), 0.0) / (np.sqrt(var) + eps)
    zmax_TK = z.max(axis=0)
    out = np.empty((starts.size, x.shape[2]))
    for n, s in enumerate(starts):
        out[n] = zmax_TK[s : s + window].max(axis=0)
    return out


def _gini(pos: F64, total: F64) -> F64:
    p = np.divide(pos, total, out=np.zeros_like(pos), where=total > 0)
    return 2.0 * p * (1.0 - p)


def best_split(f_S: F64, y_S: NDArray[np.bool_]) -> tuple[float, float]:
    """(impurity decrease x samples, threshold) of the best split of one feature."""
    order = np.argsort(f_S, kind="stable")
    f, y = f_S[order], y_S[order].astype(np.float64)
    n = f.size
    if n < 2:
        return 0.0, float("nan")
    pos_left = np.cumsum(y)[:-1]
    n_left = np.arange(1, n, dtype=np.float64)
    n_right = n - n_left
    pos_right = y.sum() - pos_left
    parent = _gini(np.array([y.sum()]), np.array([float(n)]))[0] * n
    child = _gini(pos_left, n_left) * n_left + _gini(pos_right, n_right) * n_right
    valid = f[1:] > f[:-1]
    if not valid.any():
        return 0.0, float("nan")
    gain = np.where(valid, parent - child, -np.inf)
    i = int(np.argmax(gain))
    return float(gain[i]), float((f[i] + f[i + 1]) / 2)


@dataclass(frozen=True)
class TreeImportance:
    importance_K: F64
    """Impurity decrease each metric brought in the fitted tree (sums to 1 when any)."""
    stump_gain_K: F64
    """Each metric's best single split on all samples (tie-breaker)."""


def tree_importance(
    f_NK: F64, y_N: NDArray[np.bool_], depth: int = 3, min_leaf: int = 5
) -> TreeImportance:
    """Fit a CART tree of the given depth on (N, K) features and return importances."""
    k = f_NK.shape[1]
    importance = np.zeros(k)
    stump = np.array([best_split(f_NK[:, j], y_N)[0] for j in range(k)])
    stack: list[tuple[NDArray[np.int64], int]] = [(np.arange(f_NK.shape[0]), 0)]
    while stack:
        idx, level = stack.pop()
        y = y_N[idx]
        if level >= depth or idx.size < 2 * min_leaf or y.all() or not y.any():
            continue
        splits = [best_split(f_NK[idx, j], y) for j in range(k)]
        j = int(np.argmax([g for g, _ in splits]))
        gain, thr = splits[j]
        if gain <= 0 or np.isnan(thr):
            continue
        left = idx[f_NK[idx, j] <= thr]
        right = idx[f_NK[idx, j] > thr]
        if left.size < min_leaf or right.size < min_leaf:
            continue
        importance[j] += gain
        stack.extend([(left, level + 1), (right, level + 1)])
    total = importance.sum()
    if total > 0:
        importance = importance / total
    return TreeImportance(importance, stump)


def rank_metrics(f_NK: F64, y_N: NDArray[np.bool_], depth: int = 3) -> NDArray[np.int64]:
    """Metric indices, most telling first."""
    imp = tree_importance(f_NK, y_N, depth=depth)
    return np.lexsort((-imp.stump_gain_K, -imp.importance_K)).astype(np.int64)
