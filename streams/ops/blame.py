"""Who a straggler alert blames: the smallest group that explains the slowdown (pure).

A step's attributions say, per group, how slow the step would be if only that group
kept its real durations (``S_g``; docs/whatif.md). A worker's is the smaller of its DP
rank's and its stage's (``S_w = min(S_dp, S_stage)``), so a worker never scores above
either of its groups, and the largest ``S_g`` always names a DP rank or a stage: the
alert on main blamed "stage 0" for a slow worker (1,0), "DP rank 1" for worker (1,1).

The rule here asks instead which groups *explain* the step: a group explains it when
its own excess, ``S_g - 1``, is at least :data:`EXPLAINS` of the step's, ``S - 1``.

- exactly one worker explains it: that **worker** (its DP rank and stage explain it too,
  because they contain it);
- several workers do, all of one stage: that **stage** (one slow stage: every DP rank's
  copy of it is slow, each alone enough to slow the step); all of one DP rank: that
  **DP rank**;
- none, or workers of several stages and DP ranks: **spread** (noise, or a slowdown
  that no group carries).

Over a window of steps the blame is the group that is a step's blame in at least
``chronic_share`` of them (:func:`window_blame`); else spread. Ranks and hosts are named
by the caller from the job's coordinates.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXPLAINS = 0.7
"""The share of a step's excess slowdown a group must carry alone to explain it."""
SPREAD = "spread"


@dataclass(frozen=True)
class StepBlame:
    """One step's blame: ``dimension`` is worker, stage, dp_rank or spread."""

    dimension: str
    group: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.dimension, self.group)


def step_blame(slowdown: float, attributions: Iterable[tuple[str, str, float]]) -> StepBlame:
    """The smallest group that explains a step whose slowdown is ``slowdown``, from its
    (dimension, group, S_g) attributions."""
    excess = slowdown - 1.0
    if not excess > 0:
        return StepBlame(SPREAD, "")
    workers = [
        group
        for dimension, group, value in attributions
        if dimension == "worker" and value - 1.0 >= EXPLAINS * excess
    ]
    if len(workers) == 1:
        return StepBlame("worker", workers[0])
    coords = [tuple(w.split(",")) for w in workers]
    if len(coords) > 1:
        stages = {p for _, p in coords}
        ranks = {d for d, _ in coords}
        if len(stages) == 1:
            return StepBlame("stage", stages.pop())
        if len(ranks) == 1:
            return StepBlame("dp_rank", ranks.pop())
    return StepBlame(SPREAD, "")


@dataclass(frozen=True)
class WindowBlame:
    """Who a window of steps blames: the group named in at least ``needed`` of its
    ``steps`` (``led`` of them), or spread."""

    dimension: str
    group: str
    led: int
    steps: int
    needed: int

    @property
    def chronic(self) -> bool:
        return self.dimension != SPREAD


def window_blame(blames: Sequence[StepBlame], chronic_share: float) -> WindowBlame:
    """The group that is the blame of at least ``chronic_share`` of ``blames`` (two at
    least), else spread."""
    needed = max(2, math.ceil(chronic_share * len(blames)))
    counts = Counter(b.key for b in blames if b.dimension != SPREAD)
    if counts:
        (dimension, group), led = counts.most_common(1)[0]
        if led >= needed:
            return WindowBlame(dimension, group, led, len(blames), needed)
    most = max(counts.values(), default=0)
    return WindowBlame(SPREAD, "", most, len(blames), needed)


def ranks_of(
    dimension: str, group: str, coordinates: dict[int, tuple[int, int, int, int]]
) -> list[int]:
    """The global ranks a blamed group holds, from each rank's (dp, pp, tp, cp): a
    worker's ranks are its tensor- and context-parallel peers too."""
    if dimension == "worker":
        d, p = (int(x) for x in group.split(","))
        return sorted(r for r, c in coordinates.items() if (c[0], c[1]) == (d, p))
    if dimension == "stage":
        return sorted(r for r, c in coordinates.items() if c[1] == int(group))
    if dimension == "dp_rank":
        return sorted(r for r, c in coordinates.items() if c[0] == int(group))
    return []
