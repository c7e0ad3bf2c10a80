"""Merged stacks: identical call paths of many ranks folded into one.

A hung job of 1,000 ranks dumps 1,000 near-identical stacks; a person needs the
handful of distinct paths, which ranks sit in each, and — the clue — which ranks are
*not* in the path every other rank sits in. Frames are keyed by file and function
(not line: the same wait is reached from slightly different lines).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankwatch.streams.hang.ranges import format_ranges


@dataclass(frozen=True)
class MergedStack:
    stack: str
    """Frames outermost first, ``file:function`` joined by ``;`` (folded-stack format)."""
    native: bool
    ranks: tuple[int, ...]
    absent: tuple[int, ...]
    """Ranks of the job that are not in this path."""

    @property
    def ranks_text(self) -> str:
        return format_ranges(self.ranks)

    @property
    def absent_text(self) -> str:
        return format_ranges(self.absent)


def frame_key(frame: Mapping[str, Any]) -> str:
    return f"{frame['file']}:{frame['function']}"


def merge_stacks(
    dumps: Mapping[int, Sequence[Mapping[str, Any]]], all_ranks: Iterable[int]
) -> list[MergedStack]:
    """Fold the threads of each rank's dump (``rank -> threads`` as in the stacks
    message) into distinct paths, most ranks first."""
    everyone = set(all_ranks) | set(dumps)
    members: dict[tuple[str, bool], set[int]] = {}
    for rank, threads in dumps.items():
        for thread in threads:
            frames = thread.get("frames") or []
            if not frames:
                continue
            path = ";".join(frame_key(f) for f in frames)
            members.setdefault((path, bool(thread.get("native"))), set()).add(rank)
    merged = [
        MergedStack(path, native, tuple(sorted(ranks)), tuple(sorted(everyone - ranks)))
        for (path, native), ranks in members.items()
    ]
    return sorted(merged, key=lambda m: (-len(m.ranks), m.stack))


def folded_text(merged: Iterable[MergedStack]) -> str:
    """Brendan Gregg's folded format (``a;b;c COUNT``), one line per path; the count is
    the number of ranks, so a flame graph's width shows how many ranks sit there."""
    return "".join(f"{m.stack} {len(m.ranks)}\n" for m in merged)
