"""Ideal costs: what each op would cost with no straggler.

Computing op types (forward/backward compute, optimizer, gc) get the mean over their
op type: computing stragglers mostly come from uneven work, and the mean is the load
rebalanced. Communicating types get the median of their transfer durations: a few
very long transfers (a flapping link) would drag a mean.

Offline, the statistics run over the whole trace (:func:`ideal_costs`). Online,
:class:`RollingIdeal` keeps per-step summaries of recent steps: the mean is exact
over the window; the median is the median of the steps' medians, which needs O(1)
memory per step and equals the exact median when the window holds one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from rankwatch.schemas.optypes import COMPUTING, OPTYPES
from rankwatch.sim.durations import Measured
from rankwatch.sim.graph import OpGraph

_MEAN = np.array([name in COMPUTING for name in OPTYPES])


@dataclass(frozen=True)
class IdealCosts:
    """Ideal cost per op type (NaN where the type does not occur)."""

    by_optype: np.ndarray  # (len(OPTYPES),)

    def per_node(self, graph: OpGraph) -> np.ndarray:
        return self.by_optype[graph.optype]

    def as_dict(self) -> dict[str, float]:
        return {OPTYPES[i]: float(v) for i, v in enumerate(self.by_optype) if np.isfinite(v)}


@dataclass(frozen=True)
class StepSummary:
    """Per op type, over one step: count and sum of costs, and their median."""

    count: np.ndarray
    total: np.ndarray
    median: np.ndarray


def summarise(graph: OpGraph, measured: Measured) -> StepSummary:
    """Per-op-type statistics of ``measured`` (any number of steps, treated as one)."""
    k = len(OPTYPES)
    count, total, median = np.zeros(k), np.zeros(k), np.full(k, np.nan)
    for code in np.unique(graph.optype).tolist():
        # clamped here, one op type at a time: no clamped copy of the whole table
        values = np.maximum(measured.exact_cost_NSD[graph.optype == code], 0.0)
        count[code] = values.size
        total[code] = values.sum()
        median[code] = median_in_place(values.reshape(-1))
    return StepSummary(count=count, total=total, median=median)


def median_in_place(values: np.ndarray) -> float:
    """``np.median(values)`` of a 1-D float array, which it reorders (a partition).

    The same number (NaN if one is NaN; the middle value, or the mean of the two middle
    ones) without numpy's generic reduction around it: a live step summarises each of
    its op types, and numpy's own cost 25 µs each, most of it not the partition."""
    n = values.size
    if n == 0 or np.isnan(values).any():
        return math.nan
    half = n // 2
    if n % 2:
        values.partition(half)
        return float(values[half])
    values.partition((half - 1, half))
    return float((values[half - 1] + values[half]) / 2)


def ideal_costs(graph: OpGraph, measured: Measured) -> IdealCosts:
    """Ideal costs over all the steps of ``measured`` (the offline analysis)."""
    s = summarise(graph, measured)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s.total / s.count
    return IdealCosts(by_optype=np.where(_MEAN, mean, s.median))


@dataclass(frozen=True)
class RollingIdeal:
    """Ideal costs from the last ``window`` steps; ``push`` returns the updated window.

    Pure: nothing is mutated, so a stream worker can keep it as per-job state.
    """

    window: int = 20
    recent: tuple[StepSummary, ...] = field(default=())

    def push(self, graph: OpGraph, measured: Measured) -> RollingIdeal:
        recent = (*self.recent, summarise(graph, measured))[-self.window :]
        return replace(self, recent=recent)

    def __len__(self) -> int:
        return len(self.recent)

    def ideal(self) -> IdealCosts:
        if not self.recent:
            raise ValueError("no step in the window yet: push one first")
        count = np.sum([s.count for s in self.recent], axis=0)
        total = np.sum([s.total for s in self.recent], axis=0)
        medians = np.array([s.median for s in self.recent])
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        return IdealCosts(by_optype=np.where(_MEAN, mean, nanmedian_columns(medians)))


def nanmedian_columns(values: np.ndarray) -> np.ndarray:
    """``np.nanmedian(values, axis=0)``, NaN for an all-NaN column (without a warning).

    The same numbers (the middle value, or the mean of the two middle ones, of each
    column's values that are not NaN) at a tenth of the cost: numpy's own goes through
    masked arrays for small inputs, about 0.1 ms for a window of 20 steps, once per live
    step and job."""
    ordered = np.sort(values, axis=0)  # NaN sorts last
    count = (~np.isnan(ordered)).sum(axis=0)
    out = np.full(values.shape[1], np.nan)
    some = np.flatnonzero(count)
    low, high = (count[some] - 1) // 2, count[some] // 2
    out[some] = (ordered[low, some] + ordered[high, some]) / 2
    return out
