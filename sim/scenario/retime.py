"""Re-timing: every op's measured cost under a scenario (docs/scenarios.md, "Re-timing").

Each op keeps its own measured cost (noise, stragglers and all) and changes only by
what the scenario changes:

- compute op: cost times the GPU time ratio of its op type: peak FLOP/s for
  forward/backward, memory bandwidth for the optimizer, the roofline
  ``max(F / peak, B / mem)`` where the metadata gives an op's FLOPs and bytes; gc
  runs on the host and keeps its cost. Re-shaping may scale the work (layers/stage).
- communication op: its cost splits into a beta part (``bus_bytes / bandwidth`` where
  the op's size and its link's bandwidth are known, at most the cost; else the cost
  above the alpha part ``hops * alpha``) and the rest. The scenario adds the change
  of the alpha part and multiplies the beta part by the change of bus factor (group
  size), of work, and of bandwidth of its link class (a group may change class when
  the layout changes)::

      new = cost + (hops' alpha' - hops alpha) + beta (ratio - 1)

  written so that a scenario that changes nothing returns the cost bit for bit.

Legend: N ops of the target graph, S steps, D DP ranks of the target layout.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rankwatch.schemas.optypes import CODE, OPTYPES, bus_factor
from rankwatch.sim.scenario.calibrate import GBIT, MEMORY_BOUND, Calibration
from rankwatch.sim.scenario.catalogue import GPUS
from rankwatch.sim.scenario.network import (
    DEFAULT_ALGORITHM,
    LINKS,
    TREE,
    group_size,
    hops,
    link_class,
)
from rankwatch.sim.scenario.reshape import Shape
from rankwatch.sim.scenario.settings import ScenarioError, Settings

_HOST = frozenset({CODE["gc"]})


def scenario_costs(cal: Calibration, shape: Shape, settings: Settings) -> np.ndarray:
    """``(N, S, D)`` costs of the target graph's ops under ``settings``."""
    graph = shape.graph
    base = cal.cost_NSD
    if settings.get("no_stragglers"):
        base = np.broadcast_to(cal.ideal_N[:, None, None], base.shape)
    cost = base[shape.source_N][:, :, shape.source_D]
    factor = compute_factors(cal, settings)
    comm = np.array([OPTYPES[c] in DEFAULT_ALGORITHM for c in graph.optype.tolist()], bool)
    scale = np.where(comm, 1.0, factor[graph.optype] * shape.scale_N)
    if (scale != 1.0).any():
        cost = cost * scale[:, None, None]
    if comm.any():
        cost = _retime_comm(cal, shape, settings, cost, np.flatnonzero(comm))
    return cost


def compute_factors(cal: Calibration, settings: Settings) -> np.ndarray:
    """Cost multiplier per op-type code for compute ops (1 for communication)."""
    out = np.ones(len(OPTYPES))
    touched = any(k in settings for k in ("gpu.model", "gpu.tflops", "gpu.mem_gbps"))
    speed = float(settings.get("gpu.speed", 1.0))
    if not touched and speed == 1.0:
        return out
    peak, mem = cal.hardware.peak()
    entry = GPUS.get(str(settings["gpu.model"])) if "gpu.model" in settings else None
    new_peak = float(settings.get("gpu.tflops", entry.tflops if entry else peak or 0.0))
    new_mem = float(settings.get("gpu.mem_gbps", entry.mem_gbps if entry else mem or 0.0))
    if touched and (peak is None or mem is None):
        raise ScenarioError(
            "the job's GPU is unknown: give hardware.gpu (a catalogue model) or "
            "hardware.tflops and hardware.mem_gbps in the job metadata, or use gpu.speed"
        )
    for code in range(len(OPTYPES)):
        name = OPTYPES[code]
        if name in DEFAULT_ALGORITHM or code in _HOST:
            continue
        if touched:
            out[code] = _gpu_ratio(cal, name, code, (peak, mem), (new_peak, new_mem))  # type: ignore[arg-type]
        out[code] /= speed
    return out


def _gpu_ratio(
    cal: Calibration,
    name: str,
    code: int,
    old: tuple[float, float],
    new: tuple[float, float],
) -> float:
    flops, size = cal.hardware.flops.get(name), cal.hardware.bytes.get(name)
    if flops is not None and size is not None:  # roofline
        before = max(flops / (old[0] * 1e12), size / (old[1] * 1e9))
        after = max(flops / (new[0] * 1e12), size / (new[1] * 1e9))
        return after / before
    if code in MEMORY_BOUND:
        return old[1] / new[1]
    return old[0] / new[0]


def _retime_comm(
    cal: Calibration, shape: Shape, settings: Settings, cost: np.ndarray, nodes: np.ndarray
) -> np.ndarray:
    graph, src = shape.graph, shape.source_N
    new_layout = replace(cal.layout, dp=graph.dp_size, pp=graph.pp_size)
    old_link = link_class(cal.graph.optype, cal.graph.stage, cal.layout)[src][:, shape.source_D]
    new_link = link_class(graph.optype, graph.stage, new_layout)
    alpha_old = np.array([f.alpha_s for f in cal.links])
    alpha_new = alpha_old.copy()
    if "network.latency_us" in settings:
        alpha_new[:] = float(settings["network.latency_us"]) * 1e-6
    bw_ND = np.ones(new_link.shape)
    bw_ND[nodes] = _bandwidth_ratios(cal, settings, old_link[nodes], new_link[nodes])
    out = cost.copy()
    for code in np.unique(graph.optype[nodes]).tolist():
        name = OPTYPES[code]
        these = nodes[graph.optype[nodes] == code]
        algorithm = cal.algorithm(name)
        n_old, n_new = group_size(name, cal.layout), group_size(name, new_layout)
        h_old = hops(algorithm, n_old, tree=name in TREE)
        h_new = hops(algorithm, n_new, tree=name in TREE)
        f_old, f_new = bus_factor(algorithm, n_old), bus_factor(algorithm, n_new)
        bus = f_new / f_old if f_old > 0 else 1.0
        ratio_TD = bus * shape.scale_N[these, None] * bw_ND[these]
        alpha_TD = alpha_old[old_link[these]] * h_old
        delta_TD = alpha_new[new_link[these]] * h_new - alpha_TD
        if not (ratio_TD != 1.0).any() and not (delta_TD != 0.0).any():
            continue
        c = out[these]  # (T, S, D)
        grow = _beta_change(
            cal, name, f_old, src[these], shape.source_D, old_link[these], alpha_TD, ratio_TD, c
        )
        change = delta_TD[:, None, :] + grow
        out[these] = np.maximum(c + change, 0.0)
    return out


def _beta_change(
    cal: Calibration,
    name: str,
    factor: float,
    these: np.ndarray,
    source_D: np.ndarray,
    link_TD: np.ndarray,
    alpha_TD: np.ndarray,
    ratio_TD: np.ndarray,
    cost_TSD: np.ndarray,
) -> np.ndarray:
    """How much the bandwidth part of each op's cost grows under ``ratio``.

    With the op's size and its link's bandwidth known, the wire time is ``w = bus_bytes
    / bandwidth``; a send moves data from its own start (gloo's TCP sockets, NCCL's
    small messages), so the head start ``h`` it had over its recv hides that much of
    it: the op waited ``(w - h)+`` for the wire, and waits ``(w ratio - h)+``. Without a
    size, all of the cost above its alpha part is taken as wire time, scaled by ratio.
    """
    size = cal.hardware.bytes.get(name)
    bandwidth = np.array([f.bandwidth or np.nan for f in cal.links])[link_TD]
    if size is not None and np.isfinite(bandwidth).all():
        wire = (size * factor / bandwidth)[:, None, :]
        head = cal.head_start()[these][:, :, source_D]
        before = np.maximum(wire - head, 0.0)
        after = np.maximum(wire * ratio_TD[:, None, :] - head, 0.0)
        return after - before
    beta = cost_TSD - np.minimum(alpha_TD[:, None, :], cost_TSD)
    return beta * (ratio_TD[:, None, :] - 1.0)


def _bandwidth_ratios(
    cal: Calibration, settings: Settings, old_ND: np.ndarray, new_ND: np.ndarray
) -> np.ndarray:
    """Old bandwidth / new bandwidth per (op, DP rank) of the ops' link classes."""
    stated = [cal.links[k].bandwidth for k in range(2)]
    target: list[float | None] = list(stated)
    multiplier = [1.0, 1.0]
    for k, link in enumerate(LINKS):
        if f"network.{link}_gbps" in settings:
            target[k] = float(settings[f"network.{link}_gbps"]) * GBIT
        multiplier[k] = float(settings.get(f"network.{link}_x", 1.0))
    out = np.ones(old_ND.shape)
    for a in range(2):
        for b in range(2):
            cells = (old_ND == a) & (new_ND == b)
            if not cells.any():
                continue
            if a == b and f"network.{LINKS[a]}_gbps" not in settings:
                out[cells] = 1.0 / multiplier[a]
                continue
            old, new = stated[a], target[b]
            if old is None or new is None:
                missing = LINKS[a] if old is None else LINKS[b]
                raise ScenarioError(
                    f"the job's {missing}-host bandwidth is unknown (no sizes to fit it "
                    f"on): give hardware.{missing}_gbps in the job metadata, or change it "
                    f"by a ratio (network.{missing}_x)"
                )
            out[cells] = old / (new * multiplier[b])
    return out
