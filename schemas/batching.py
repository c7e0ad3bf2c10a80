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


@dataclass(frozen=True)
class RelayRule:
    """How a host's relay gathers the frames its ranks hand it into bundles (the ops
    schema's ``x-bundle``), one open bundle per job: a consumer then pays its
    per-message cost once for the host's ranks, not once per rank (docs/contracts.md,
    "Bundles")."""

    linger_s: float = 0.05
    """How long a bundle's first frame may wait for others: what step -> row latency
    pays for the relay, at most."""
    max_bytes: int = 512 * 1024
    """A bundle's frames' size, at most: with its envelope well under the 1 MiB a Kafka
    broker takes per message by default (``message.max.bytes``)."""
    alone_bytes: int = 64 * 1024
    """Frames this large (about 1,400 records) already carry enough records for their
    message's cost: not bundled (and a datagram this size fits a Unix socket's default
    buffers)."""
    max_members: int = 1024
    """Frames per bundle, at most (the schema allows more)."""
    join: bool = True
    """Send a bundle's frames joined (``x-joined``: one set of column blocks, read and
    checked once) when they can be. Workers older than the joined layout refuse such a
    message whole: upgrade the workers first, or set this False until then."""


class Bundler:
    """Open bundles of one relay (times in seconds on any monotonic clock: the relay's,
    or a replay's timeline). Returns what is ready as (job, frames); the caller packs
    each into a bundle (one frame alone: sent as it is)."""

    def __init__(self, rule: RelayRule) -> None:
        self.rule = rule
        self._open: dict[str, tuple[float, list[bytes], int]] = {}
        """job -> (when its first frame came, frames, their bytes)"""

    def add(self, now: float, job: str, frame: bytes) -> list[tuple[str, list[bytes]]]:
        """A frame of ``job`` came at ``now``: the bundles that must leave, this frame's
        included when it filled one (or leaves alone)."""
        rule = self.rule
        if len(frame) >= rule.alone_bytes:
            return [(job, [frame])]
        out = []
        opened = self._open.get(job)
        if opened is not None and opened[2] + len(frame) > rule.max_bytes:
            out.append((job, self._open.pop(job)[1]))
            opened = None
        if opened is None:
            self._open[job] = opened = (now, [], 0)
        first, frames, size = opened
        frames.append(frame)
        self._open[job] = (first, frames, size + len(frame))
        if len(frames) >= rule.max_members:
            out.append((job, self._open.pop(job)[1]))
        return out

    def due(self, now: float) -> list[tuple[str, list[bytes]]]:
        """The bundles whose first frame has waited ``linger_s``."""
        late = [
            job for job, (first, _, _) in self._open.items() if now >= first + self.rule.linger_s
        ]
        return [(job, self._open.pop(job)[1]) for job in late]

    def drain(self) -> list[tuple[str, list[bytes]]]:
        """Every open bundle (the relay stops)."""
        out = [(job, frames) for job, (_, frames, _) in self._open.items()]
        self._open.clear()
        return out

    @property
    def held(self) -> int:
        """Frames in open bundles."""
        return sum(len(frames) for _, frames, _ in self._open.values())

    @property
    def deadline(self) -> float | None:
        """When the oldest open bundle falls due (None: none open)."""
        firsts = [first for first, _, _ in self._open.values()]
        return min(firsts) + self.rule.linger_s if firsts else None
