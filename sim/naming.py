"""Op names for messages: ``<optype>_<seq_id>_<stage>`` and the ``2F0`` shorthand.

The shorthand is the PyTorch pipelining vocabulary: stage, F (forward) or B
(backward), microbatch id. Only compute ops have one.
"""

from __future__ import annotations

from collections.abc import Iterable

from rankwatch.schemas.optypes import OPTYPES

_SHORT = {"forward-compute": "F", "backward-compute": "B"}


def op_name(optype: int, seq_id: int, stage: int) -> str:
    """The op's name, the same in every step and DP rank."""
    return f"{OPTYPES[optype]}_{seq_id}_{stage}"


def op_label(optype: int, seq_id: int, stage: int, mb_id: int = -1) -> str:
    """Name plus the ``2F0`` shorthand when the op is a compute op with a microbatch."""
    name = op_name(optype, seq_id, stage)
    short = _SHORT.get(OPTYPES[optype])
    if short is None or mb_id < 0:
        return name
    return f"{name} ({stage}{short}{mb_id})"


def list_names(labels: Iterable[str], limit: int = 6, total: int | None = None) -> str:
    """At most ``limit`` names, then how many more (of ``total``): one readable line."""
    items = list(labels)
    shown = ", ".join(items[:limit])
    more = (len(items) if total is None else total) - min(limit, len(items))
    return f"{shown} and {more} more" if more > 0 else shown
