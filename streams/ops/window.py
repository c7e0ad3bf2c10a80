"""Per-job rolling windows keyed by step number, so that a restart gives the same numbers.

The sim's :class:`~rankwatch.sim.RollingIdeal` holds the last W steps *pushed*: after a
restart its content depends on what the new process happened to see. Here a step's
window is defined by step numbers instead: the W latest analysed steps with a number up
to the step being analysed. Given the same analysed steps (reloaded from the store after
a restart), every step gets the same window, whatever the process history.

Memory is bounded: a window keeps the ``2 * W`` highest step numbers it was given (the
extra W lets a step arriving a little out of order still find its predecessors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwatch.sim import IdealCosts, RollingIdeal
from rankwatch.sim.ideal import StepSummary


@dataclass
class StepWindow:
    """Step summaries of one job, by step number."""

    size: int
    summaries: dict[int, StepSummary] = field(default_factory=dict)

    def put(self, step: int, summary: StepSummary) -> None:
        self.summaries[step] = summary
        if len(self.summaries) > 2 * self.size:
            for old in sorted(self.summaries)[: len(self.summaries) - 2 * self.size]:
                del self.summaries[old]

    def ideal(self, step: int) -> IdealCosts:
        """Ideal costs from the ``size`` latest summaries at or before ``step``."""
        steps = sorted(s for s in self.summaries if s <= step)[-self.size :]
        if not steps:
            raise ValueError(f"no summary at or before step {step}")
        recent = tuple(self.summaries[s] for s in steps)
        return RollingIdeal(window=self.size, recent=recent).ideal()


@dataclass
class SlowdownWindow:
    """Per-step slowdowns of one job: the rolling job-level S is their mean over the
    ``size`` latest analysed steps at or before a step."""

    size: int
    values: dict[int, float] = field(default_factory=dict)

    def put(self, step: int, slowdown: float) -> None:
        self.values[step] = slowdown
        if len(self.values) > 2 * self.size:
            for old in sorted(self.values)[: len(self.values) - 2 * self.size]:
                del self.values[old]

    def rolling(self, step: int) -> tuple[float, int]:
        """(mean slowdown, steps it covers) over the window ending at ``step``."""
        steps = sorted(s for s in self.values if s <= step)[-self.size :]
        if not steps:
            return float("nan"), 0
        return float(np.mean([self.values[s] for s in steps])), len(steps)
