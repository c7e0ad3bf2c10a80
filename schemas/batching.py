"""How a rank's op records are cut into messages: the hooks follow this rule live, and
``rankwatch replay`` (and the benchmarks) on a trace's timeline, so that what a worker is
measured on is what the hooks send (docs/contracts.md, "How records are batched").

- A step's records leave when the step ends on the rank, in one message with every other
  finished step still held (several steps per message: each gets its ``steps_done``
  entry), split only past ``max_records`` records or ``MAX_STEPS`` steps.
- A finished step is held back only while the rank's next step is expected to finish
  within ``window_s`` of the first held one (the expectation: the last interval between
  step ends). Long steps therefore leave at once, as before; short ones ride together, a
  held step waiting at most ``window_s``. That bound is what step -> row latency pays.
- Records of a step still running leave after ``partial_s`` (a hang's last ops reach the
  store) or past ``max_records`` pending, always less the latest record, so the step's
  closing message is never empty.

Plain Python (the hooks import no numpy).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_STEPS = 1024
"""Steps one message may close (the ops schema's ``steps_done`` maxItems)."""


@dataclass(frozen=True)
class BatchingRule:
    window_s: float = 0.25
    """How long a finished step may wait for the rank's next ones (0: never)."""
    partial_s: float = 30.0
    """How long records of a running step may wait before some of them leave."""
    max_records: int = 20_000
    """Records per message, at most (and pending records that force a send)."""


class StepHold:
    """When a rank's finished steps leave (one object per rank; times in seconds on any
    monotonic clock: the publisher's round times, or a replay's timeline)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.first: float | None = None
        """When the oldest held step finished (None: nothing held)."""
        self.last_end: float | None = None
        self.interval: float | None = None
        """The last interval between two step ends (None until there were two)."""

    def ended(self, now: float) -> None:
        """A step finished (seen) at ``now``; it is held until :meth:`due`."""
        if self.last_end is not None:
            self.interval = max(0.0, now - self.last_end)
        self.last_end = now
        if self.first is None:
            self.first = now

    @property
    def deadline(self) -> float | None:
        """When the held steps must leave at the latest (None: nothing held)."""
        return None if self.first is None else self.first + self.window_s

    def due(self, now: float) -> bool:
        """Whether the held steps should leave now."""
        deadline = self.deadline
        if deadline is None:
            return False
        if self.interval is None or now >= deadline:
            return True
        assert self.last_end is not None
        return self.last_end + self.interval > deadline  # the next one would come too late

    def sent(self) -> None:
        self.first = None
