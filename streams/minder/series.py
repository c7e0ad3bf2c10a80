"""Servers' recorded splits on one timeline: unequal lengths, gaps, late joiners, leavers.

A labelled group (one ``*.npz`` per server, ``docs/minder.md``) gives per server a
train and a test split, each a series of samples, optionally with timestamps. Servers
are compared at equal *times*, never at equal row numbers: a server whose train split
is shorter than the others' did not start earlier, it joined later.

Without timestamps, a split's rows are taken as consecutive samples and the splits
are placed around the boundary between them: the test split starts at time 0 on
every server and the train split ends just before it (row ``i`` of a train split of
``n`` rows is at time ``i - n``). So a short train split is a server that joined late,
a short test split one that left early. Timestamps, where a file has them, replace
this; they may have holes. A row of NaN is a missing sample.

Each split is put on a grid spanning every server's samples of that split
(:func:`rankwatch.streams.minder.grid.align_on_times`); a gap of up to ``max_gap``
grid steps between two samples repeats the earlier one, a longer one stays missing
(NaN), as do the points before a server's first sample and after its last.

Legend: M servers, T grid points, K metrics, S samples of one server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.grid import align_on_times

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class Split:
    """One server's samples of one split."""

    times: I64
    """(S,) sample times, increasing, in grid steps or any unit shared by the group."""
    values: F64
    """(S, K); a row of NaN is a missing sample."""
    labels: NDArray[np.uint8] | None = None
    """(S,) 1 where the sample is anomalous (test splits)."""


def implied_times(rows: int, split: str) -> I64:
    """Times of a split without timestamps: test rows from 0, train rows up to -1."""
    if split == "test":
        return np.arange(rows, dtype=np.int64)
    if split == "train":
        return np.arange(-rows, 0, dtype=np.int64)
    raise ValueError(f"unknown split {split!r}")


def make_split(
    values: NDArray[np.floating],
    split: str,
    times: NDArray[np.integer] | None = None,
    labels: NDArray[np.integer] | None = None,
) -> Split:
    """A :class:`Split` from a file's arrays, with a clear error for inconsistent ones."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"{split}: expected a [rows, metrics] array, got shape {v.shape}")
    t = implied_times(v.shape[0], split) if times is None else np.asarray(times, dtype=np.int64)
    if t.shape != (v.shape[0],):
        raise ValueError(f"{split}: {t.size} timestamps for {v.shape[0]} rows")
    if t.size > 1 and not (np.diff(t) > 0).all():
        raise ValueError(f"{split}: timestamps must increase")
    lab = None
    if labels is not None:
        lab = np.asarray(labels).astype(np.uint8)
        if lab.shape != (v.shape[0],):
            raise ValueError(f"{split}: {lab.size} labels for {v.shape[0]} rows")
    return Split(t, v, lab)


def grid_step(splits: Sequence[Split]) -> int:
    """The sampling step: the most common difference between consecutive timestamps."""
    diffs = np.concatenate(
        [np.diff(s.times) for s in splits if s.times.size > 1] or [np.ones(1, dtype=np.int64)]
    )
    values, counts = np.unique(diffs, return_counts=True)
    return int(values[np.argmax(counts)])


def common_grid(splits: Sequence[Split], step: int) -> I64:
    """Grid points from the earliest to the latest sample of any server, every ``step``."""
    present = [s.times for s in splits if s.times.size]
    if not present:
        return np.zeros(0, dtype=np.int64)
    first = min(int(t[0]) for t in present)
    last = max(int(t[-1]) for t in present)
    return np.arange(first, last + 1, step, dtype=np.int64)


def align_splits(
    splits: Sequence[Split], grid: I64, step: int, max_gap: int
) -> tuple[F64, NDArray[np.uint8]]:
    """x_MTK on ``grid`` (NaN where a server has no sample) and label_MT (0 there)."""
    kept = [~np.isnan(s.values).all(axis=1) for s in splits]
    times = [s.times[k] for s, k in zip(splits, kept, strict=True)]
    max_age = max_gap * step
    x = align_on_times(
        times, [s.values[k] for s, k in zip(splits, kept, strict=True)], grid, max_age
    )
    labels = [
        np.zeros(int(k.sum())) if s.labels is None else s.labels[k].astype(np.float64)
        for s, k in zip(splits, kept, strict=True)
    ]
    lab = align_on_times(times, [v[:, None] for v in labels], grid, max_age)[:, :, 0]
    for m, t in enumerate(times):  # nothing after a server's last sample
        after = grid > t[-1] if t.size else np.ones(grid.size, dtype=bool)
        x[m, after] = np.nan
        lab[m, after] = 0
    return x, np.nan_to_num(lab, nan=0.0).astype(np.uint8)
