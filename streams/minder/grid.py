"""Alignment of per-machine samples to one time grid, gap filling, min-max normalisation.

Machines sample on their own clocks, miss a sample now and then, join late and leave
early; Minder compares machines point by point, so every machine's series is first put
on a common grid of timestamps (never matched by row number). :func:`align_on_times`
gives a grid point the machine's last sample at or before it, if that sample is
recent enough (``max_age``); otherwise the point is missing (NaN): before the
machine's first sample, after it fell silent, inside a long gap. Missing points are
never invented; the detector leaves a machine out of every window it does not cover
(``docs/minder.md``, "Unequal and gappy series").

Legend: M machines, T grid points, K metrics, S samples of one machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def align_to_grid(
    times: Sequence[NDArray[np.int64]], values: Sequence[F64], grid: NDArray[np.int64]
) -> F64:
    """Per machine ``times[m]`` (S, sorted) and ``values[m]`` (S, K) onto ``grid`` (T).

    Returns x_MTK. A machine with no sample at all gets NaN (the caller drops it).
    """
    if len(times) != len(values):
        raise ValueError("times and values must have one entry per machine")
    k = values[0].shape[1] if values else 0
    out = np.full((len(times), grid.size, k), np.nan)
    for m, (t, v) in enumerate(zip(times, values, strict=True)):
        if t.size == 0:
            continue
        idx = np.searchsorted(t, grid, side="right") - 1
        out[m] = v[np.clip(idx, 0, None)]
    return out


def align_on_times(
    times: Sequence[NDArray[np.int64]],
    values: Sequence[F64],
    grid: NDArray[np.int64],
    max_age: int,
) -> F64:
    """Per machine ``times[m]`` (S, sorted) and ``values[m]`` (S, K) onto ``grid`` (T):
    the last sample at or before each point, NaN where it is older than ``max_age`` or
    there is none. Returns x_MTK."""
    if len(times) != len(values):
        raise ValueError("times and values must have one entry per machine")
    k = values[0].shape[1] if values else 0
    out = np.full((len(times), grid.size, k), np.nan)
    for m, (t, v) in enumerate(zip(times, values, strict=True)):
        if t.size == 0:
            continue
        idx = np.searchsorted(t, grid, side="right") - 1
        fresh = (idx >= 0) & (grid - t[np.clip(idx, 0, None)] <= max_age)
        out[m, fresh] = v[idx[fresh]]
    return out


def fill_gaps(x_MTK: F64) -> F64:
    """Forward-fill NaNs along time, then back-fill a leading gap; all-NaN series become 0."""
    x = np.array(x_MTK, dtype=np.float64, copy=True)
    m, t, k = x.shape
    flat = x.transpose(0, 2, 1).reshape(m * k, t)
    valid = ~np.isnan(flat)
    idx = np.where(valid, np.arange(t), 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    filled = flat[np.arange(m * k)[:, None], idx]
    first = np.where(valid.any(axis=1), valid.argmax(axis=1), 0)
    lead = np.arange(t)[None, :] < first[:, None]
    filled = np.where(lead, flat[np.arange(m * k), first][:, None], filled)
    filled = np.nan_to_num(filled, nan=0.0)
    return filled.reshape(m, k, t).transpose(0, 2, 1).copy()


def bounds_of(x_MTK: F64) -> tuple[F64, F64]:
    """Per-metric (low, high) over all machines and times: the bounds to normalise by."""
    return np.nanmin(x_MTK, axis=(0, 1)), np.nanmax(x_MTK, axis=(0, 1))


def normalise(x_MTK: F64, low: F64, high: F64) -> F64:
    """Min-max per metric into [0, 1] by the given bounds; a constant metric maps to 0."""
    span = np.asarray(high, dtype=np.float64) - np.asarray(low, dtype=np.float64)
    safe = np.where(span > 0, span, 1.0)
    out = (x_MTK - low) / safe
    out = np.where(span > 0, out, 0.0)
    return np.clip(out, 0.0, 1.0)
