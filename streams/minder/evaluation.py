"""Scoring a detector against labelled points: per server and time window.

The unit is (server, window): a window is faulty for a server when any of its points
is labelled; a detector is right when it reports that server in that window.
Precision, recall and F1 count these units. Detection delay is taken per labelled
segment (a run of labelled points of one server): the points from the segment's
first point to the end of the first reporting window that overlaps it (0 when a
window reports it as soon as it starts); segments never reported count as misses in
``segment_recall`` and are left out of the mean delay.

Where a server has no sample (``present_MT`` false: it joined late, left, or had a
gap) the detector cannot see it, so the (server, window) units that are not fully
present are not scored either way.

Legend: M machines (servers), T points, N windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Bool = NDArray[np.bool_]


def window_labels(label_MT: NDArray[np.integer], starts: NDArray[np.int64], window: int) -> Bool:
    """(N, M): whether each server has a labelled point in each window."""
    c = np.concatenate([np.zeros((label_MT.shape[0], 1)), np.cumsum(label_MT > 0, axis=1)], axis=1)
    return np.asarray((c[:, starts + window] - c[:, starts]) > 0).T


def window_present(present_MT: NDArray[np.bool_], starts: NDArray[np.int64], window: int) -> Bool:
    """(N, M): whether each server has every point of each window."""
    gaps = np.concatenate(
        [np.zeros((present_MT.shape[0], 1)), np.cumsum(~present_MT, axis=1)], axis=1
    )
    return np.asarray((gaps[:, starts + window] - gaps[:, starts]) == 0).T


def segments(label_T: NDArray[np.integer]) -> list[tuple[int, int]]:
    """Inclusive (first, last) index of each run of labelled points."""
    x = np.concatenate([[0], (np.asarray(label_T) > 0).astype(np.int8), [0]])
    d = np.diff(x)
    return list(
        zip(np.flatnonzero(d == 1).tolist(), (np.flatnonzero(d == -1) - 1).tolist(), strict=True)
    )


@dataclass(frozen=True)
class Scores:
    precision: float
    recall: float
    f1: float
    mean_delay_points: float | None
    true_positives: int
    false_positives: int
    false_negatives: int
    segments: int
    segments_detected: int

    @property
    def segment_recall(self) -> float:
        return self.segments_detected / self.segments if self.segments else 0.0

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
            "mean_delay_points": (
                None if self.mean_delay_points is None else round(self.mean_delay_points, 2)
            ),
            "true_positives": self.true_positives,
            "false_positives": self.false_positives,
            "false_negatives": self.false_negatives,
            "segments": self.segments,
            "segments_detected": self.segments_detected,
            "segment_recall": round(self.segment_recall, 4),
        }


def delays(
    pred_NM: Bool, label_MT: NDArray[np.integer], starts: NDArray[np.int64], window: int
) -> tuple[list[int], int]:
    """Delay of each detected segment, and the number of segments."""
    ends = starts + window - 1
    found: list[int] = []
    total = 0
    for m in range(label_MT.shape[0]):
        for first, last in segments(label_MT[m]):
            total += 1
            overlap = (starts <= last) & (ends >= first) & pred_NM[:, m]
            if overlap.any():
                found.append(max(int(ends[np.argmax(overlap)]) - first, 0))
    return found, total


def score(
    pred_NM: Bool,
    label_MT: NDArray[np.integer],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64] | None = None,
    present_MT: NDArray[np.bool_] | None = None,
) -> Scores:
    """Score predictions of all servers, or only of the ``servers`` given (held out);
    with ``present_MT``, only the units a server fully covers."""
    truth = window_labels(label_MT, starts, window)
    cols = np.arange(label_MT.shape[0]) if servers is None else servers
    p, t = pred_NM[:, cols], truth[:, cols]
    if present_MT is not None:
        seen = window_present(present_MT, starts, window)[:, cols]
        p, t = p & seen, t & seen
    tp, fp, fn = int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum())
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    found, total = delays(p, label_MT[cols], starts, window)
    delay = float(np.mean(found)) if found else None
    return Scores(prec, rec, f1, delay, tp, fp, fn, total, len(found))
