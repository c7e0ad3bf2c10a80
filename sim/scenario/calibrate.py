"""Calibration: what the job's own measurements say about its compute and its links.

- Compute, per op type: the measured median cost and, where the job's metadata gives
  an op's FLOPs / bytes, the achieved time per FLOP and per byte. A scenario keeps
  every op's measured cost and scales it (docs/scenarios.md, "Re-timing").
- Communication, per link class (intra-/inter-host): an alpha-beta fit
  ``cost = hops * alpha + bus_bytes / bandwidth`` over the op types' median transfer
  costs, where ``bus_bytes`` is an op's bytes times NCCL's bus factor. With two or
  more message sizes on a class both terms are fitted (least squares, alpha >= 0);
  with one, the bandwidth the metadata states fixes the slope and alpha is the rest;
  without sizes, alpha is the stated per-hop latency (else 0) and every op's cost
  above it counts as bandwidth time.

Legend: N ops, S steps, D DP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.schemas.optypes import CODE, OPTYPES, bus_factor
from rankwatch.sim.durations import Measured
from rankwatch.sim.graph import OpGraph
from rankwatch.sim.ideal import ideal_costs
from rankwatch.sim.scenario.network import (
    DEFAULT_ALGORITHM,
    INTER,
    INTRA,
    LINKS,
    TREE,
    Layout,
    group_size,
    hops,
    link_class,
)
from rankwatch.sim.scenario.settings import Hardware
from rankwatch.sim.trace import JobMeta

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s."""


@dataclass(frozen=True)
class LinkFit:
    """One link class: latency per hop (s), bandwidth (bytes/s, None unknown), how found."""

    alpha_s: float
    bandwidth: float | None
    how: str


@dataclass(frozen=True)
class OpTypeFit:
    """One op type's measured median cost and, where sizes are known, rates."""

    optype: str
    count: int
    median_s: float
    s_per_flop: float | None = None
    s_per_byte: float | None = None
    link: str | None = None
    bus_gbps: float | None = None


@dataclass(frozen=True)
class Calibration:
    """A job's measured costs and the models fitted to them; input of every scenario."""

    graph: OpGraph
    cost_NSD: np.ndarray  # measured costs (clamped at 0), as the what-if's T uses them
    ideal_N: np.ndarray  # the what-if's ideal cost per op (for no_stragglers)
    layout: Layout
    hardware: Hardware
    links: tuple[LinkFit, LinkFit]  # (intra, inter)
    optypes: tuple[OpTypeFit, ...]
    head_start_NSD: np.ndarray | None = None  # send start before its recv's, s (p2p)

    def head_start(self) -> np.ndarray:
        """How long each send started before its recv (0 elsewhere, or when unknown)."""
        if self.head_start_NSD is None:
            return np.zeros_like(self.cost_NSD)
        return self.head_start_NSD

    def algorithm(self, optype: str) -> str:
        return self.hardware.collective.get(optype, DEFAULT_ALGORITHM[optype])


def calibrate(
    graph: OpGraph,
    measured: Measured,
    meta: JobMeta,
    hardware: Hardware,
    start_NSD: np.ndarray | None = None,
) -> Calibration:
    """Fit the job's compute and communication models to its measured costs.

    ``start_NSD``: the ops' recorded starts, for the head start of each send over its
    recv (a send moves data from its own start: that much wire time is hidden).
    """
    layout = Layout(
        dp=graph.dp_size,
        pp=graph.pp_size,
        tp=meta.tp_size,
        cp=meta.dsp_size,
        gpus_per_host=hardware.gpus_per_host,
    )
    cost = measured.cost_NSD
    link_ND = link_class(graph.optype, graph.stage, layout)
    partial = Calibration(
        graph=graph,
        cost_NSD=cost,
        ideal_N=ideal_costs(graph, measured).per_node(graph),
        layout=layout,
        hardware=hardware,
        links=(LinkFit(0.0, None, ""), LinkFit(0.0, None, "")),
        optypes=(),
    )
    points = _link_points(partial, link_ND)
    links = (_fit(points[INTRA], hardware, INTRA), _fit(points[INTER], hardware, INTER))
    optypes = _optype_fits(partial, link_ND, links)
    return Calibration(
        graph=graph,
        cost_NSD=cost,
        ideal_N=partial.ideal_N,
        layout=layout,
        hardware=hardware,
        links=links,
        optypes=optypes,
        head_start_NSD=None if start_NSD is None else head_starts(graph, start_NSD),
    )


def head_starts(graph: OpGraph, start_NSD: np.ndarray) -> np.ndarray:
    """For both ops of each send/recv pair: recv start - send start, at least 0."""
    out = np.zeros_like(start_NSD)
    sends = np.isin(graph.optype, [CODE["forward-send"], CODE["backward-send"]])
    for nodes, members in graph.member_buckets:
        if members.shape[1] != 2:
            continue
        pair = sends[members[:, 0]] & ~sends[members[:, 1]]
        send, recv = members[pair, 0], members[pair, 1]
        out[nodes[pair]] = np.maximum(start_NSD[recv] - start_NSD[send], 0.0)
    return out


_Point = tuple[float, float | None, float]  # hops, bus bytes (None unknown), median cost


def _link_points(cal: Calibration, link_ND: np.ndarray) -> tuple[list[_Point], list[_Point]]:
    """Per (op type, link class): hops, bus bytes and the median transfer cost."""
    out: tuple[list[_Point], list[_Point]] = ([], [])
    graph = cal.graph
    for code in np.unique(graph.optype).tolist():
        name = OPTYPES[code]
        if name not in DEFAULT_ALGORITHM:
            continue
        nodes = np.flatnonzero(graph.optype == code)
        algorithm = cal.algorithm(name)
        n = group_size(name, cal.layout)
        h = hops(algorithm, n, tree=name in TREE)
        size = cal.hardware.bytes.get(name)
        bus = None if size is None else size * bus_factor(algorithm, n)
        for k in (INTRA, INTER):
            cells = cal.cost_NSD[nodes].transpose(0, 2, 1)[link_ND[nodes] == k]
            if cells.size:
                out[k].append((h, bus, float(np.median(cells))))
    return out


def _fit(points: list[_Point], hardware: Hardware, link: int) -> LinkFit:
    stated = hardware.inter_gbps if link == INTER else hardware.intra_gbps
    bandwidth = None if stated is None else stated * GBIT
    latency = None if hardware.latency_us is None else hardware.latency_us * 1e-6
    sized = [(h, b, c) for h, b, c in points if b is not None]
    if bandwidth is None and len({b for _, b, _ in sized}) >= 2:
        return _least_squares(sized, latency)
    if bandwidth is not None and sized and latency is None:
        residual = [(c - b / bandwidth) / h for h, b, c in sized if h > 0]
        alpha = max(float(np.median(residual)), 0.0) if residual else 0.0
        return LinkFit(alpha, bandwidth, "stated bandwidth, alpha fitted")
    how = "stated" if latency is not None else "no sizes: all bandwidth time"
    return LinkFit(latency or 0.0, bandwidth, how)


def _least_squares(points: list[tuple[float, float, float]], latency: float | None) -> LinkFit:
    """``cost = h * alpha + b / bandwidth`` over points with alpha, 1/bandwidth >= 0."""
    h, b, c = (np.array(v, dtype=float) for v in zip(*points, strict=True))
    if latency is None:
        (alpha, inv), *_ = np.linalg.lstsq(np.stack([h, b], axis=1), c, rcond=None)
    else:
        alpha, inv = latency, 0.0
    if latency is not None or alpha < 0:
        alpha = latency or 0.0
        inv = float(b @ (c - alpha * h) / (b @ b))
    if inv <= 0:
        return LinkFit(float(alpha), None, "fit failed: bandwidth time not positive")
    return LinkFit(float(alpha), float(1.0 / inv), "alpha-beta least squares")


def _optype_fits(
    cal: Calibration, link_ND: np.ndarray, links: tuple[LinkFit, LinkFit]
) -> tuple[OpTypeFit, ...]:
    out = []
    graph = cal.graph
    for code in np.unique(graph.optype).tolist():
        name = OPTYPES[code]
        nodes = graph.optype == code
        median = float(np.median(cal.cost_NSD[nodes]))
        flops, size = cal.hardware.flops.get(name), cal.hardware.bytes.get(name)
        link = bus = None
        if name in DEFAULT_ALGORITHM:
            k = int(np.round(link_ND[nodes].mean()))
            link = LINKS[k]
            n = group_size(name, cal.layout)
            beta = median - links[k].alpha_s * hops(cal.algorithm(name), n, tree=name in TREE)
            if size is not None and beta > 0:
                bus = size * bus_factor(cal.algorithm(name), n) / beta / GBIT
        out.append(
            OpTypeFit(
                optype=name,
                count=int(nodes.sum() * cal.cost_NSD.shape[1] * cal.cost_NSD.shape[2]),
                median_s=median,
                s_per_flop=median / flops if flops else None,
                s_per_byte=median / size if size else None,
                link=link,
                bus_gbps=bus,
            )
        )
    return tuple(out)


MEMORY_BOUND = frozenset({CODE["optimizer"]})
"""Without shapes the optimizer scales with memory bandwidth; forward and backward
passes (matmul-heavy) with FLOP/s; gc (host CPU) with neither."""
