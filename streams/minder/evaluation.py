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

import warnings
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


def segment_outcomes(
    pred_NM: Bool,
    label_MT: NDArray[np.integer],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64],
) -> list[tuple[int, int, int, int | None]]:
    """Per labelled segment of the given servers: (server, first, last, delay), the
    delay in points as in :func:`delays`, None where no reporting window overlaps it."""
    ends = starts + window - 1
    out: list[tuple[int, int, int, int | None]] = []
    for m in servers.tolist():
        for first, last in segments(label_MT[m]):
            overlap = (starts <= last) & (ends >= first) & pred_NM[:, m]
            delay = max(int(ends[np.argmax(overlap)]) - first, 0) if overlap.any() else None
            out.append((m, first, last, delay))
    return out


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


def alarm_episodes(pred_N: Bool) -> list[tuple[int, int]]:
    """Inclusive (first, last) window index of each run of consecutive reported windows:
    one alarm, as an operator would see it."""
    return segments(np.asarray(pred_N, dtype=np.uint8))


@dataclass(frozen=True)
class EventScores:
    """What an operator sees: labelled segments found and how fast, alarms that matched
    nothing, and the point-level precision/recall/F1 beside them."""

    segments: int
    detected: int
    delays_points: tuple[int, ...]
    """Per detected segment, points from its first point to the end of the first window
    that reported it."""
    false_alarms: int
    """Alarm episodes whose windows hold no labelled point of that server."""
    machine_days: float
    point_precision: float
    point_recall: float
    point_f1: float

    def to_json(self, minutes_per_point: float) -> dict[str, float | int | None]:
        d = np.array(self.delays_points, dtype=np.float64) * minutes_per_point
        return {
            "segments": self.segments,
            "segments_detected": self.detected,
            "detect_minutes_median": round(float(np.median(d)), 1) if d.size else None,
            "detect_minutes_mean": round(float(d.mean()), 1) if d.size else None,
            "false_alarms": self.false_alarms,
            "machine_days": round(self.machine_days, 2),
            "false_alarms_per_machine_day": round(self.false_alarms / self.machine_days, 3)
            if self.machine_days
            else None,
            "point_precision": round(self.point_precision, 4),
            "point_recall": round(self.point_recall, 4),
            "point_f1": round(self.point_f1, 4),
        }


def event_scores(
    pred_NM: Bool,
    label_MT: NDArray[np.integer],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64],
    present_MT: NDArray[np.bool_],
    points_per_day: float,
) -> EventScores:
    """Event-level and point-level scores of the given servers only."""
    found, total = delays(pred_NM[:, servers], label_MT[servers], starts, window)
    false_alarms = 0
    point_pred = np.zeros((servers.size, label_MT.shape[1]), dtype=bool)
    for i, m in enumerate(servers):
        for first, last in alarm_episodes(pred_NM[:, m]):
            lo, hi = int(starts[first]), int(starts[last]) + window
            false_alarms += not label_MT[m, lo:hi].any()
        for n in np.flatnonzero(pred_NM[:, m]):
            point_pred[i, starts[n] : starts[n] + window] = True
    seen = present_MT[servers]
    truth = (label_MT[servers] > 0) & seen
    point_pred &= seen
    tp = int((point_pred & truth).sum())
    prec = tp / int(point_pred.sum()) if point_pred.any() else 0.0
    rec = tp / int(truth.sum()) if truth.any() else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    days = float(seen.sum()) / points_per_day
    return EventScores(total, len(found), tuple(found), false_alarms, days, prec, rec, f1)


@dataclass(frozen=True)
class DayBlocks:
    """One detector's outcomes cut into (server, day) blocks, the unit of the bootstrap
    (:func:`compare`): per labelled segment its block (where it starts) and delay in
    points (-1: missed); per block its false alarms (where the episode starts) and
    observed machine-days."""

    segment_block: NDArray[np.int64]
    segment_delay: NDArray[np.int64]
    block_false_alarms: NDArray[np.int64]
    block_days: NDArray[np.float64]
    block_windows: NDArray[np.int64] | None = None
    """(blocks, 3): per block the window units' true positives, false positives and
    false negatives (a window in the block where it starts), for the window F1."""


def day_blocks(
    pred_NM: Bool,
    label_MT: NDArray[np.integer],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64],
    present_MT: NDArray[np.bool_],
    points_per_day: float,
) -> DayBlocks:
    """The outcomes of :func:`event_scores`, per (server, day) block of the given servers."""
    per_server = max(int(np.ceil(label_MT.shape[1] / points_per_day)), 1)
    blocks = servers.size * per_server

    def block(i: int, point: int) -> int:
        return i * per_server + min(int(point // points_per_day), per_server - 1)

    seg_block, seg_delay = [], []
    false_alarms = np.zeros(blocks, dtype=np.int64)
    days = np.zeros(blocks)
    for m, first, _, delay in segment_outcomes(pred_NM, label_MT, starts, window, servers):
        seg_block.append(block(int(np.flatnonzero(servers == m)[0]), first))
        seg_delay.append(-1 if delay is None else delay)
    for i, m in enumerate(servers.tolist()):
        for first, last in alarm_episodes(pred_NM[:, m]):
            lo, hi = int(starts[first]), int(starts[last]) + window
            if not label_MT[m, lo:hi].any():
                false_alarms[block(i, lo)] += 1
        seen = np.flatnonzero(present_MT[m])
        np.add.at(days, [block(i, int(p)) for p in seen], 1.0 / points_per_day)
    return DayBlocks(
        np.asarray(seg_block, dtype=np.int64),
        np.asarray(seg_delay, dtype=np.int64),
        false_alarms,
        days,
        _window_counts(
            pred_NM, label_MT, starts, window, servers, present_MT, per_server, points_per_day
        ),
    )


def _window_counts(
    pred_NM: Bool,
    label_MT: NDArray[np.integer],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64],
    present_MT: NDArray[np.bool_],
    per_server: int,
    points_per_day: float,
) -> NDArray[np.int64]:
    """(blocks, 3) true positives, false positives, false negatives of the window units
    of :func:`score`, each counted in the (server, day) block where its window starts."""
    truth = window_labels(label_MT, starts, window)[:, servers]
    seen = window_present(present_MT, starts, window)[:, servers]
    p, t = pred_NM[:, servers] & seen, truth & seen
    day = np.minimum(starts // points_per_day, per_server - 1).astype(np.int64)
    block_NS = np.arange(servers.size)[None, :] * per_server + day[:, None]
    out = np.zeros((servers.size * per_server, 3), dtype=np.int64)
    for j, units in enumerate((p & t, p & ~t, ~p & t)):
        np.add.at(out[:, j], block_NS[units], 1)
    return out


def _weighted_f1(d: DayBlocks, weights: NDArray[np.float64]) -> float:
    """Window F1 of the resampled blocks (NaN without window counts)."""
    if d.block_windows is None:
        return float("nan")
    tp, fp, fn = (weights[:, None] * d.block_windows).sum(axis=0)
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def compare(
    a: DayBlocks,
    b: DayBlocks,
    minutes_per_point: float,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, object]:
    """Detector ``a`` minus detector ``b`` on the same servers and labels: segments
    detected, median time to detect (minutes), false alarms per machine-day and the
    window F1 (where both have window counts), each with a 95% percentile interval
    from a paired bootstrap over (server, day) blocks
    (a resampled block brings its segments and its false alarms for both detectors).
    ``clear`` says for each whether the whole interval favours ``a`` (more segments,
    less time, fewer false alarms, a higher F1); ``clear_on_all_three`` is over the
    first three. The blocks are treated as independent; the
    servers' shared anomaly times make that optimistic (``docs/minder.md``)."""
    if not np.array_equal(a.segment_block, b.segment_block):
        raise ValueError("the two detectors were scored on different segments")
    rng = np.random.default_rng(seed)
    n = a.block_days.size

    def figures(weights: NDArray[np.float64]) -> NDArray[np.float64]:
        w_seg = weights[a.segment_block]
        out = []
        for d in (a, b):
            hit = d.segment_delay >= 0
            found = float((w_seg * hit).sum())
            chosen = np.repeat(d.segment_delay[hit], w_seg[hit].astype(np.int64))
            median = float(np.median(chosen)) * minutes_per_point if chosen.size else np.nan
            days = float((weights * d.block_days).sum())
            rate = float((weights * d.block_false_alarms).sum()) / days if days else np.nan
            out.append((found, median, rate, _weighted_f1(d, weights)))
        return np.asarray(out[0]) - np.asarray(out[1])

    observed = figures(np.ones(n))
    draws = np.array(
        [figures(np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64))
         for _ in range(resamples)]
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no segment found in any draw
        lo, hi = np.nanpercentile(draws, 2.5, axis=0), np.nanpercentile(draws, 97.5, axis=0)
    names = (
        "segments_detected", "detect_minutes_median", "false_alarms_per_machine_day", "window_f1"
    )  # fmt: skip
    better = (lo[0] > 0, hi[1] < 0, hi[2] < 0, lo[3] > 0)
    out: dict[str, object] = {
        name: {
            "difference": round(float(observed[i]), 3),
            "ci95": [round(float(lo[i]), 3), round(float(hi[i]), 3)],
            "clear": bool(better[i]),
        }
        for i, name in enumerate(names)
        if name != "window_f1" or not np.isnan(observed[i])
    }
    out["clear_on_all_three"] = all(better[:3])
    out["bootstrap"] = {"resamples": resamples, "seed": seed, "unit": "server-day", "blocks": n}
    return out
