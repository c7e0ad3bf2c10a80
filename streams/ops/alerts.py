"""Straggler alerts: one group keeps slowing the job, well beyond its peers (pure).

Each analysed step is offered with its slowdown ``S`` and its attributions (``S_g``:
how slow the step would be if only group g kept its real durations). What makes a
straggler worth waking someone for (docs/detection.md, "4. Straggler alerts"):

- **one group explains the job's slowdown, step after step**: over the job's latest
  ``window`` analysed steps, at least ``chronic_share`` of them are explained by one
  worker, one stage or one DP rank (:mod:`~rankwatch.streams.ops.blame`; a step blamed
  on a worker counts for its stage and its DP rank too, so that a slow stage whose DP
  copies take turns at being the slower one is the stage's). The smallest such group
  is blamed, settled between a worker and its stage (DP rank) by the share of the
  excess its peers there carry (``peer_share``). On a healthy job the lead moves with
  the noise of the machine; it stays with a straggler;
- **and it stands out of the job's noise**: over the window, the median of how far the
  group's ``S_g`` is above the largest of its peers' (the other groups of its
  dimension, in the same step) is at least ``margin``. The peers carry the machine's
  noise in the same steps, so a busy box raises them all alike, and a worker slow from
  the job's first step stands out of them at once, where its own history would have
  learnt it as normal; and the window's median S is at least ``fire_at``.

An episode resolves when either stops holding with a margin (hysteresis): the group
explains less than ``clear_share`` of the window, or its lead over its peers falls
under half the margin; one whose blame moves to a group holding or held by its own
stays open, re-announced. Its ``alert_id`` names the job and the step that started it,
so the firing and the resolved message share it, and a re-analysis after a restart
produces the same id. The cause is where the blamed steps' slowdown sits: compute op
types, or communication (network), which must be borne out by a bandwidth drop on the
group's ranks; a GC, data-loader or hidden-CPU episode open on them names the cause
instead.

On main the alert fired on the mean S of as few as 2 steps over a fixed 1.10, and
blamed the group with the largest S_g, which is always a stage or a DP rank: healthy
jobs on this machine raised dozens of alerts, and a slow worker was blamed on its stage.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rankwatch.schemas.optypes import COMPUTING
from rankwatch.streams.ops.blame import SPREAD, StepBlame, step_blame
from rankwatch.streams.slowdown.diagnosis import host_cause

DIMENSIONS = ("worker", "stage", "dp_rank")
"""Dimensions an alert may blame, most specific first (op types are not to blame)."""
NAMES = {"worker": "worker", "dp_rank": "DP rank", "stage": "stage"}
NAMED = 8
"""A summary lists the blamed ranks and hosts up to this many ranks (the evidence, all)."""

Locate = Callable[[str, str], tuple[list[int], list[str]]]
"""(dimension, group) -> (global ranks, hosts) of a blamed group."""
Explain = Callable[[list[int]], frozenset[str] | None]
"""Global ranks -> the slowdown-signal kinds open on them now (None: the job sends no
signals)."""
Top = tuple[tuple[str, float], ...]
"""A dimension's two largest (group, S_g) of a step, largest first."""


@dataclass(frozen=True)
class AlertConfig:
    fire_at: float = 1.10
    """The window's median S must be at least this to fire."""
    clear_below: float = 1.05
    """An episode also resolves once the window's median S is under this."""
    margin: float = 0.15
    """How far the blamed group's S_g must stand above its largest peer's (median over
    the window) to fire; an episode resolves under half of it. Set on the tuning runs of
    ``benchmarks/study_alerts.py``: healthy jobs' chronic windows stood at most 0.11
    above their peers, the injected stragglers' at least 0.18 (docs/detection.md)."""
    window: int = 20
    """Analysed steps an alert looks at (full before it may fire)."""
    chronic_share: float = 0.7
    """Share of the window's steps one group must explain to be blamed."""
    clear_share: float = 0.4
    """Share under which a blamed group no longer holds an episode open."""
    peer_share: float = 0.5
    """A worker's stage (DP rank) is blamed rather than the worker when, in the window's
    steps blamed on that group, the slowest worker's strongest peer in it carries at
    least this share of the excess slowdown (weighted by each step's excess): a slow
    stage slows all its DP copies, one slow worker none of them. Half: on the tuning
    runs every value from 0.45 to 0.5 named every slow stage and slow worker right
    (0.4 and 0.55 did not; docs/detection.md, section 4)."""
    critical_at: float = 1.5
    """Median S from which a firing alert is critical rather than a warning."""

    def __post_init__(self) -> None:
        if not 0 < self.clear_share < self.chronic_share <= 1:
            raise ValueError("need 0 < clear_share < chronic_share <= 1")
        if self.window < 2:
            raise ValueError("window must be 2 steps at least")


@dataclass(frozen=True)
class Alert:
    """One alert message (alerts.v1) and its table row share these fields."""

    alert_id: str
    job: str
    state: str
    severity: str
    ts_ns: int
    summary: str
    evidence: dict[str, Any]

    def message(self) -> dict[str, Any]:
        return {
            "schema": "alerts",
            "version": 1,
            "alert_id": self.alert_id,
            "job": self.job,
            "kind": "straggler",
            "state": self.state,
            "severity": self.severity,
            "ts_ns": self.ts_ns,
            "summary": self.summary,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class StepMark:
    """What an alert keeps of one analysed step."""

    slowdown: float
    blame: StepBlame
    cause: str
    """compute, network, or "" (the step had no attribution)."""
    tops: Mapping[str, Top] = field(default_factory=dict)
    """Per blame dimension, its two largest S_g (what a group's lead over its peers is
    read from)."""
    peers: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """For "stage" and "dp_rank": the step's slowest worker's strongest peer in that
    group, and its S_w (whether the group is slow, or that worker alone)."""

    @property
    def top_worker(self) -> str:
        top = self.tops.get("worker", ())
        return top[0][0] if top else ""

    def peer_share(self, dimension: str) -> float:
        """The share of the step's excess slowdown the slowest worker's strongest peer
        in ``dimension`` carries alone (0: it has none, or the step is not slow)."""
        peer = self.peers.get(dimension)
        excess = self.slowdown - 1.0
        if peer is None or not excess > 0:
            return 0.0
        return max(0.0, (peer[1] - 1.0) / excess)

    def lead(self, key: tuple[str, str]) -> float:
        """How far group ``key``'s S_g stands above the largest of its peers' in this
        step (negative when a peer is ahead; a group not in the top two is at most as
        far behind as the second)."""
        top = self.tops.get(key[0], ())
        if not top:
            return 0.0
        if top[0][0] == key[1]:
            return top[0][1] - (top[1][1] if len(top) > 1 else 1.0)
        return (top[1][1] if len(top) > 1 else 1.0) - top[0][1]


@dataclass
class _JobAlerts:
    marks: dict[int, StepMark] = field(default_factory=dict)
    episode: str | None = None
    group: tuple[str, str] | None = None
    """The group the open episode blames."""
    last: Alert | None = None
    """The latest alert state this job sent (re-announced by a worker that takes the job
    over)."""


@dataclass(frozen=True)
class JobAlertState:
    """What :class:`StragglerAlerts` holds of one job, for another worker to go on from."""

    marks: dict[int, StepMark]
    episode: str | None
    group: tuple[str, str] | None
    last: Alert | None


@dataclass(frozen=True)
class _Verdict:
    """A window's reading of one group (or spread): the steps it explains, its median
    lead over its peers, the window's median S, and where its steps' slowdown sits."""

    dimension: str
    group: str
    led: int
    steps: int
    lead: float
    median: float
    cause: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.dimension, self.group)


@dataclass(frozen=True)
class _At:
    """The step being observed, and how to name a blamed group's ranks and cause."""

    job: str
    step: int
    start_ns: int
    slowdown: float
    locate: Locate | None
    explain: Explain | None


@dataclass
class StragglerAlerts:
    config: AlertConfig = field(default_factory=AlertConfig)
    _jobs: dict[str, _JobAlerts] = field(default_factory=dict)

    # -- state -------------------------------------------------------------------------

    def state(self, job: str) -> JobAlertState:
        state = self._jobs.get(job) or _JobAlerts()
        return JobAlertState(dict(state.marks), state.episode, state.group, state.last)

    def load(self, job: str, saved: JobAlertState) -> None:
        """Take over a job exactly as :meth:`state` described it (another worker's, or
        rebuilt from the store)."""
        state = self._jobs[job] = _JobAlerts()
        state.marks = dict(saved.marks)
        state.episode, state.group, state.last = saved.episode, saved.group, saved.last
        self._trim(state)

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    # -- steps -------------------------------------------------------------------------

    def observe(
        self,
        job: str,
        step: int,
        start_ns: int,
        slowdown: float,
        attributions: Iterable[tuple[str, str, float]],
        locate: Locate | None = None,
        explain: Explain | None = None,
    ) -> Alert | None:
        """Take one analysed step and its (dimension, group, S_g) attributions; return
        the alert it fires or resolves, if any. ``locate`` names a blamed group's ranks
        and hosts; ``explain`` the slowdown signals open on them (their cause: a GC
        pause inside a forward is timed as the forward's, and the what-if alone would
        call it compute; and whether their links slowed, for a network cause)."""
        state = self._jobs.setdefault(job, _JobAlerts())
        state.marks[step] = mark_of(slowdown, list(attributions))
        self._trim(state)
        window = sorted(s for s in state.marks if s <= step)[-self.config.window :]
        if len(window) < self.config.window:
            return None
        marks = [state.marks[s] for s in window]
        at = _At(job, step, start_ns, slowdown, locate, explain)
        if state.episode is None:
            verdict = self._read(marks)
            if not self._fires(verdict) or not _corroborated(at, verdict):
                return None
            state.episode = f"straggler:{job}:{step}"
            return self._fire(state, at, verdict)
        return self._go_on(state, at, marks)

    def _go_on(self, state: _JobAlerts, at: _At, marks: list[StepMark]) -> Alert | None:
        """An open episode after one more step: held, moved or resolved."""
        if state.group is None:  # an episode of an earlier rule: held while this one fires
            held = self._read(marks)
            if self._fires(held):
                state.group = held.key
                return None
        else:
            held = _verdict(marks, state.group)
            if not self._clears(held):
                return None
            moved = self._read(marks)
            if self._fires(moved) and _related(moved.key, state.group) and _corroborated(at, moved):
                return self._fire(state, at, moved)
        assert state.episode is not None
        evidence = self._evidence(at, held)
        alert_id, state.episode, state.group = state.episode, None, None
        summary = f"job {at.job} back to {held.median:.2f}x its straggler-free time"
        state.last = Alert(alert_id, at.job, "resolved", "info", at.start_ns, summary, evidence)
        return state.last

    def _fire(self, state: _JobAlerts, at: _At, verdict: _Verdict) -> Alert:
        """The firing message of the open episode, blaming ``verdict``'s group: at its
        start, and again (same id) when the episode moves to a group that holds or is
        held by the one it blamed (a slow stage first led by one of its workers): one
        fault, one episode."""
        assert state.episode is not None
        state.group = verdict.key
        evidence = self._evidence(at, verdict)
        shown = host_cause(_open_on(at, verdict) or frozenset())
        if shown:
            verdict = replace(verdict, cause=shown)
            evidence["cause"] = shown
        severity = "critical" if verdict.median >= self.config.critical_at else "warning"
        summary = _summary(at.job, verdict, evidence)
        state.last = Alert(
            state.episode, at.job, "firing", severity, at.start_ns, summary, evidence
        )
        return state.last

    # -- the rule ----------------------------------------------------------------------

    def _read(self, marks: list[StepMark]) -> _Verdict:
        """The smallest group the window's steps chronically blame, or spread."""
        cfg = self.config
        counts = _containing([m.blame for m in marks])
        key = _smallest_chronic(counts, cfg.chronic_share * len(marks))
        if key[0] != SPREAD:
            key = _settle(marks, key, cfg.peer_share)
        return _verdict(marks, key)

    def _fires(self, v: _Verdict) -> bool:
        cfg = self.config
        return v.dimension != SPREAD and v.lead >= cfg.margin and v.median >= cfg.fire_at

    def _clears(self, held: _Verdict) -> bool:
        cfg = self.config
        return (
            held.led < cfg.clear_share * held.steps
            or held.lead < cfg.margin / 2
            or held.median < cfg.clear_below
        )

    def _evidence(self, at: _At, v: _Verdict) -> dict[str, Any]:
        ranks, hosts = at.locate(v.dimension, v.group) if at.locate is not None else ([], [])
        return {
            "step": at.step,
            "step_slowdown": at.slowdown,
            "rolling_slowdown": v.median,
            "window_steps": v.steps,
            "lead_over_peers": v.lead,
            "threshold": self.config.margin,
            "blame": {
                "chronic": v.dimension != SPREAD,
                "dimension": v.dimension,
                "group": v.group,
                "steps_led": v.led,
                "steps": v.steps,
                "needed": math.ceil(self.config.chronic_share * v.steps),
            },
            "cause": v.cause,
            "ranks": ranks,
            "hosts": hosts,
        }

    def _trim(self, state: _JobAlerts) -> None:
        extra = len(state.marks) - 2 * self.config.window
        if extra > 0:
            for old in sorted(state.marks)[:extra]:
                del state.marks[old]


def mark_of(slowdown: float, attributions: list[tuple[str, str, float]]) -> StepMark:
    """What an alert keeps of a step: its S, its blame, where its slowdown sits and the
    two largest S_g of each blame dimension."""
    blame = step_blame(slowdown, attributions)
    optypes = [(g, v) for d, g, v in attributions if d == "optype"]
    cause = ""
    if optypes:
        top = max(optypes, key=lambda gv: gv[1])[0]
        cause = "compute" if top in COMPUTING else "network"
    tops: dict[str, Top] = {}
    for dimension in DIMENSIONS:
        mine = sorted(((v, g) for d, g, v in attributions if d == dimension), reverse=True)
        if mine:
            tops[dimension] = tuple((g, v) for v, g in mine[:2])
    return StepMark(slowdown, blame, cause, tops, _peers(tops, attributions))


def _peers(
    tops: Mapping[str, Top], attributions: list[tuple[str, str, float]]
) -> dict[str, tuple[str, float]]:
    """The slowest worker's strongest peer in its stage and in its DP rank."""
    if not tops.get("worker"):
        return {}
    d, p = tops["worker"][0][0].split(",")
    out: dict[str, tuple[str, float]] = {}
    for dimension, at, home in (("stage", 1, p), ("dp_rank", 0, d)):
        mine = [
            (v, g) for dim, g, v in attributions
            if dim == "worker" and g.split(",")[at] == home and g != f"{d},{p}"
        ]  # fmt: skip
        if mine:
            v, g = max(mine)
            out[dimension] = (g, v)
    return out


def _verdict(marks: list[StepMark], key: tuple[str, str]) -> _Verdict:
    median = statistics.median(m.slowdown for m in marks)
    if key[0] == SPREAD:
        return _Verdict(SPREAD, "", 0, len(marks), 0.0, median, "")
    mine = [m for m in marks if _inside(m.blame, key)]
    lead = statistics.median(m.lead(key) for m in marks)
    causes = Counter(m.cause for m in mine if m.cause)
    cause = causes.most_common(1)[0][0] if causes else ""
    return _Verdict(key[0], key[1], len(mine), len(marks), lead, median, cause)


def _open_on(at: _At, v: _Verdict) -> frozenset[str] | None:
    """The slowdown-signal kinds open on the ranks of ``v``'s group (None: unknown)."""
    if at.explain is None or at.locate is None:
        return None
    return at.explain(at.locate(v.dimension, v.group)[0])


def _corroborated(at: _At, v: _Verdict) -> bool:
    """Whether the group's own signals bear a network cause out: the what-if puts its
    excess in communication, and its links' bandwidth dropped. Without that it is
    waiting, not transfer (a core shared with another process slows gloo's collectives
    on the ranks on it: 1 of 3 busy tuning runs blamed DP rank 0, "network", before any
    fault). A job that sends no signals is taken at the what-if's word."""
    if v.cause != "network":
        return True
    kinds = _open_on(at, v)
    return kinds is None or "bandwidth-drop" in kinds


def _carried(marks: list[StepMark], dimension: str) -> float:
    """The share of these steps' excess slowdown that their slowest workers' peers in
    ``dimension`` carry, weighted by each step's excess: the steps a fault slowed count
    for more than the noise of the steps before it."""
    excess = sum(max(0.0, m.slowdown - 1.0) for m in marks)
    if not excess > 0:
        return 0.0
    return sum(m.peer_share(dimension) * max(0.0, m.slowdown - 1.0) for m in marks) / excess


def _related(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether one group holds the other (a worker and its stage or DP rank)."""
    return a != b and (_inside(StepBlame(*a), b) or _inside(StepBlame(*b), a))


def _inside(blame: StepBlame, key: tuple[str, str]) -> bool:
    """Whether a step blamed on ``blame`` counts for group ``key`` (a worker counts for
    its stage and its DP rank)."""
    if blame.key == key:
        return True
    if blame.dimension != "worker" or key[0] not in ("stage", "dp_rank"):
        return False
    d, p = blame.group.split(",")
    return key[1] == (p if key[0] == "stage" else d)


def _containing(blames: list[StepBlame]) -> Counter[tuple[str, str]]:
    """Per group, the steps it or a group inside it is blamed for."""
    out: Counter[tuple[str, str]] = Counter()
    for b in blames:
        if b.dimension == SPREAD:
            continue
        out[b.key] += 1
        if b.dimension == "worker":
            d, p = b.group.split(",")
            out[("stage", p)] += 1
            out[("dp_rank", d)] += 1
    return out


def _smallest_chronic(counts: Mapping[tuple[str, str], int], needed: float) -> tuple[str, str]:
    """The most specific group counted in at least ``needed`` steps (the most counted
    among several of a dimension), or spread."""
    for dimension in DIMENSIONS:
        mine = [(n, g) for (d, g), n in counts.items() if d == dimension and n >= needed]
        if mine:
            return dimension, max(mine)[1]
    return SPREAD, ""


def _settle(marks: list[StepMark], key: tuple[str, str], share: float) -> tuple[str, str]:
    """A chronic worker, stage or DP rank settled on the group that is slow: the stage
    (DP rank) when, in the steps blamed on it or a worker of it, the slowest worker's
    peer in it carries ``share`` of the excess too (a slow stage's DP copies take turns
    at being the slower one), else the one worker that leads those steps."""
    dimensions = ("stage", "dp_rank") if key[0] == "worker" else (key[0],)
    for dimension in dimensions:
        at = 1 if dimension == "stage" else 0
        home = key[1].split(",")[at] if key[0] == "worker" else key[1]
        led = [
            m for m in marks
            if _inside(m.blame, (dimension, home)) and m.top_worker.split(",")[at] == home
        ]  # fmt: skip
        if not led:
            continue
        if _carried(led, dimension) >= share:
            return (dimension, home)
        if key[0] != "worker":
            return ("worker", Counter(m.top_worker for m in led).most_common(1)[0][0])
    return key


def _summary(job: str, v: _Verdict, evidence: Mapping[str, Any]) -> str:
    where = ""
    ranks, hosts = evidence.get("ranks") or [], evidence.get("hosts") or []
    if len(ranks) > NAMED:
        where = f" ({len(ranks)} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''})"
    elif ranks:
        where = f" (rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}"
        where += f" on {', '.join(hosts)})" if hosts else ")"
    cause = f", in {v.cause}" if v.cause else ""
    return (
        f"job {job} runs {v.median:.2f}x its straggler-free time: {NAMES[v.dimension]}"
        f" {v.group}{where} explains {v.led} of its last {v.steps} steps{cause},"
        f" {v.lead:+.2f} over its peers"
    )


def _ranges(ranks: list[int]) -> str:
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
