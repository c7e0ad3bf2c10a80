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
    relay: str = ""
    """The host relay's socket (``HooksConfig.relay``); empty: none."""
    slow_rank: int = -1
    """Global rank given extra compute in its forward (-1: none)."""
    slow_matmuls: int = 0
    """Extra 256x256 matmuls per forward microbatch of the slow rank."""
    slow_stage: int = -1
    """Pipeline stage whose every rank gets the slow rank's extra compute (-1: none): a
    stage that is slow on every DP rank, as a badly balanced partition makes it."""
    slow_every: int = 0
    """0: slow in every step; k: slow only in steps where (step // k) is odd."""
    align_every: int = 0
    """Re-estimate clock offsets every this many steps (0: only at start)."""
    data_wait_s: float = 0.0
    """Each step waits this long for its batch (a slow input pipeline, timed by the
    hooks' data-iterator integration, outside the step's ops)."""
    fault_from: int = 0
    """Injected faults (the straggler, data waits, GC, inter-step work, shaping) start at
    this step: the steps before it are the job's own healthy history."""
    gc_rank: int = -1
    """Rank on which each forward microbatch drops a cyclic object graph and triggers a
    full collection inside forward (-1: none), as an automatic gen-2 collection would."""
    gc_live: int = 200_000
    """Live objects (in cycles) the collections inside forward must traverse."""
    inter_s: float = 0.0
    """Untimed CPU work between steps (busy, not a sleep), per step, from fault_from."""
    inter_rank: int = -1
    """Rank doing the inter-step work (-1: every rank)."""
    netns: str = ""
    """Network namespace (``ip netns``) the ranks in ``netns_ranks`` enter before the
    process group starts, so their gloo traffic crosses a veth pair that can be shaped."""
    netns_ranks: str = ""
    """Comma-separated ranks that enter ``netns``."""
    gloo_ifname: str = ""
    """GLOO_SOCKET_IFNAME of the ranks outside ``netns`` (default: lo)."""
    netns_ifname: str = ""
    """GLOO_SOCKET_IFNAME of the ranks inside ``netns``."""
    master_addr: str = ""
    """MASTER_ADDR when not 127.0.0.1 (reachable from inside ``netns``)."""
    shape_cmd: str = ""
    """Shell command rank 0 runs at the start of step ``fault_from`` (traffic shaping)."""
    pause_every: int = 0
    """0: no pauses; k: rank ``pause_rank`` stops for ``pause_s`` after every k-th step
    from ``fault_from`` (a checkpoint save, an evaluation), its peers waiting for it."""
    pause_s: float = 0.0
    pause_rank: int = 0
    pause_phase: str = "checkpoint-save"
    """The phase the pause is announced as (``RankWatch.phase``); empty: unannounced."""
    pause_bound_s: float = 0.0
    """The announced phase's bound (0: the hooks' default)."""
    mismatch_rank: int = -1
    """Rank that, in step ``fault_from``, skips its DP group's gradient all-reduce and
    calls another collective instead: an all-reduce over the whole job, timed as
    ``separate-grads-all-reduce`` (as a rank that wrongly believes it holds a tied
    parameter would). No other rank calls it, so the job hangs with the group split
    between two collectives (-1: none). A plain skip does not hang: gloo pairs a group's
    collectives by order, so the skipper's next all-reduce completes its peers' one.
    The hang ends when the process group's ``timeout_s`` passes: a rank raises and the
    launcher ends the job."""
    seed: int = 0
    timeout_s: float = 120.0
    """Process group timeout (subgroups get it explicitly)."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if min(self.dp, self.pp, self.microbatches, self.steps) < 1:
            raise ValueError("dp, pp, microbatches and steps must be at least 1")
        if self.mismatch_rank != -1 and not (0 <= self.mismatch_rank < self.world and self.dp > 1):
            raise ValueError(
                f"mismatch_rank {self.mismatch_rank}: a rank of the job (0..{self.world - 1})"
                " in a DP group of at least 2, or -1"
            )

    @property
    def world(self) -> int:
        return self.dp * self.pp

    @property
    def chunks(self) -> int:
        """Model chunks per rank (virtual pipeline size)."""
        return 2 if self.schedule == "interleaved" else 1

    def is_slow(self, rank: int, step: int) -> bool:
        chosen = rank == self.slow_rank or (
            self.slow_stage >= 0 and rank // self.dp == self.slow_stage
        )
        if not chosen or self.slow_matmuls <= 0 or step < self.fault_from:
            return False
        return self.slow_every <= 0 or (step // self.slow_every) % 2 == 1

    def faulty(self, rank: int, chosen: int, step: int) -> bool:
        """Whether a fault aimed at ``chosen`` (-1: every rank) hits ``rank`` at ``step``."""
        return step >= self.fault_from and chosen in (-1, rank)

    def pauses(self, rank: int, step: int) -> bool:
        """Whether ``rank`` pauses after ``step`` (see ``pause_every``)."""
        every = self.pause_every
        return (
            every > 0
            and rank == self.pause_rank
            and self.faulty(rank, rank, step)
            and (step % every == every - 1)
        )

    def in_netns(self, rank: int) -> bool:
        return bool(self.netns) and str(rank) in self.netns_ranks.split(",")

    def hooks_on(self, step: int) -> bool:
        return self.hooks and (self.hooks_off_every <= 0 or (step // self.hooks_off_every) % 2 == 0)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkloadConfig:
        return cls(**json.loads(text))
