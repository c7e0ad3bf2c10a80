"""How long each op of each (step, dp_rank) takes: base times, imbalance, stragglers, noise.

Array legend: N ops of the graph, S steps, D DP ranks, P stages.

Communication ops get their *transfer* time here; the time they spend blocked waiting
for their group is added by the event model. The small collectives the config does not
name are sized from the two it does, so ``p2p_s = dp_comm_s = 0`` means no
communication at all.
"""

from __future__ import annotations

import numpy as np

from rankwatch.schemas.optypes import CODE, OPTYPES
from rankwatch.sim.tracegen.config import GenConfig
from rankwatch.sim.tracegen.graph import ScheduleGraph

LAYERNORM_SHARE = 0.01
"""layernorm-grads-all-reduce moves a sliver of the gradients: this share of dp_comm_s."""
EMBEDDING_SHARE = 0.25
"""embedding-grads-all-reduce (word embeddings, first and last stage): share of dp_comm_s."""

_COMPUTE_CODES = (CODE["forward-compute"], CODE["backward-compute"])


def base_times(cfg: GenConfig) -> np.ndarray:
    """Seconds per op type (indexed by op-type code), before imbalance and noise."""
    per_type = {
        "forward-compute": cfg.forward_s,
        "backward-compute": cfg.backward_s,
        "forward-send": cfg.p2p_s,
        "forward-recv": cfg.p2p_s,
        "backward-send": cfg.p2p_s,
        "backward-recv": cfg.p2p_s,
        "params-all-gather": cfg.dp_comm_s,
        "grads-reduce-scatter": cfg.dp_comm_s,
        "separate-grads-all-reduce": cfg.dp_comm_s,
        "layernorm-grads-all-reduce": LAYERNORM_SHARE * cfg.dp_comm_s,
        "embedding-grads-all-reduce": EMBEDDING_SHARE * cfg.dp_comm_s,
        "optimizer-clip-main-grad": cfg.p2p_s,  # a scalar all-reduce: latency, like a p2p
        "optimizer": cfg.optimizer_s,
        "gc": cfg.gc_s,
    }
    return np.array([per_type[name] for name in OPTYPES])


def compute_factors(cfg: GenConfig) -> np.ndarray:
    """``factor_PSD``: multiplier of forward/backward compute per stage, step and DP rank."""
    factor_PSD = np.ones((cfg.pp, cfg.steps, cfg.dp))
    if cfg.stage_factors is not None:
        factor_PSD *= np.asarray(cfg.stage_factors, dtype=float)[:, None, None]
    steps = np.asarray(cfg.step_numbers)
    for s in cfg.stragglers:
        hit_S = np.ones(cfg.steps, bool) if s.steps is None else np.isin(steps, s.steps)
        factor_PSD[s.stage, hit_S, s.dp_rank] *= s.factor
    return factor_PSD


def op_durations(
    graph: ScheduleGraph, cfg: GenConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(duration_NSD, delay_NSD)``: op durations and launch delays (None when off)."""
    shape = (len(graph), cfg.steps, cfg.dp)
    duration_NSD = np.broadcast_to(base_times(cfg)[graph.optype][:, None, None], shape).copy()
    is_compute_N = np.isin(graph.optype, _COMPUTE_CODES)
    duration_NSD[is_compute_N] *= compute_factors(cfg)[graph.stage[is_compute_N]]
    if cfg.noise > 0:
        duration_NSD *= rng.lognormal(0.0, cfg.noise, size=shape)
    delay_NSD = rng.exponential(cfg.launch_delay_s, size=shape) if cfg.launch_delay_s > 0 else None
    return duration_NSD, delay_NSD
