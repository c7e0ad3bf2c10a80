"""Stalled ranks, hung jobs and their culprits, from heartbeats.

A rank is *stalled* when it made no progress (no op started or ended) for longer than
its bound once it reported its first op, or when its heartbeats stopped (the process is
gone, stopped, or its machine unreachable). The bound is ``max(floor_s, k * median
recent step time)`` in training steps, ``warmup_s`` until some rank of the job has gone
through ``warmup_steps`` steps since it was first heard (compilation, the first
batches), and, while the rank is in a phase it announced (a checkpoint, an evaluation),
that phase's own bound from its start, capped at ``max_phase_s``; an announced phase
also excuses the rank's silence until then (a save can starve the thread that beats),
and its end counts as progress. A job is *hung* when every rank that has not finished is
stalled. Then ranks waiting inside a communication op are *waiting*; the others (in
compute, in untimed Python, or silent) are *culprits*; the ranks absent from the op most
waiters sit in are *suspects*. When every rank of a data-parallel group waits, but not
all in the same collective (a rank called another one, or skipped one), the hang is a
*collective mismatch*: the ranks away from the group's collective are the culprits, and
the summary says where each rank of the group waits. One episode per hang, resolved as
soon as any rank makes progress again.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from rankwatch.schemas.optypes import COMMUNICATING, DP_COLLECTIVES

NS = 1_000_000_000


@dataclass(frozen=True)
class HangConfig:
    k: float = 5.0
    """Stall threshold in units of the median recent step time."""
    floor_s: float = 6.0
    """Never call a rank stalled sooner than this in training steps: a few seconds, since
    what legitimately stops a job for longer than a few steps (a checkpoint, an
    evaluation) is announced as a phase with its own bound, and a stalled job must be
    alerted within seconds (benchmarks/README.md, "Hang detection at the defaults")."""
    warmup_s: float = 60.0
    """The bound until some rank went through ``warmup_steps`` steps since first heard:
    a job's first steps compile, warm up and wait for the first data, none of which a
    step time can predict."""
    warmup_steps: int = 3
    max_phase_s: float = 4 * 3600.0
    """An announced phase's bound is the rank's word, capped here: no message can switch
    hang detection off for a job."""
    silent_after_s: float = 6.0
    """Heartbeats missing this long: the rank is silent (three of the hooks' 2 s
    heartbeat periods, so one late beat of a busy rank is not silence; and silence
    alone alerts nothing: the job's other ranks must be stalled too)."""
    step_window: int = 20
    """Recent step times kept per job for the median."""


@dataclass
class RankState:
    rank: int
    host: str
    coords: tuple[int, int, int, int]
    """(dp, pp, tp, cp)"""
    step: int
    heard_ns: int
    progress_ns: int
    in_flight: Mapping[str, Any] | None = None
    last_done: Mapping[str, Any] | None = None
    finished: bool = False
    phase: tuple[str, int, float] | None = None
    """The phase the rank announced it is in: (name, since_ns, bound_s)."""
    started: bool = False
    """Reported an op at least once: before that (imports, process groups, clock
    alignment under load) the time without progress says nothing about a hang."""

    @property
    def waiting(self) -> bool:
        return self.in_flight is not None and self.in_flight["optype"] in COMMUNICATING


@dataclass(frozen=True)
class Episode:
    job: str
    episode_id: str
    declared_ns: int
    last_progress_ns: int
    step: int
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    silent: tuple[int, ...]
    suspects: tuple[int, ...]
    first_stopped: int
    culprit_hosts: tuple[str, ...]
    culprit_where: str
    summary: str
    resolved_ns: int | None = None

    @property
    def open(self) -> bool:
        return self.resolved_ns is None


@dataclass
class _Job:
    ranks: dict[int, RankState] = field(default_factory=dict)
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=20))
    step_seen: dict[int, tuple[int, int]] = field(default_factory=dict)
    """rank -> (step, time it was first seen in that step)"""
    first_step: dict[int, int] = field(default_factory=dict)
    """rank -> the step it was first heard in"""
    steps_done: int = 0
    """The most steps any rank went through since first heard (the warm-up's end)."""
    episode: Episode | None = None
    excused_ns: int = 0
    """Until when the worker could not hear this job (:meth:`HangDetector.excuse`): no
    rank counts as silent or without progress for that time."""


class HangDetector:
    def __init__(self, config: HangConfig | None = None) -> None:
        self.config = config or HangConfig()
        self._jobs: dict[str, _Job] = {}

    def observe(self, hb: Mapping[str, Any], now_ns: int) -> None:
        """One heartbeat (a decoded ``heartbeats`` message) received at ``now_ns``."""
        job = self._jobs.get(hb["job"])
        if job is None:
            job = self._jobs[hb["job"]] = _Job(step_times=deque(maxlen=self.config.step_window))
        rank = int(hb["rank"])
        progress = _progress_ns(hb)
        state = job.ranks.get(rank)
        if state is None:
            state = job.ranks[rank] = RankState(
                rank=rank,
                host=hb["host"],
                coords=(hb["dp_rank"], hb["pp_rank"], hb["tp_rank"], hb["cp_rank"]),
                step=hb["step"],
                heard_ns=now_ns,
                progress_ns=progress or now_ns,
            )
        state.heard_ns = now_ns
        state.step = hb["step"]
        state.in_flight, state.last_done = hb["in_flight"], hb["last_done"]
        state.progress_ns = max(state.progress_ns, progress or 0)
        state.finished = hb.get("state") == "finished"
        phase = hb.get("phase")
        if state.phase is not None and not phase:
            # Finishing an announced phase is progress: the heartbeat that says so can
            # come before the rank's next op, and its progress clock would otherwise still
            # read the phase's start, older than the step bound, with every peer waiting.
            state.progress_ns = max(state.progress_ns, now_ns)
        state.phase = (
            None if not phase else (phase["name"], int(phase["since_ns"]), float(phase["bound_s"]))
        )
        state.started = state.started or progress is not None
        self._note_step(job, rank, hb["step"], state.progress_ns)

    def threshold_s(self, job: str) -> float:
        """The stall bound of the job's ranks in training steps (or warming up)."""
        times = self._jobs[job].step_times if job in self._jobs else ()
        done = self._jobs[job].steps_done if job in self._jobs else 0
        if done < self.config.warmup_steps or not times:
            return max(self.config.warmup_s, self.config.floor_s)
        return max(self.config.floor_s, self.config.k * median(times))

    def evaluate(self, now_ns: int) -> list[Episode]:
        """Episodes that opened or resolved since the last call."""
        changed = []
        for name, job in list(self._jobs.items()):
            live = [r for r in job.ranks.values() if not r.finished]
            if not live:
                if job.episode and job.episode.open:
                    changed.append(self._resolve(job, now_ns))
                del self._jobs[name]
                continue
            if job.episode and job.episode.open:
                if any(r.progress_ns > job.episode.last_progress_ns for r in live):
                    changed.append(self._resolve(job, now_ns))
                continue
            since = job.excused_ns
            stalled = [r for r in live if self._stalled(name, r, now_ns, since)]
            if len(stalled) == len(live) and not self._late(live, now_ns, since):
                job.episode = _declare(name, live, now_ns, self._silent(live, now_ns))
                changed.append(job.episode)
        return changed

    def excuse(self, now_ns: int) -> None:
        """The worker could not hear anyone up to ``now_ns`` (its broker unreachable, its
        process stalled): the silence of every rank until then says nothing about the
        job, and is not held against it. Without this, every rank of every job went
        silent at once with the broker, and the first tick after declared them all hung.
        An open episode still resolves only on real progress."""
        for job in self._jobs.values():
            job.excused_ns = max(job.excused_ns, now_ns)

    def knows(self, job: str) -> bool:
        return job in self._jobs

    def forget(self, job: str) -> None:
        """Drop ``job`` (its heartbeats now go to another worker)."""
        self._jobs.pop(job, None)

    def restore(
        self, job: str, episode: Episode | None, step_times: list[float] | None = None
    ) -> None:
        """``job`` as a restarted worker recalls it from the store: an open ``episode``
        resolves when a rank progresses past its ``last_progress_ns`` and is not declared
        again meanwhile; ``step_times`` are the recent step times behind the stall
        threshold (docs/detection.md, "After a restart")."""
        state = self._jobs.setdefault(job, _Job(step_times=deque(maxlen=self.config.step_window)))
        state.episode = episode
        state.step_times.extend(step_times or ())
        if step_times:  # a job recalled with its step times is past its warm-up
            state.steps_done = max(state.steps_done, self.config.warmup_steps)

    def step_times(self, job: str) -> list[float]:
        """The job's recent step times (what a restarted worker needs of its baseline)."""
        return list(self._jobs[job].step_times) if job in self._jobs else []

    def jobs(self) -> list[str]:
        return list(self._jobs)

    def last_heard_ns(self, job: str) -> int | None:
        """When the job's latest heartbeat came (None: none of its ranks beat yet)."""
        ranks = self._jobs[job].ranks.values() if job in self._jobs else ()
        return max((r.heard_ns for r in ranks), default=None)

    def episodes(self) -> list[Episode]:
        return [j.episode for j in self._jobs.values() if j.episode and j.episode.open]

    def resuming(self, episode: Episode) -> bool:
        """Some rank of the episode's job progressed past it: the episode resolves at the
        next evaluation, and what the ranks report now is no longer where they hung."""
        job = self._jobs.get(episode.job)
        ranks = job.ranks.values() if job is not None else ()
        return any(r.progress_ns > episode.last_progress_ns for r in ranks if not r.finished)

    def ranks(self, job: str) -> list[RankState]:
        return sorted(self._jobs[job].ranks.values(), key=lambda r: r.rank)

    # -- internals -------------------------------------------------------------------

    def _stalled(self, job: str, rank: RankState, now_ns: int, excused_ns: int = 0) -> bool:
        if rank.phase is not None:  # silent or not: a save may starve the beating thread
            _, since_ns, bound_s = rank.phase
            since = max(since_ns, rank.progress_ns, excused_ns)
            return now_ns - since > min(bound_s, self.config.max_phase_s) * NS
        silent = now_ns - max(rank.heard_ns, excused_ns) > self.config.silent_after_s * NS
        if silent or not rank.started:
            return silent
        return now_ns - max(rank.progress_ns, excused_ns) > self.threshold_s(job) * NS

    def _late(self, ranks: list[RankState], now_ns: int, excused_ns: int = 0) -> bool:
        """Some rank's heartbeat is overdue but it is not silent yet: wait for the verdict
        (at most half of ``silent_after_s``) rather than take its last report (waiting
        in a send, say) for where it is now."""
        age = [now_ns - max(r.heard_ns, excused_ns) for r in ranks]
        return any(
            self.config.silent_after_s * NS / 2 < a <= self.config.silent_after_s * NS for a in age
        )

    def _silent(self, ranks: list[RankState], now_ns: int) -> set[int]:
        limit = self.config.silent_after_s * NS
        return {r.rank for r in ranks if now_ns - r.heard_ns > limit}

    def _resolve(self, job: _Job, now_ns: int) -> Episode:
        assert job.episode is not None
        job.episode = _resolved(job.episode, now_ns)
        return job.episode

    @staticmethod
    def _note_step(job: _Job, rank: int, step: int, at_ns: int) -> None:
        first = job.first_step.setdefault(rank, step)
        job.steps_done = max(job.steps_done, step - first)
        seen = job.step_seen.get(rank)
        if seen is not None and step > seen[0] and at_ns > seen[1]:
            job.step_times.append((at_ns - seen[1]) / NS / (step - seen[0]))
        if seen is None or step > seen[0]:
            job.step_seen[rank] = (step, at_ns)


def _progress_ns(hb: Mapping[str, Any]) -> int | None:
    """The last time this rank started or finished an op, by its own report."""
    times = []
    if hb.get("in_flight"):
        times.append(int(hb["in_flight"]["since_ns"]))
    if hb.get("last_done"):
        times.append(int(hb["last_done"]["end_ns"]))
    return max(times) if times else None


def _declare(job: str, ranks: list[RankState], now_ns: int, silent: set[int]) -> Episode:
    waiting = sorted(r.rank for r in ranks if r.waiting and r.rank not in silent)
    mismatched = _mismatches(ranks, set(waiting))
    # a silent rank last seen waiting in communication is more likely collateral (its
    # launcher ended it) than the cause: the others lead, then by when progress stopped
    culprit_states = sorted(
        (r for r in ranks if r.rank not in waiting),
        key=lambda r: (r.waiting, r.progress_ns, r.rank),
    )
    if not culprit_states and mismatched:  # everyone waits: those away from their group
        away = {r.rank for m in mismatched for r in m.away}
        culprit_states = sorted(
            (r for r in ranks if r.rank in away), key=lambda r: (r.progress_ns, r.rank)
        )
        waiting = [w for w in waiting if w not in away]
    # who stopped first: the culprit whose progress ended earliest. A waiter may have
    # entered its receive before the culprit's last op ended, so the earliest progress
    # over all ranks can name a rank that was only waiting for it.
    first = min(ranks, key=lambda r: (r.progress_ns, r.rank))
    lead = culprit_states[0] if culprit_states else first
    suspects = _suspects(ranks, waiting, culprit_states)
    last_progress = max(r.progress_ns for r in ranks)
    key = f"{job}:{lead.rank}:{lead.progress_ns}".encode()
    episode_id = "hang-" + hashlib.sha1(key).hexdigest()[:16]
    where = _where(lead, lead.rank in silent)
    verb = _verb(lead, mismatched)
    summary = _summary(job, lead, f"{verb}, {where}", ranks, waiting, suspects)
    if mismatched:
        summary += "; " + "; ".join(m.text for m in mismatched)
    return Episode(
        job=job,
        episode_id=episode_id,
        declared_ns=now_ns,
        last_progress_ns=last_progress,
        step=min(r.step for r in ranks),
        culprits=tuple(r.rank for r in culprit_states),
        waiting=tuple(waiting),
        silent=tuple(sorted(silent)),
        suspects=suspects,
        first_stopped=lead.rank,
        culprit_hosts=tuple(dict.fromkeys(r.host for r in culprit_states)),
        culprit_where=where,
        summary=summary,
    )


@dataclass(frozen=True)
class _Mismatch:
    """A data-parallel group whose ranks all wait, in different collectives."""

    away: tuple[RankState, ...]
    """The ranks not in the group's collective (the most ranks', ties: the earliest)."""
    text: str
    tied: bool = False
    """No majority (a group of two split one and one): which side is wrong is not known."""


def _verb(lead: RankState, mismatched: list[_Mismatch]) -> str:
    """What the lead culprit did: a rank waiting away from its group's collective did not
    stop, and with no majority the alert must not pretend to know which side is wrong."""
    for m in mismatched:
        if lead.rank in {r.rank for r in m.away}:
            if m.tied:
                return "is split from its DP group (no majority: either side may be wrong)"
            if _in_dp_collective(lead):
                return "called another collective than its DP group"
            return "went on past its DP group's collective"
    return "stopped first"


def _mismatches(ranks: list[RankState], waiting: set[int]) -> list[_Mismatch]:
    """Each DP group (same stage, TP and CP rank) in which every rank waits in
    communication, some in a DP collective, and some other rank either in another DP
    collective (it called a different one) or already in a later step (it skipped the
    collective and went on): that rank, and the peers it left waiting. A peer still in
    the same step's pipeline receive is only behind, waiting for its input (collateral
    of a rank stopped upstream), not away from the collective."""
    groups: dict[tuple[int, int, int], list[RankState]] = {}
    for r in ranks:
        groups.setdefault(r.coords[1:], []).append(r)
    found = []
    for (pp, tp, cp), members in sorted(groups.items()):
        if len(members) < 2 or any(m.rank not in waiting for m in members):
            continue
        in_collective = [m for m in members if _in_dp_collective(m)]
        if not in_collective:
            continue
        keys = Counter(_op_key(m) for m in in_collective)
        expected = min(keys, key=lambda k: (-keys[k], k[0], str(k[1]), k[2]))
        away = [
            m
            for m in sorted(members, key=lambda m: m.rank)
            if _op_key(m) != expected and (_in_dp_collective(m) or m.step > expected[0])
        ]
        if not away:
            continue
        by_op: dict[tuple[Any, ...], list[RankState]] = {}
        for m in sorted(members, key=lambda m: m.rank):
            by_op.setdefault(_op_key(m), []).append(m)
        where = ", ".join(
            f"{_ranks_text(rs)} in {key[1]}_{key[2]} of step {key[0]}" for key, rs in by_op.items()
        )
        text = f"collective mismatch in the DP group of stage {pp} (tp {tp}, cp {cp}): {where}"
        tied = list(keys.values()).count(keys[expected]) > 1
        found.append(_Mismatch(tuple(away), text, tied))
    return found


def _in_dp_collective(rank: RankState) -> bool:
    return rank.in_flight is not None and rank.in_flight["optype"] in DP_COLLECTIVES


def _ranks_text(ranks: list[RankState]) -> str:
    names = ", ".join(str(r.rank) for r in ranks)
    return f"rank {names}" if len(ranks) == 1 else f"ranks {names}"


def _suspects(
    ranks: list[RankState], waiting: list[int], culprits: list[RankState]
) -> tuple[int, ...]:
    """Ranks absent from the op most waiters sit in, stopped-first order."""
    if not waiting:
        return tuple(r.rank for r in culprits)
    by_rank = {r.rank: r for r in ranks}
    ops = Counter(_op_key(by_rank[w]) for w in waiting)
    common, _ = ops.most_common(1)[0]
    absent = [r for r in ranks if not (r.waiting and _op_key(r) == common)]
    return tuple(r.rank for r in sorted(absent, key=lambda r: (r.progress_ns, r.rank)))


def _op_key(rank: RankState) -> tuple[Any, ...]:
    f = rank.in_flight or {}
    return (rank.step, f.get("optype"), f.get("seq_id"))


def _where(rank: RankState, silent: bool) -> str:
    if rank.phase is not None:
        name, _, bound_s = rank.phase
        return f"in its announced phase {name!r} past its bound ({bound_s:g} s) at step {rank.step}"
    if silent:
        return "silent: no heartbeat (process gone, stopped or unreachable)"
    if rank.in_flight:
        f = rank.in_flight
        return f"in {f['optype']}_{f['seq_id']} (microbatch {f['mb_id']}) of step {rank.step}"
    after = rank.last_done["optype"] if rank.last_done else "the start"
    return f"outside any timed op (Python) after {after} of step {rank.step}"


def _summary(
    job: str,
    lead: RankState,
    where: str,
    ranks: list[RankState],
    waiting: list[int],
    suspects: tuple[int, ...],
) -> str:
    dp, pp, tp, _ = lead.coords
    text = (
        f"job {job} hung: rank {lead.rank} (dp {dp}, pp {pp}, tp {tp}) on {lead.host} "
        f"{where}; {len(waiting)} of {len(ranks)} ranks wait in communication"
    )
    if suspects:
        text += f"; suspects: {', '.join(map(str, suspects[:8]))}"
    return text


def _resolved(episode: Episode, now_ns: int) -> Episode:
    return replace(episode, resolved_ns=now_ns)
