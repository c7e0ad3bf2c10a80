"""The hooks' clock: monotonic ns anchored to wall time, shifted onto rank 0's clock.

Op times must be comparable across ranks. Each rank reads ``perf_counter_ns`` (cheap,
monotonic, never steps) and adds an anchor taken once from ``time_ns`` plus an offset
to rank 0 estimated over the process group (:func:`estimate_offset` from ping-pong
samples; the exchange itself lives with the transport that can do it, e.g. the torch
workload). The residual error is half the round trip of the best sample: the true
offset lies within ``offset_ns +- error_ns``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OffsetEstimate:
    offset_ns: int
    """Add to the local clock to read rank 0's clock."""
    error_ns: int
    """Half the round trip of the sample used: a bound on |true offset - offset_ns|."""
    samples: int


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> OffsetEstimate:
    """Offset from ``(t_send, t_peer, t_recv)`` samples: local send, peer reply, local receive.

    The peer read its clock somewhere between our send and receive; the sample with the
    shortest round trip bounds that instant most tightly (Cristian's algorithm).
    """
    if not samples:
        raise ValueError("no clock samples")
    t0, t1, t2 = min(samples, key=lambda s: s[2] - s[0])
    if t2 < t0:
        raise ValueError(f"a sample received ({t2}) before it was sent ({t0})")
    return OffsetEstimate(
        offset_ns=t1 - (t0 + t2) // 2, error_ns=(t2 - t0 + 1) // 2, samples=len(samples)
    )


class Clock:
    """``now_ns()``: aligned wall-clock ns; ``read`` is the raw monotonic source.

    ``read`` and ``wall`` are injectable so tests run without sleeping.
    """

    def __init__(
        self,
        read: Callable[[], int] = time.perf_counter_ns,
        wall: Callable[[], int] = time.time_ns,
    ) -> None:
        self.read = read
        self._base = wall() - read()
        self.offset_ns = 0
        self.error_ns = 0
        self.shift_ns = self._base
        """raw ``read()`` + shift_ns = aligned wall clock (hot paths add it themselves)."""

    def now_ns(self) -> int:
        return self.read() + self.shift_ns

    def to_wall(self, raw_ns: int) -> int:
        """A raw ``read()`` value on the aligned wall clock."""
        return raw_ns + self.shift_ns

    def local_ns(self) -> int:
        """Unaligned wall clock (what ping-pong samples are taken with)."""
        return self.read() + self._base

    def align(self, estimate: OffsetEstimate) -> None:
        self.offset_ns = estimate.offset_ns
        self.error_ns = estimate.error_ns
        self.shift_ns = self._base + estimate.offset_ns
