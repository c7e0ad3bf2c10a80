"""What a generated job looks like: the frozen configuration of the trace generator.

One dataclass holds every knob (sizes, schedule, per-op times, noise, stragglers) so a
trace is a pure function of its config, seed included. Checks happen here, once, with
messages that name the bad field.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")


@dataclass(frozen=True)
class Straggler:
    """One slow worker: its forward/backward compute takes ``factor`` times longer."""

    dp_rank: int
    stage: int
    factor: float  # compute durations of that worker multiplied by this
    steps: tuple[int, ...] | None = None  # step numbers (as recorded); None = every step


@dataclass(frozen=True)
class GenConfig:
    """A pipeline-parallel x data-parallel training job to trace.

    Times are seconds. ``forward_s``/``backward_s`` are per microbatch per model chunk,
    so with ``vpp`` chunks a microbatch costs ``vpp * (forward_s + backward_s)`` on a stage.
    """

    dp: int = 2
    pp: int = 4
    microbatches: int = 8
    vpp: int = 1  # model chunks per stage (interleaved when > 1)
    schedule: str = "1f1b"  # "1f1b" | "gpipe" | "interleaved"
    steps: int = 8
    first_step: int = 0
    forward_s: float = 0.010  # per microbatch per chunk
    backward_s: float = 0.020
    p2p_s: float = 0.0005  # transfer time of one send/recv
    dp_comm_s: float = 0.004  # params-all-gather / grads-reduce-scatter transfer
    optimizer_s: float = 0.008
    gc_s: float = 0.0
    noise: float = 0.03  # relative (lognormal sigma); 0 = exact durations
    overlap_grad_comm: bool = False  # emit separate-grads-all-reduce (overlapped DP comm)
    stragglers: tuple[Straggler, ...] = ()
    stage_factors: tuple[float, ...] | None = None  # per-stage compute multipliers
    launch_delay_s: float = 0.0  # mean CPU-side gap before each op (0 = none)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_sizes(self)
        _check_times(self)
        _check_workers(self)

    @property
    def step_numbers(self) -> range:
        """The recorded step numbers, in order."""
        return range(self.first_step, self.first_step + self.steps)


def _check_sizes(cfg: GenConfig) -> None:
    for name in ("dp", "pp", "microbatches", "vpp", "steps"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.vpp > 1 and cfg.schedule != "interleaved":
        raise ValueError(f"vpp={cfg.vpp} needs schedule='interleaved', got {cfg.schedule!r}")
    if cfg.schedule == "interleaved" and cfg.vpp > 1 and cfg.microbatches % cfg.pp:
        raise ValueError(
            f"interleaved schedule runs microbatches in groups of pp: microbatches "
            f"({cfg.microbatches}) must be a multiple of pp ({cfg.pp})"
        )


def _check_times(cfg: GenConfig) -> None:
    for name in (
        "forward_s",
        "backward_s",
        "p2p_s",
        "dp_comm_s",
        "optimizer_s",
        "gc_s",
        "noise",
        "launch_delay_s",
    ):
        value = getattr(cfg, name)
        if not value >= 0.0:  # also rejects NaN
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if cfg.stage_factors is not None:
        if len(cfg.stage_factors) != cfg.pp:
            raise ValueError(
                f"stage_factors needs one factor per stage ({cfg.pp}), got {len(cfg.stage_factors)}"
            )
        if not all(f > 0.0 for f in cfg.stage_factors):
            raise ValueError(f"stage_factors must be > 0, got {cfg.stage_factors}")


def _check_workers(cfg: GenConfig) -> None:
    for s in cfg.stragglers:
        if not (0 <= s.dp_rank < cfg.dp and 0 <= s.stage < cfg.pp):
            raise ValueError(
                f"straggler at dp_rank {s.dp_rank}, stage {s.stage} is outside "
                f"DP {cfg.dp} x PP {cfg.pp}"
            )
        if not s.factor > 0.0:
            raise ValueError(f"straggler factor must be > 0, got {s.factor!r}")


def demo_config(seed: int = 0) -> GenConfig:
    """The job ``rankwatch demo`` analyses when no real trace is at hand.

    DP 4 x PP 4, 1F1B over 8 microbatches, 30 steps, 3% noise, small CPU launch gaps,
    one straggler worker (dp_rank 2, stage 1, compute 1.6x) and a last stage 15% heavier
    (a partitioning imbalance): two distinct causes for the analyses to find. Thirty
    steps, so that the straggler alert's 20-step window fills and the alert fires, as it
    would live; at 1.5x the worker stood 0.145 above its peers, under the alert's 0.15.
    """
    return GenConfig(
        dp=4,
        pp=4,
        microbatches=8,
        schedule="1f1b",
        steps=30,
        first_step=100,
        noise=0.03,
        gc_s=0.0005,
        stragglers=(Straggler(dp_rank=2, stage=1, factor=1.6),),
        stage_factors=(1.0, 1.0, 1.0, 1.15),
        launch_delay_s=0.0001,
        seed=seed,
    )
