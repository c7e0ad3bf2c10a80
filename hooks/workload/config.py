"""The workload's settings: one frozen dataclass, passed to every rank as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

SCHEDULES = ("1f1b", "gpipe", "interleaved")
CONFIG_ENV = "RANKWATCH_WORKLOAD"
"""The rank processes read their WorkloadConfig (JSON) from this variable..."""
OUT_ENV = "RANKWATCH_WORKLOAD_OUT"
"""...and write their results into this folder."""


@dataclass(frozen=True)
class WorkloadConfig:
    dp: int = 2
    pp: int = 2
    schedule: str = "1f1b"
    microbatches: int = 4
    steps: int = 8
    hidden: int = 64
    seq: int = 16
    microbatch_size: int = 4
    blocks_per_stage: int = 1
    """Transformer-like blocks per pipeline stage (per model chunk when interleaved)."""
    job: str = "workload"
    hooks: bool = True
    hooks_off_every: int = 0
    """0: hooks on throughout; k: switched off in steps where (step // k) is odd (the
    overhead benchmark's A/B inside one job)."""
    kafka: str = ""
    topic_prefix: str = "rankwatch"
    spool_dir: str = ""
    """Where each rank's spool file goes (the destination when there is no Kafka, and
    the fallback when Kafka is down)."""
    slow_rank: int = -1
    """Global rank given extra compute in its forward (-1: none)."""
    slow_matmuls: int = 0
    """Extra 256x256 matmuls per forward microbatch of the slow rank."""
    slow_every: int = 0
    """0: slow in every step; k: slow only in steps where (step // k) is odd."""
    align_every: int = 0
    """Re-estimate clock offsets every this many steps (0: only at start)."""
    data_wait_s: float = 0.0
    """Each step waits this long for its batch (a slow input pipeline, timed by the
    hooks' data-iterator integration, outside the step's ops)."""
    seed: int = 0
    timeout_s: float = 120.0
    """Process group timeout (subgroups get it explicitly)."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if min(self.dp, self.pp, self.microbatches, self.steps) < 1:
            raise ValueError("dp, pp, microbatches and steps must be at least 1")

    @property
    def world(self) -> int:
        return self.dp * self.pp

    @property
    def chunks(self) -> int:
        """Model chunks per rank (virtual pipeline size)."""
        return 2 if self.schedule == "interleaved" else 1

    def is_slow(self, rank: int, step: int) -> bool:
        if rank != self.slow_rank or self.slow_matmuls <= 0:
            return False
        return self.slow_every <= 0 or (step // self.slow_every) % 2 == 1

    def hooks_on(self, step: int) -> bool:
        return self.hooks and (self.hooks_off_every <= 0 or (step // self.hooks_off_every) % 2 == 0)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkloadConfig:
        return cls(**json.loads(text))
