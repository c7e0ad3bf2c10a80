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
