"""The op-type vocabulary of the what-if method, and the groups the analyses need.

The method: docs/whatif.md.

Codes are the index into :data:`OPTYPES`; they are part of the contract (stored in
ClickHouse as an Enum and carried in op batches as strings), so only append.
"""

from __future__ import annotations

OPTYPES: tuple[str, ...] = (
    "forward-compute",
    "backward-compute",
    "forward-send",
    "forward-recv",
    "backward-send",
    "backward-recv",
    "params-all-gather",
    "grads-reduce-scatter",
    "separate-grads-all-reduce",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "optimizer-clip-main-grad",
    "optimizer",
    "gc",
)
CODE: dict[str, int] = {name: i for i, name in enumerate(OPTYPES)}

COMPUTE: frozenset[str] = frozenset({"forward-compute", "backward-compute"})
"""Ops on a worker's compute stream."""

POINT_TO_POINT: frozenset[str] = frozenset(
    {"forward-send", "forward-recv", "backward-send", "backward-recv"}
)
DP_COLLECTIVES: frozenset[str] = frozenset(
    {"params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"}
)

COMPUTING: frozenset[str] = COMPUTE | {"optimizer", "gc"}
"""Ideal duration = mean over the optype (uneven work rebalanced)."""

COMMUNICATING: frozenset[str] = frozenset(OPTYPES) - COMPUTING
"""Ideal transfer duration = median over the optype (robust to a flapping link)."""

ATTRIBUTION_GROUP: dict[str, str] = {
    **{name: name for name in OPTYPES},
    "forward-send": "forward-pp-comm",
    "forward-recv": "forward-pp-comm",
    "backward-send": "backward-pp-comm",
    "backward-recv": "backward-pp-comm",
}
"""Op type -> the group it is attributed to (point-to-point types merged)."""


COLLECTIVE_ALGORITHMS: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "p2p")
"""The collectives a rank may declare for an op type (ops v2 ``rank_steps`` ``algo``)."""


def bus_factor(algorithm: str, n: int) -> float:
    """Bytes each rank's links carry per byte of the op's buffer, in a group of ``n``:
    NCCL's factor from algorithm bandwidth (bytes / time) to bus bandwidth. All-reduce
    ``2(n-1)/n`` (a reduce-scatter then an all-gather), all-gather and reduce-scatter
    ``(n-1)/n``, point-to-point 1. One fact for the slowdown signals (bandwidth from
    measured times, docs/detection.md section 3) and the scenario model (re-timing a
    collective, docs/scenarios.md)."""
    if n < 1:
        raise ValueError(f"group size {n} < 1")
    if algorithm == "p2p":
        return 1.0
    if algorithm == "all-reduce":
        return 2.0 * (n - 1) / n
    if algorithm in ("all-gather", "reduce-scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective algorithm {algorithm!r}")
