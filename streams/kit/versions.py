"""The ``version`` of a row: which of two copies of it ``FINAL`` keeps (pure core).

Every table but the raw ones is a ReplacingMergeTree on its ``version``: of two rows with
one identity, a merge and ``FINAL`` keep the one with the larger version (the later
insert on a tie). The version was the wall time of the write, so the *latest* write won,
and a worker paused past its session wrote last: its partial row of a step replaced the
complete one that the worker which took its partitions had stored 27 s before.

The version now orders copies by what makes one right, most significant first:

1. **completeness** (bit 63): a complete row (an analysed step, any row of a worker
   that had all its input) beats a partial one whatever else, so no partial step ever
   replaces an analysed one, and a partial step analysed again once its late records
   came replaces its partial row;
2. **ownership** (bits 32-62): the consumer group's generation of the assignment the
   writer held. Kafka raises it at every rebalance, so the worker that owns a job now
   writes with a larger one than any worker that owned it before: a stale owner's row
   loses even when it is written later;
3. **time** (bits 0-31): wall-clock seconds of the write, so that one owner's later row
   of the same completeness wins, as before (on a tie, the later insert).

Rows written without a consumer group (embedded: demo, replay) have generation 0. A
group's generation starts again only if the group itself is deleted (Kafka does that
after its offsets expire, a week by default); rows written before then rank below any
written after, by then long stored.
"""

from __future__ import annotations

COMPLETE = 1 << 63
GENERATION_SHIFT = 32
MAX_GENERATION = (1 << 31) - 1
_SECONDS = (1 << 32) - 1
_NS = 1_000_000_000


def row_version(now_ns: int, *, generation: int = 0, complete: bool = True) -> int:
    """The version of a row written at ``now_ns`` by the owner of ``generation``."""
    owner = min(max(generation, 0), MAX_GENERATION) << GENERATION_SHIFT
    return (COMPLETE if complete else 0) | owner | (now_ns // _NS) & _SECONDS


def version_parts(version: int) -> tuple[bool, int, int]:
    """(complete, generation, seconds) of a version: what :func:`row_version` packed."""
    return (
        bool(version & COMPLETE),
        (version >> GENERATION_SHIFT) & MAX_GENERATION,
        version & _SECONDS,
    )
