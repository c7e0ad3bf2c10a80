"""Records the consumer took and the agent never got: found, and their partition read again.

faust-streaming 0.15.3 can take records off aiokafka and never hand them to the agent.
The case met in the tests: while a rebalance's recovery seeks the stream partitions to
their committed offsets, a fetch already under way returns records, faust sees its flow
stopped and "seeks back to committed offsets", and aiokafka skips the seek for a
partition with nothing committed yet; the records are gone from the stream and the
consumer's position stays past them (docs/running.md, "A partition read past"). The
worker is blind to that partition until the next rebalance; and once later records come
and are acknowledged, faust commits past the lost ones.

Two checks, the ones a person would make, per partition:

- a hole: the agent got a record past the one it expected (offsets of the input topics
  have no holes of their own), or its first record since the assignment is past where
  reading resumed. Read again from the first missing offset once the agent's queue is
  empty (what was queued before the seek would look like a hole again);
- a gap: the consumer's position is past the offset after the last record the agent got,
  with the agent's queue empty, for ``wait_s``. Read again from that offset.

Records already seen come again only if a check was wrong: the workers drop repeats. A
partition read again that comes back to the same missing offset is not read again a
second time (something else is wrong there): it is reported once, and left alone until
the agent gets that record or the assignment changes.

Pure: the shell gives positions, where reading resumed after the last assignment, and
whether each topic's queue is empty; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Partition = tuple[str, int]
"""(topic, partition)"""


@dataclass(frozen=True)
class Rewind:
    """Read ``partition`` again from ``offset`` (the consumer was at ``position``); or,
    when ``stuck``, it was read again from there once already and the gap came back:
    left alone, reported once."""

    partition: Partition
    offset: int
    position: int
    waited_s: float
    stuck: bool = False


@dataclass
class StallWatch:
    wait_s: float = 5.0
    """How long a gap must last, with the agent's queue empty, before it counts."""
    rewinds: int = 0
    stuck: int = 0
    """Gaps that came back at an offset already read again once (left alone)."""
    _next: dict[Partition, int] = field(default_factory=dict)
    """partition -> the offset after the last record handed to the agent"""
    _first: dict[Partition, int] = field(default_factory=dict)
    """partition -> the first offset handed since the assignment, until checked against
    where reading resumed"""
    _holes: dict[Partition, int] = field(default_factory=dict)
    """partition -> the first offset the agent skipped (a later record came first)"""
    _gaps: dict[Partition, tuple[int, float]] = field(default_factory=dict)
    """partition -> (offset the agent waits for, when the gap was first seen)"""
    _tried: dict[Partition, int] = field(default_factory=dict)
    """partition -> the offset it was read again from, until the agent gets that record"""
    _stuck: set[Partition] = field(default_factory=set)

    def handed(self, partition: Partition, offset: int) -> None:
        """The agent got the record at ``offset`` of ``partition``. Offsets of the input
        topics have no holes (no compaction, no transactions), so a record past the one
        expected means the ones between were dropped: the next check reads them again."""
        expected = self._next.get(partition)
        if expected is None:
            self._first.setdefault(partition, offset)
        elif offset > expected and partition not in self._stuck:
            self._holes.setdefault(partition, expected)
        self._next[partition] = offset + 1
        self._gaps.pop(partition, None)
        if self._tried.get(partition) == offset:  # what was read again came
            del self._tried[partition]
            self._stuck.discard(partition)

    def reassigned(self) -> None:
        """The group's assignment changed: the consumer goes back to the committed
        offsets, so what the agent got before says nothing of where it reads now."""
        for kept in (self._next, self._first, self._holes, self._gaps, self._tried):
            kept.clear()
        self._stuck.clear()

    def wants_resumed(self, partition: Partition) -> bool:
        """Whether :meth:`check` needs where reading resumed on ``partition``: nothing
        handed since the assignment, or the first record not yet checked against it."""
        return partition not in self._next or partition in self._first

    def check(
        self,
        now: float,
        positions: Mapping[Partition, int],
        resumed: Mapping[Partition, int],
        quiet: Mapping[str, bool],
    ) -> list[Rewind]:
        """The partitions to read again. ``positions``: the consumer's position on each
        watched, assigned partition; ``resumed``: where reading resumed after the last
        assignment (committed offset, or the log's start), for the partitions that
        :meth:`wants_resumed`; ``quiet``: per topic, whether the agent's queue is empty.
        A hole (records skipped) is read again as soon as the queue is empty (what was
        queued before the seek would otherwise look like a hole again); a gap (records
        read past, none handed) once it also lasted ``wait_s``."""
        out = []
        for partition, position in positions.items():
            hole = self._hole(partition, resumed.get(partition))
            if hole is not None and quiet.get(partition[0], False):
                out.append(self._rewind(partition, hole, position, 0.0))
                continue
            if hole is not None:  # records still queued: read again once they are in
                self._holes[partition] = hole
                continue
            expected = self._next.get(partition, resumed.get(partition))
            if expected is None or position <= expected or partition in self._stuck:
                self._gaps.pop(partition, None)
                continue
            seen = self._gaps.get(partition)
            if seen is None or seen[0] != expected:
                self._gaps[partition] = (expected, now)
                continue
            waited = now - seen[1]
            if waited >= self.wait_s and quiet.get(partition[0], False):
                del self._gaps[partition]
                out.append(self._rewind(partition, expected, position, waited))
        for partition in set(self._gaps) - set(positions):  # no longer assigned
            del self._gaps[partition]
        return out

    def _hole(self, partition: Partition, resumed: int | None) -> int | None:
        """The first offset the agent skipped on ``partition``, if any."""
        hole = self._holes.pop(partition, None)
        first = self._first.pop(partition, None)
        if hole is None and first is not None and resumed is not None and first > resumed:
            hole = resumed  # the first record after the assignment was not the first due
        if first is not None and resumed is None:
            self._first[partition] = first  # judged once where reading resumed is known
        return None if partition in self._stuck else hole

    def _rewind(self, partition: Partition, offset: int, position: int, waited: float) -> Rewind:
        if self._tried.get(partition) == offset:  # read again from there already
            self._stuck.add(partition)
            self.stuck += 1
            return Rewind(partition, offset, position, waited, stuck=True)
        self._tried[partition] = offset
        self._next[partition] = offset  # what the agent gets next, once the seek is done
        self.rewinds += 1
        return Rewind(partition, offset, position, waited)
