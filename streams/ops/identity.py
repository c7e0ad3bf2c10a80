"""A job's identity, fixed once: no single batch may redefine a job.

Input from the network is data, never authority. The first accepted batch of a job
(or, after a restart, what the store remembers of it) fixes the job's layout (DP and
PP sizes), and each rank's coordinates are fixed the first time the rank is seen.
Every later batch is checked against them before it touches any state; one that
contradicts them is rejected with a reason (the pipeline dead-letters it) and changes
nothing. The rules, in the order they are checked (docs/contracts.md, "Who a job is"):

- ``no-key``: the record came from a topic without a key (or an empty one). Keys route
  a job to one worker; a keyless record lands on any partition, and would feed the job
  from a worker that does not own it.
- ``key-mismatch``: the message's Kafka key names another job than its body. Keys
  route a job to one worker; a body that disagrees would feed the job from a
  partition its owner does not read.
- ``bad-coordinates``: ``dp_rank >= dp_size`` or ``pp_rank >= pp_size`` (a worker the
  job cannot have).
- ``contradicts-job``: DP or PP size differ from the job's; or the rank was seen with
  other (dp, pp, tp, cp) coordinates; or those coordinates belong to another rank.
- ``step-out-of-window``: a step more than ``step_window`` steps away from the job's
  newest accepted step. Ahead, it would open a step that never completes; behind, it
  would reopen a step too old to be remembered as stored and overwrite its row.

Pure: no I/O, no clock; the pipeline calls :meth:`JobIdentities.check` then
:meth:`JobIdentities.accept` for each decoded batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rankwatch.schemas.opbatch import OpBatch

Coordinates = tuple[int, int, int, int]
"""(dp_rank, pp_rank, tp_rank, cp_rank)"""


@dataclass(frozen=True)
class Rejection:
    """Why a batch was refused: ``reason`` is a short code (the dead letter's reason)."""

    reason: str
    detail: str


@dataclass(slots=True)
class _Identity:
    layout: tuple[int, int]
    coordinates: dict[int, Coordinates] = field(default_factory=dict)
    ranks: dict[Coordinates, int] = field(default_factory=dict)
    newest_step: int | None = None


@dataclass
class JobIdentities:
    """The fixed identity of every job a worker owns."""

    step_window: int = 4096
    """Steps a batch may be away from its job's newest accepted step (either way)."""
    _jobs: dict[str, _Identity] = field(default_factory=dict)

    def check(self, batch: OpBatch, key: bytes | None = None) -> Rejection | None:
        """Why ``batch`` (delivered under ``key``; None when read from no topic, as a
        replay in-process; b"" for a record of a topic that had no key) must be refused."""
        if key is not None and not key:
            return Rejection("no-key", "the record has no key: records are keyed by job")
        if key is not None and key != batch.job.encode():
            shown = key.decode("utf-8", "replace")[:80]
            return Rejection("key-mismatch", f"keyed {shown!r}, body says job {batch.job!r}")
        if batch.dp_rank >= batch.dp_size or batch.pp_rank >= batch.pp_size:
            return Rejection(
                "bad-coordinates",
                f"rank {batch.rank} at dp {batch.dp_rank}/{batch.dp_size}, "
                f"pp {batch.pp_rank}/{batch.pp_size}",
            )
        known = self._jobs.get(batch.job)
        if known is None:
            return None
        return _contradiction(known, batch) or self._far_step(known, batch)

    def accept(self, batch: OpBatch) -> None:
        """Take a batch that passed :meth:`check` (fixes what was not fixed yet)."""
        known = self._jobs.get(batch.job)
        if known is None:
            known = self._jobs[batch.job] = _Identity((batch.dp_size, batch.pp_size))
        coords = _coordinates(batch)
        if batch.rank not in known.coordinates:
            known.coordinates[batch.rank] = coords
            known.ranks[coords] = batch.rank
        newest = _step_range(batch)[1]
        if known.newest_step is None or newest > known.newest_step:
            known.newest_step = newest

    def restore(
        self,
        job: str,
        layout: tuple[int, int],
        newest_step: int | None,
        coordinates: dict[int, Coordinates] | None = None,
    ) -> None:
        """What the store remembers of a job this process has not met yet."""
        known = self._jobs[job] = _Identity(layout, newest_step=newest_step)
        for rank, coords in (coordinates or {}).items():
            known.coordinates[rank] = coords
            known.ranks[coords] = rank

    def layout(self, job: str) -> tuple[int, int] | None:
        known = self._jobs.get(job)
        return None if known is None else known.layout

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def coordinates(self, job: str) -> dict[int, Coordinates]:
        """rank -> coordinates fixed so far for ``job`` (what :meth:`restore` takes)."""
        known = self._jobs.get(job)
        return dict(known.coordinates) if known is not None else {}

    def _far_step(self, known: _Identity, batch: OpBatch) -> Rejection | None:
        if known.newest_step is None:
            return None
        low, high = _step_range(batch)
        if (
            known.newest_step - low > self.step_window
            or high - known.newest_step > self.step_window
        ):
            return Rejection(
                "step-out-of-window",
                f"steps {low}..{high}, job's newest step {known.newest_step}, "
                f"window {self.step_window}",
            )
        return None


def _contradiction(known: _Identity, batch: OpBatch) -> Rejection | None:
    if (batch.dp_size, batch.pp_size) != known.layout:
        dp, pp = known.layout
        return Rejection(
            "contradicts-job",
            f"batch says dp_size {batch.dp_size}, pp_size {batch.pp_size}; "
            f"job {batch.job!r} is dp_size {dp}, pp_size {pp}",
        )
    coords = _coordinates(batch)
    fixed = known.coordinates.get(batch.rank)
    if fixed is not None and fixed != coords:
        return Rejection(
            "contradicts-job",
            f"rank {batch.rank} sent (dp, pp, tp, cp) {coords}; it is {fixed}",
        )
    owner = known.ranks.get(coords)
    if owner is not None and owner != batch.rank:
        return Rejection(
            "contradicts-job", f"rank {batch.rank} claims {coords}, which is rank {owner}'s"
        )
    return None


def _coordinates(batch: OpBatch) -> Coordinates:
    return (batch.dp_rank, batch.pp_rank, batch.tp_rank, batch.cp_rank)


def _step_range(batch: OpBatch) -> tuple[int, int]:
    """Lowest and highest step a batch names (its records and its declared step ends)."""
    low, high = batch.step_span
    for step, _ in batch.steps_done:
        low, high = min(low, step), max(high, step)
    return low, high
