"""Realistic op traces of pipeline x data-parallel training steps, from a seed.

rankwatch must run from a plain clone, where no real trace exists: the demo, the tests
and the benchmarks take their jobs from here. A trace follows the conventions of the
shipped straggler traces and the dependency model of ``docs/whatif.md`` exactly, so the
what-if engine, re-simulating a generated trace with its recorded durations and launch
delays, reproduces the recorded step times; with ``launch_delay_s = 0`` it finds no
launch delay at all.

Modules: ``config`` (GenConfig, Straggler, demo_config), ``schedule`` (per-stage compute
orders), ``graph`` (the op graph of one step), ``durations``, ``timing`` (the event
model, vectorised over steps and DP ranks), ``records`` (rows of the Trace).
"""

from __future__ import annotations

import numpy as np

from rankwatch.sim.trace import JobMeta, Trace
from rankwatch.sim.tracegen.config import SCHEDULES, GenConfig, Straggler, demo_config
from rankwatch.sim.tracegen.durations import op_durations
from rankwatch.sim.tracegen.graph import GraphSizes, ScheduleError, ScheduleGraph, build_graph
from rankwatch.sim.tracegen.records import assemble_trace
from rankwatch.sim.tracegen.timing import simulate

__all__ = [
    "SCHEDULES",
    "GenConfig",
    "ScheduleError",
    "ScheduleGraph",
    "Straggler",
    "demo_config",
    "generate_trace",
    "job_graph",
    "job_meta",
]


def job_graph(cfg: GenConfig) -> ScheduleGraph:
    """The op graph every (step, dp_rank) of ``cfg``'s job runs."""
    return build_graph(
        GraphSizes(
            pp=cfg.pp,
            vpp=cfg.vpp,
            microbatches=cfg.microbatches,
            schedule=cfg.schedule,
            dp_comm=cfg.dp > 1,
            overlap_grad_comm=cfg.overlap_grad_comm,
        )
    )


def job_meta(cfg: GenConfig) -> JobMeta:
    """Parallel sizes of the generated job (tensor and sequence parallel are 1)."""
    return JobMeta(dp_size=cfg.dp, pp_size=cfg.pp, vpp_size=cfg.vpp, world_size=cfg.dp * cfg.pp)


def generate_trace(cfg: GenConfig) -> tuple[Trace, JobMeta]:
    """Every op of every step and worker of ``cfg``'s job; deterministic in ``cfg.seed``."""
    graph = job_graph(cfg)
    rng = np.random.default_rng(cfg.seed)
    duration_NSD, delay_NSD = op_durations(graph, cfg, rng)
    start_NSD, end_NSD = simulate(graph, duration_NSD, delay_NSD)
    trace = assemble_trace(
        graph,
        cfg.step_numbers,
        cfg.dp,
        start_NSD=start_NSD,
        end_NSD=end_NSD,
        duration_NSD=duration_NSD,
    )
    return trace, job_meta(cfg)
