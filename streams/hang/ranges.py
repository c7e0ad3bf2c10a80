"""Rank lists as ranges (``0-3,5,8-15``): readable for a page at night."""

from __future__ import annotations

from collections.abc import Iterable


def format_ranges(ranks: Iterable[int]) -> str:
    """Sorted, de-duplicated ranks with consecutive runs folded: ``[0,1,2,5] -> "0-2,5"``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_ranges(text: str) -> list[int]:
    """The inverse of :func:`format_ranges` (for CLI arguments and tests)."""
    ranks: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        ranks.extend(range(int(lo), int(hi or lo) + 1))
    return ranks
