"""The communication model: NCCL's bus-bandwidth factors, latency hops, link classes.

A collective over n ranks moving S bytes per rank takes about ``hops(n) * alpha +
factor(n) * S / B`` on links of bandwidth B and per-hop latency alpha (ring
algorithm; NCCL's "bus bandwidth" is ``factor * S / time``):

- all-reduce: factor ``2(n-1)/n``, ``2(n-1)`` hops (ring) or ``2 ceil(log2 n)`` (tree);
- all-gather, reduce-scatter: factor ``(n-1)/n``, ``n-1`` hops;
- point-to-point: factor 1, one hop.

A group whose ranks sit on more than one host crosses the inter-host network (its
ring is as slow as its slowest link); one inside a host uses the intra-host links.
Ranks are placed in Megatron order (tensor, context, data, pipeline; the host of
global rank r is ``r // gpus_per_host``). See docs/scenarios.md, "Communication".

Legend: N ops, D DP ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rankwatch.schemas.optypes import OPTYPES

INTRA, INTER = 0, 1
LINKS = ("intra", "inter")

DEFAULT_ALGORITHM: dict[str, str] = {
    "forward-send": "p2p",
    "forward-recv": "p2p",
    "backward-send": "p2p",
    "backward-recv": "p2p",
    "params-all-gather": "all-gather",
    "grads-reduce-scatter": "reduce-scatter",
    "separate-grads-all-reduce": "all-reduce",
    "layernorm-grads-all-reduce": "all-reduce",
    "embedding-grads-all-reduce": "all-reduce",
    "optimizer-clip-main-grad": "all-reduce",
}
"""The collective each communicating op type runs (Megatron's choice)."""

TREE = frozenset({"optimizer-clip-main-grad"})
"""Op types NCCL runs with the tree algorithm: a scalar all-reduce is latency-bound."""


def hops(algorithm: str, n: int, tree: bool = False) -> float:
    """Latency terms on the critical path of one op (0 for a group of one)."""
    if algorithm == "p2p":
        return 1.0
    if n <= 1:
        return 0.0
    if algorithm == "all-reduce":
        return 2.0 * math.ceil(math.log2(n)) if tree else 2.0 * (n - 1)
    return float(n - 1)


@dataclass(frozen=True)
class Layout:
    """Where ranks sit: parallel sizes and GPUs per host."""

    dp: int
    pp: int
    tp: int = 1
    cp: int = 1
    gpus_per_host: int = 8

    def host(self, dp: np.ndarray, stage: np.ndarray) -> np.ndarray:
        """Host of the first rank (tp = cp = 0) of each (dp, stage)."""
        return (stage * self.dp + dp) * self.cp * self.tp // self.gpus_per_host

    @property
    def inner_crosses(self) -> bool:
        """A tensor/context group spans hosts."""
        return self.tp * self.cp > self.gpus_per_host


_PEER = {"forward-send": 1, "forward-recv": -1, "backward-send": -1, "backward-recv": 1}


def group_size(optype: str, layout: Layout) -> int:
    """Ranks in the group of one op of this type."""
    if optype in _PEER or optype == "embedding-grads-all-reduce":
        return 2
    if optype in ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"):
        return layout.dp
    if optype == "layernorm-grads-all-reduce":
        return layout.tp * layout.cp
    if optype == "optimizer-clip-main-grad":
        return layout.dp * layout.pp * layout.tp * layout.cp
    return 1


def link_class(optype_N: np.ndarray, stage_N: np.ndarray, layout: Layout) -> np.ndarray:
    """``(N, D)`` INTRA or INTER: which links each op's group uses, per DP rank."""
    d = np.arange(layout.dp)[None, :]
    stage = stage_N[:, None]
    own = layout.host(d, stage)
    out = np.zeros((optype_N.size, layout.dp), dtype=np.int8)
    names = [OPTYPES[c] for c in optype_N.tolist()]
    for i, name in enumerate(names):
        if name in _PEER:
            peer = (stage_N[i] + _PEER[name]) % layout.pp
            crosses = layout.host(d[0], np.full(layout.dp, peer)) != own[i]
        elif name in ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"):
            span = layout.host(np.array([0, layout.dp - 1]), np.full(2, stage_N[i]))
            crosses = np.full(layout.dp, span[0] != span[1])
        elif name == "embedding-grads-all-reduce":
            crosses = layout.host(d[0], np.zeros(layout.dp, np.int64)) != layout.host(
                d[0], np.full(layout.dp, layout.pp - 1)
            )
        elif name == "optimizer-clip-main-grad":
            total = layout.dp * layout.pp * layout.tp * layout.cp
            crosses = np.full(layout.dp, total > layout.gpus_per_host)
        else:  # layernorm: a tensor/context group; compute ops: no links
            inner = name == "layernorm-grads-all-reduce" and layout.inner_crosses
            crosses = np.full(layout.dp, inner)
        out[i] = crosses
    return out
