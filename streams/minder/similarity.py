"""Similarity: how far each machine's window lies from every other machine's.

Machines of one job do the same work, so per metric their windows look alike; a
faulty machine's window drifts away from all the others at once. Per window and
metric: the pairwise RMS distances between the machines' (denoised) windows, each
machine's mean distance to the others (the paper's sum, divided by M - 1), and a
robust z-score of it:

    score_m = (d_m - median(d)) / (1.4826 * MAD(d) + floor)

Median and MAD rather than mean and standard deviation: the faulty machine must not
inflate the spread it is measured against (with a plain z-score one outlier among M
can never score above (M - 1) / sqrt(M)). ``floor`` (in normalised metric units)
keeps a job whose machines all agree closely from turning tiny differences into
large scores: a machine must lie about ``threshold x floor`` farther than the median
machine to be a candidate.

Missing points (NaN: a machine that joined late, left, or has a gap) are never
compared: in each window only the machines with every point present are scored
against each other (the others get NaN), and a window with fewer than
``MIN_MACHINES`` of them scores no one.

Legend: M machines, T grid points, W window length, N windows.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def window_starts(length: int, window: int, stride: int) -> NDArray[np.int64]:
    """Start indices of the full windows of ``window`` points every ``stride`` points."""
    if window <= 0 or stride <= 0:
        raise ValueError("window and stride must be positive")
    if length < window:
        return np.zeros(0, dtype=np.int64)
    return np.arange(0, length - window + 1, stride, dtype=np.int64)


def mean_distances(w_MW: NDArray[np.floating]) -> F64:
    """Each machine's mean RMS distance to the other machines' windows."""
    m, width = w_MW.shape
    if m < 2:
        return np.zeros(m)
    # centred on the machines' mean window: distances are unchanged and the float32
    # Gram-matrix form loses no precision to large common values
    w = np.asarray(w_MW - w_MW.mean(axis=0), dtype=np.float32)
    sq = np.einsum("mw,mw->m", w, w)
    d2 = w @ w.T
    d2 *= -2.0 / width
    d2 += sq[:, None] / width
    d2 += sq[None, :] / width
    np.maximum(d2, 0.0, out=d2)
    np.sqrt(d2, out=d2)
    np.fill_diagonal(d2, 0.0)
    return np.asarray(d2.sum(axis=1, dtype=np.float64) / (m - 1))


def normalised_scores(d_M: F64, floor: float) -> F64:
    med = float(np.median(d_M))
    mad = float(np.median(np.abs(d_M - med)))
    return (d_M - med) / (1.4826 * mad + floor)


MIN_MACHINES = 3
"""Fewer machines than this in a window: no one to tell the odd one out from."""


def covered(x_MT: NDArray[np.floating], starts: NDArray[np.int64], window: int) -> NDArray:
    """(N, M): whether each machine has every point of each window."""
    gaps = np.concatenate([np.zeros((x_MT.shape[0], 1)), np.cumsum(np.isnan(x_MT), axis=1)], axis=1)
    return np.asarray((gaps[:, starts + window] - gaps[:, starts]) == 0).T


def may_have_gaps(x: NDArray[np.floating]) -> bool:
    """False only when no value is NaN: the sum is NaN if any is (or if +inf and -inf
    both occur, which then takes the careful path for nothing). One pass and no
    temporary array, unlike ``np.isnan(x).any()`` (a tenth of a second per detection
    call at 10,000 machines)."""
    return bool(np.isnan(np.sum(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)))


def window_scores(
    x_MT: NDArray[np.floating], starts: NDArray[np.int64], window: int, floor: float
) -> F64:
    """Scores (N, M) of one metric's series over the given windows; NaN for a machine
    not covering a window, and for everyone in a window with too few machines."""
    m = x_MT.shape[0]
    if may_have_gaps(x_MT):
        return _scores_of_covered(x_MT, starts, window, floor)
    if m * m * starts.size <= BATCH_ELEMENTS:
        return _batched_scores(x_MT, starts, window, floor)
    ref = reference_peers(m)
    out = np.empty((starts.size, m))
    for n, s in enumerate(starts):
        w = x_MT[:, s : s + window]
        d = mean_distances(w) if ref is None else mean_distances_to(w, ref)
        out[n] = normalised_scores(d, floor)
    return out


ALL_PEERS_UP_TO = 1024
REFERENCE_PEERS = 128
"""Above ``ALL_PEERS_UP_TO`` machines, each machine's mean distance to the others is
estimated from its distances to ``REFERENCE_PEERS`` of them, spread evenly over the
group (the machines' order carries no meaning): O(M x R) per window instead of
O(M^2). With R = 128 the estimate's error is a few percent of the spread of the
pairwise distances; a faulty machine is far from all of them at once."""


def reference_peers(m: int) -> NDArray[np.int64] | None:
    if m <= ALL_PEERS_UP_TO:
        return None
    return np.unique(np.linspace(0, m - 1, REFERENCE_PEERS).astype(np.int64))


def mean_distances_to(w_MW: NDArray[np.floating], ref_R: NDArray[np.int64]) -> F64:
    """Each machine's mean RMS distance to the reference machines (itself left out).

    All in float32 (the windows are centred first, so nothing large cancels): the
    -2/W factor rides on the small reference matrix rather than on the (M, R) product,
    and the row sums are a matrix-vector product, not a float64 reduction (which numpy
    runs through a slow casting loop); together a third faster at 10,000 machines."""
    width = w_MW.shape[1]
    # centred on the reference machines' mean (any common shift leaves distances
    # unchanged; the mean of 128 rows costs nothing beside that of M strided rows)
    w = np.asarray(w_MW - w_MW[ref_R].mean(axis=0, dtype=np.float32), dtype=np.float32)
    sq = np.einsum("mw,mw->m", w, w) / np.float32(width)
    d2 = w @ (w[ref_R].T * np.float32(-2.0 / width))
    d2 += sq[:, None]
    d2 += sq[ref_R][None, :]
    np.maximum(d2, 0.0, out=d2)
    np.sqrt(d2, out=d2)
    d2[ref_R, np.arange(ref_R.size)] = 0.0
    count = np.full(w.shape[0], float(ref_R.size))
    count[ref_R] -= 1.0
    return np.asarray((d2 @ np.ones(ref_R.size, dtype=np.float32)) / count, dtype=np.float64)


def _scores_of_covered(
    x_MT: NDArray[np.floating], starts: NDArray[np.int64], window: int, floor: float
) -> F64:
    """Window by window, among the machines that cover it (the slow path: gaps)."""
    ok_NM = covered(x_MT, starts, window)
    out = np.full((starts.size, x_MT.shape[0]), np.nan)
    for n, s in enumerate(starts):
        rows = np.flatnonzero(ok_NM[n])
        if rows.size >= MIN_MACHINES:
            w = x_MT[rows, s : s + window]
            ref = reference_peers(rows.size)
            d = mean_distances(w) if ref is None else mean_distances_to(w, ref)
            out[n, rows] = normalised_scores(d, floor)
    return out


BATCH_ELEMENTS = 4_000_000
"""Small groups (ASD's six servers, thousands of windows) are scored all windows at
once; large ones (1,000 machines) window by window, one Gram matrix at a time."""


def _batched_scores(
    x_MT: NDArray[np.floating], starts: NDArray[np.int64], window: int, floor: float
) -> F64:
    """The same arithmetic as :func:`mean_distances` and :func:`normalised_scores`,
    over (N, M, W) at once."""
    m = x_MT.shape[0]
    if m < 2:
        return np.zeros((starts.size, m))
    w = np.asarray(x_MT)[:, starts[:, None] + np.arange(window)].transpose(1, 0, 2)
    w = np.asarray(w - w.mean(axis=1, keepdims=True), dtype=np.float32)
    sq = np.einsum("nmw,nmw->nm", w, w)
    d2 = w @ w.transpose(0, 2, 1)
    d2 *= -2.0 / window
    d2 += sq[:, :, None] / window
    d2 += sq[:, None, :] / window
    np.maximum(d2, 0.0, out=d2)
    np.sqrt(d2, out=d2)
    d2[:, np.arange(m), np.arange(m)] = 0.0
    d = d2.sum(axis=2, dtype=np.float64) / (m - 1)
    med = np.median(d, axis=1, keepdims=True)
    mad = np.median(np.abs(d - med), axis=1, keepdims=True)
    return np.asarray((d - med) / (1.4826 * mad + floor))
