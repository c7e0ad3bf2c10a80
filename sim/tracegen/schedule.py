"""Per-stage compute orders of the pipeline schedules, built from their definitions.

An :class:`Action` is one forward or backward pass of one microbatch through one model
chunk of a stage, written like PyTorch's pipelining vocabulary: ``2F0`` is stage 2,
forward, microbatch 0; with model chunks ``2F0c1`` (chunk 1). A schedule is, per stage,
the order in which its compute stream runs these actions; the timing follows from the
dependencies (``graph.py``), not from the schedule itself.
"""

from __future__ import annotations

from typing import NamedTuple


class Action(NamedTuple):
    """One compute op of a stage."""

    stage: int
    kind: str  # "F" or "B"
    chunk: int
    mb: int

    def __str__(self) -> str:
        chunk = f"c{self.chunk}" if self.chunk else ""
        return f"{self.stage}{self.kind}{self.mb}{chunk}"


def stage_actions(schedule: str, pp: int, vpp: int, microbatches: int, stage: int) -> list[Action]:
    """The compute order of ``stage`` under ``schedule`` ("gpipe", "1f1b", "interleaved")."""
    if schedule == "gpipe":
        return _gpipe(stage, microbatches)
    if schedule == "1f1b" or (schedule == "interleaved" and vpp == 1):
        return _one_f_one_b(pp, microbatches, stage)
    if schedule == "interleaved":
        return _interleaved(pp, vpp, microbatches, stage)
    raise ValueError(f"unknown schedule {schedule!r}")


def _gpipe(stage: int, m: int) -> list[Action]:
    """All forwards, then all backwards (in microbatch order)."""
    return [Action(stage, "F", 0, i) for i in range(m)] + [
        Action(stage, "B", 0, i) for i in range(m)
    ]


def _one_f_one_b(pp: int, m: int, stage: int) -> list[Action]:
    """Warm-up of ``pp - stage - 1`` forwards, then one forward one backward, then cool-down."""
    warmup = min(pp - stage - 1, m)
    out = [Action(stage, "F", 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        out.append(Action(stage, "F", 0, warmup + i))
        out.append(Action(stage, "B", 0, i))
    out.extend(Action(stage, "B", 0, i) for i in range(m - warmup, m))
    return out


def _interleaved(pp: int, vpp: int, m: int, stage: int) -> list[Action]:
    """Megatron's interleaved 1F1B (virtual pipeline) with ``vpp`` chunks per stage.

    Virtual microbatch k walks microbatches in groups of ``pp``: within a group of
    ``pp * vpp`` virtual microbatches, chunks in turn (forward: 0 up; backward: last
    chunk down), ``pp`` microbatches each. Warm-up runs ``2 (pp - stage - 1) +
    (vpp - 1) pp`` forwards (all of them when ``m == pp``), then 1F1B, then cool-down.
    """
    total = m * vpp
    warmup = total if m == pp else min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)

    def forward(k: int) -> Action:
        group, pos = divmod(k, pp * vpp)
        return Action(stage, "F", pos // pp, group * pp + pos % pp)

    def backward(k: int) -> Action:
        group, pos = divmod(k, pp * vpp)
        return Action(stage, "B", vpp - 1 - pos // pp, group * pp + pos % pp)

    out = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        out.append(forward(warmup + k))
        out.append(backward(k))
    out.extend(backward(k) for k in range(total - warmup, total))
    return out


def global_chunk(action: Action, pp: int) -> int:
    """Index of the action's model chunk in the whole model (``gmc = mc * pp + stage``)."""
    return action.chunk * pp + action.stage
