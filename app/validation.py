"""The measured-vs-simulated check on the real workload (used by
``benchmarks/validate_whatif.py`` and its integration test).

One job alternates a straggler (extra 256x256 matmuls in the forward of rank 0 =
dp 0, stage 0) on and off every ``every`` steps: separate clean and straggled jobs
differ by about +-13% from noise alone on a shared 2-core machine, alternating inside
one job cancels most of it. The first ``warmup`` steps are dropped (handshakes).

- measured: median step time of the straggled steps / median of the clean steps
  (per-step time = last rank's end - first rank's start, aligned clocks);
- simulated: the what-if engine's S over the hooks' trace of the straggled steps
  alone (records read back from the ranks' spool files, assembled by the stream's
  step assembler);
- replay error: the largest |replayed - recorded| step time when the same trace is
  simulated with its own launch delays, relative to the shortest recorded step;
- the workers' S_w (the injected one, "0,0", should lead);
- simulated / S of the clean steps alone (``imbalance``: what noise and uneven stages
  cost without the injected straggler), a baseline-corrected figure reported beside
  the method's own;
- where the gap between simulated and measured comes from (:func:`decompose`).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from rankwatch.schemas.codec import decode_ops
from rankwatch.schemas.optypes import CODE, COMPUTE
from rankwatch.schemas.spool import Spool
from rankwatch.sim import (
    Analysis,
    JobMeta,
    Measured,
    OpGraph,
    Trace,
    analyse_measured,
    ideal_costs,
    infer_graph,
    measure_trace,
)
from rankwatch.streams.ops.assembly import AssembledStep, StepAssembler
from rankwatch.workload.config import WorkloadConfig
from rankwatch.workload.launch import run_job

SLOW_RANK = 0


def job_config(
    matmuls: int, steps: int, every: int, spool: Path, seed: int, dp: int = 2,
    hidden: int = 128,
) -> WorkloadConfig:  # fmt: skip
    return WorkloadConfig(
        dp=dp, pp=2, microbatches=4, hidden=hidden, blocks_per_stage=2, seq=32, steps=steps,
        slow_rank=SLOW_RANK, slow_matmuls=matmuls, slow_every=every, spool_dir=str(spool),
        job=f"validate-{matmuls}-{seed}", seed=seed,
    )  # fmt: skip


def assembled_steps(spool: Path) -> dict[int, AssembledStep]:
    """The hooks' spooled batches through the stream's step assembler."""
    assembler = StepAssembler()
    batches = [
        decode_ops(m.value)
        for path in sorted(spool.glob("*.spool"))
        for m in Spool(path).read()
        if m.kind == "ops"
    ]
    closed = []
    for batch in sorted(batches, key=lambda b: b.sent_ns):
        closed += assembler.add(batch, batch.sent_ns)
    closed += assembler.flush()
    return {s.step: s for s in closed if not s.partial}


def concat(steps: list[AssembledStep]) -> Trace:
    names = [f.name for f in fields(Trace)]
    return Trace(**{n: np.concatenate([getattr(s.trace, n) for s in steps]) for n in names})


def one_job(
    matmuls: int, steps: int, warmup: int, every: int, seed: int, dp: int = 2,
    hidden: int = 128,
) -> dict[str, Any]:  # fmt: skip
    """One job at one straggler level: measured and simulated slowdown, replay error,
    the workers' S_w."""
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        spool = Path(tmp) / "spool"
        cfg = job_config(matmuls, warmup + steps, every, spool, seed, dp, hidden)
        result = run_job(cfg, Path(tmp) / "out")
        assembled = assembled_steps(spool)
    kept = range(warmup, cfg.steps)
    slow = [s for s in kept if cfg.is_slow(SLOW_RANK, s)]
    clean = [s for s in kept if not cfg.is_slow(SLOW_RANK, s)]
    times = result.step_times_s()
    measured = statistics.median(times[s] for s in slow) / statistics.median(
        times[s] for s in clean
    )
    meta = JobMeta(dp_size=cfg.dp, pp_size=cfg.pp)
    straggled, baseline, gap = decompose(
        concat([assembled[s] for s in slow]), concat([assembled[s] for s in clean]), meta
    )
    return {
        "measured": measured,
        "simulated": straggled.slowdown,
        "error": (straggled.slowdown - measured) / measured,
        "simulated_over_clean": straggled.slowdown / baseline.slowdown,
        "replay_error": straggled.replay_error / float(straggled.base_S.min()),
        "launch_slowdown": straggled.launch_slowdown,
        "launch_slowdown_clean_steps": baseline.launch_slowdown,
        "top_worker": next(iter(straggled.workers())),
        "workers": straggled.workers(),
        "clean_step_s": statistics.median(times[s] for s in clean),
        "clock_error_ns": result.clock_error_ns(),
        **gap,
    }


def decompose(
    slow: Trace, clean: Trace, meta: JobMeta
) -> tuple[Analysis, Analysis, dict[str, float]]:
    """The method's S on the straggled steps, S on the clean steps, and the gap
    between S and the measured slowdown split into three factors.

    With means in place of medians (``measured_mean``), exactly::

        S / measured_mean = imbalance * launch / dilution

    - ``dilution``: T_ideal from the straggled steps' own costs over T_ideal from the
      clean steps' costs. The ideal takes the mean forward time over *all* workers,
      the injected one included, so with n workers about 1/n of the injected work
      stays in the ideal: the method's definition, not a simulation error; it fades
      as the job grows.
    - ``imbalance``: S of the clean steps alone (noise and uneven stages, which the
      measured ratio divides out and S keeps).
    - ``launch``: the clean steps' launch slowdown over the straggled steps' (CPU-side
      gaps that the measured step times hold and the simulation leaves out).

    ``others_slowed``: the other workers' mean compute cost, straggled steps over
    clean ones. Above 1 when the injected work also slows its neighbours (ranks that
    share CPU cores), which lands in ``dilution`` too.

    ``undiluted``: S with the ideal taken from the clean steps (dilution removed);
    ``undiluted_over_imbalance`` also divides out the clean steps' own S, and differs
    from ``measured_mean`` only by the launch factor.
    """
    graph = infer_graph(slow, meta)
    m_slow, m_clean = measure_trace(graph, slow), measure_trace(graph, clean)
    clean_ideal = ideal_costs(graph, m_clean)
    straggled = analyse_measured(graph, m_slow, ideal_costs(graph, m_slow))
    baseline = analyse_measured(graph, m_clean, clean_ideal)
    undiluted = analyse_measured(graph, m_slow, clean_ideal)
    dilution = float(straggled.ideal_S.mean() / baseline.ideal_S.mean())
    return (
        straggled,
        baseline,
        {
            "measured_mean": float(m_slow.base_S.mean() / m_clean.base_S.mean()),
            "dilution": dilution,
            "imbalance": baseline.slowdown,
            "launch": baseline.launch_slowdown / straggled.launch_slowdown,
            "others_slowed": _others_compute(graph, m_slow) / _others_compute(graph, m_clean),
            "undiluted": undiluted.slowdown,
            "undiluted_over_imbalance": undiluted.slowdown / baseline.slowdown,
        },
    )


def _others_compute(graph: OpGraph, measured: Measured) -> float:
    """Mean forward/backward compute cost of every worker but the injected one."""
    compute = np.isin(graph.optype, [CODE[name] for name in COMPUTE])
    cost_NSD = measured.cost_NSD[compute]
    injected_ND = (graph.stage[compute] == 0)[:, None] & (np.arange(graph.dp_size) == 0)[None]
    return float(cost_NSD.transpose(0, 2, 1)[~injected_ND].mean())
