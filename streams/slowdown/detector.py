"""Anomalies of the slowdown signals against the job's own history (pure).

Per job, rank and signal, the baseline is the rolling median of the rank's latest
``window`` values taken while no episode of that kind was open on it, each admitted
``open_within`` steps late, once it is clear that no episode grew out of it (a fault
does not become its own yardstick, and a signal that swings between two levels keeps
both in its baseline); a value is judged once ``warmup`` of them exist. The rules
(docs/detection.md, section 3, says why these numbers):

========================  =======================================================
``flops-drop``            FLOP/s under ``flops_drop`` x baseline (alerted only when
                          also under it against the stage's other ranks now, and
                          beyond the change all its peers share)
``bandwidth-drop``        bus bandwidth under ``bandwidth_drop`` x baseline (alerted
                          only beyond the change all its peers share)
``throughput-drop``       the job's median throughput under ``throughput_drop`` x
                          baseline (judged once per step, rank -1, against the
                          job's last ``job_window`` healthy steps, once
                          ``job_warmup`` exist)
``void-high``             hidden inter-step share (``v_inter`` less data waits and
                          GC) or untimed share inside the step (``v_minority``)
                          above ``max(floor, baseline + margin)``
``gc-pauses``             GC share of the step above ``max(floor, baseline + margin)``
``dataloader-bound``      data-wait share above ``max(floor, baseline + margin)``
``issue-stall``           issue-latency p99 above ``issue_ratio`` x baseline and
                          ``issue_floor_us`` over it (GPU only; off unless
                          ``issue_stall``: the faults it is meant for did not move it
                          reliably on an H100, docs/detection.md)
========================  =======================================================

Episodes: a rank's episode of a kind opens once ``open_after`` of its last
``open_within`` steps were anomalous and closes after ``close_after`` normal ones in a
row. One alert per job and kind: it fires when
the first rank opens and resolves when the last one closes; its ``alert_id`` names the
job, the kind and the step it fired at.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankwatch.streams.slowdown.diagnosis import CAUSES
from rankwatch.streams.slowdown.signals import Signals

KINDS = (
    "flops-drop",
    "bandwidth-drop",
    "issue-stall",
    "void-high",
    "gc-pauses",
    "dataloader-bound",
    "throughput-drop",
)
RATES = frozenset(("flops-drop", "bandwidth-drop", "throughput-drop", "issue-stall"))
"""Kinds whose signal is a rate: its noise is a factor, so its band is taken on logs."""
PEER_RELATIVE = ("flops-drop", "bandwidth-drop")
"""Rank rates also judged against the rank's peers in the same step: a rank's FLOP/s or
bandwidth drop is its own only when it fell beyond the change its peers share
(:meth:`SlowdownDetector._common`), and, for FLOP/s, when it is now under the same
ratio of its stage's other ranks' (:func:`_stage_peers`), which do the same work."""
JOB_RANK = -1
"""The pseudo-rank of job-level signals (throughput)."""


@dataclass(frozen=True)
class DetectorConfig:
    window: int = 20
    warmup: int = 5
    open_after: int = 10
    open_within: int = 10
    """An episode opens once ``open_after`` of the last ``open_within`` steps were
    anomalous (10 of 10: ten in a row; ``open_after`` may not exceed ``open_within``).
    Longer than any run seen on a healthy job: a loopback all-reduce on shared cores
    fell under the bandwidth bar, beyond its peers' change, for exactly five steps in
    one of the fourth study's 40 healthy runs (5 in a row was the rule then; 4 had let
    a preempted rank through), and a busy healthy tuning run's throughput stayed under
    0.6 of its baseline for 8 (the fifth study's ``tune5``). One length
    for every kind, so a cause never opens after the symptoms it explains (a slow
    link's lowered FLOP/s, the job's throughput) and never pages beside them
    (docs/detection.md, section 3)."""
    close_after: int = 3
    noise_k: float = 2.0
    """A value is anomalous only when, besides its rule, it lies more than this many
    robust standard deviations (1.4826 x MAD; of logs for rates) of the rank's own
    baseline values away from their median: a rule's fixed ratio is set for a quiet
    GPU, and on a shared, noisy host the job's own noise band is the wider one. Two
    deviations, set by reasoning, not tuned (docs/detection.md, section 3)."""
    flops_drop: float = 0.55
    bandwidth_drop: float = 0.25
    """Under a quarter of the baseline. On the second study's tuning runs (episodes
    opened after 5 steps then) the deepest five-step dip of a healthy rank's bus
    bandwidth, its peers' shared change taken out, was 0.38 of its baseline, the
    shallowest rate-limited link 0.15: a quarter lies between, about their geometric
    mean (docs/detection.md, section 3)."""
    throughput_drop: float = 0.5
    """Half the job's usual throughput. A symptom: the job is slower, not why. Held for
    ten steps, a healthy busy tuning run went as low as 0.61 of its baseline (the fifth
    study's set ``tune5``), so 0.6 left no margin; a job at half speed is worth a page
    (docs/detection.md, section 3)."""
    job_window: int = 100
    job_warmup: int = 20
    """The job's throughput (one series, the median over its ranks) gets a longer
    baseline and warm-up than a rank's signals: it moves with the whole box, which holds
    a level for tens of steps (a busy host's spare core moving between ranks), and a
    job's first steps run at no level it keeps (docs/detection.md, section 3)."""
    void_floor: float = 0.15
    void_margin: float = 0.10
    gc_floor: float = 0.05
    gc_margin: float = 0.05
    data_floor: float = 0.10
    data_margin: float = 0.10
    issue_ratio: float = 4.0
    issue_floor_us: float = 100.0
    issue_stall: bool = False
    """Judge ``issue-stall`` at all. Off by default: on H100s a host stall that made
    host-bound steps 20-60% longer raised their p99 issue latency past the rule in one
    run of seven, and where the device is the bottleneck the latency is the launch
    queue's depth, which the faults shorten (docs/detection.md, section 3)."""

    def __post_init__(self) -> None:
        if not 1 <= self.open_after <= self.open_within:
            raise ValueError("need 1 <= open_after <= open_within (10 and 10: ten in a row)")


@dataclass(frozen=True)
class Finding:
    """One kind's verdict for one rank (or the job) in one step."""

    kind: str
    rank: int
    value: float
    baseline: float | None
    anomalous: bool
    alone: bool | None = None
    """For :data:`PEER_RELATIVE` kinds: anomalous still once the change its peers
    share in the step is taken out (None: the same as ``anomalous``)."""


@dataclass
class _Track:
    """One (rank, signal) series: its healthy history and its episode state."""

    history: deque[float]
    recent: deque[bool]
    """Whether each of the latest steps was anomalous (while closed)."""
    alone: _Episode
    """The episode of the rank standing out of its peers (:data:`PEER_RELATIVE`
    kinds): the one an alert is raised for (its ``recent`` as long as ``recent``)."""
    run: int = 0  # normal steps in a row while open
    open: bool = False
    pending: deque[float] = field(default_factory=deque)
    """The latest values, not in ``history`` yet: each is admitted once ``open_within``
    newer steps went by without an episode growing out of it."""


@dataclass
class _Episode:
    """Hysteresis alone, for the peer-relative verdict."""

    recent: deque[bool]
    run: int = 0
    open: bool = False


@dataclass
class SlowdownAlert:
    job: str
    kind: str
    state: str
    step: int
    ts_ns: int
    ranks: tuple[int, ...]
    evidence: dict[str, Any]

    @property
    def alert_id(self) -> str:
        return f"{self.kind}:{self.job}:{self.evidence['fired_at_step']}"

    def message(self) -> dict[str, Any]:
        """The ``alerts`` v2 message."""
        return {
            "schema": "alerts",
            "version": 2,
            "alert_id": self.alert_id,
            "job": self.job,
            "kind": self.kind,
            "state": self.state,
            "severity": "warning",
            "ts_ns": self.ts_ns,
            "summary": _summary(self),
            "evidence": {**self.evidence, "ranks": list(self.evidence["ranks"])},
        }


def _summary(alert: SlowdownAlert) -> str:
    who = "the job" if alert.ranks == (JOB_RANK,) else f"ranks {_ranges(alert.ranks)}"
    verb = "since" if alert.state == "firing" else "ended at"
    e = alert.evidence
    figures = ""
    if e.get("value") is not None and e.get("baseline") is not None:
        figures = f": {e['signal']} {e['value']:.4g} against {e['baseline']:.4g}"
    return f"{alert.job}: {alert.kind} on {who} {verb} step {alert.step}{figures}"


def _ranges(ranks: Sequence[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


SIGNAL_OF: dict[str, str] = {
    "flops-drop": "flops_per_s",
    "bandwidth-drop": "busbw",
    "throughput-drop": "throughput",
    "void-high": "void",
    "gc-pauses": "gc_share",
    "dataloader-bound": "data_share",
    "issue-stall": "issue_p99_us",
}


@dataclass
class _Job:
    tracks: dict[tuple[str, int], _Track] = field(default_factory=dict)
    alerts: dict[str, SlowdownAlert] = field(default_factory=dict)
    """kind -> its firing alert."""


class SlowdownDetector:
    """Feed each step's signals (all ranks of one job); get findings and alerts."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._jobs: dict[str, _Job] = {}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def open_kinds(self, job: str, ranks: Sequence[int]) -> frozenset[str] | None:
        """The kinds with an episode open now on any of ``ranks`` of ``job`` (None: the
        job has sent no signals, so none can say)."""
        held = self._jobs.get(job)
        if held is None or not held.tracks:
            return None
        wanted = set(ranks)
        return frozenset(
            kind for (kind, rank), t in held.tracks.items() if t.open and rank in wanted
        )

    def state(self, job: str) -> dict[str, Any] | None:
        """The job's baselines, episodes and firing alerts as plain values (None: the
        job has no signals yet), for another worker to go on from (:meth:`load`)."""
        held = self._jobs.get(job)
        if held is None:
            return None
        tracks = [
            {
                "kind": kind,
                "rank": rank,
                "history": list(t.history),
                "recent": list(t.recent),
                "pending": list(t.pending),
                "run": t.run,
                "open": t.open,
                "alone": {"recent": list(t.alone.recent), "run": t.alone.run, "open": t.alone.open},
            }
            for (kind, rank), t in held.tracks.items()
        ]
        return {"tracks": tracks, "alerts": [a.message() for a in held.alerts.values()]}

    def load(self, job: str, state: Mapping[str, Any]) -> None:
        """Take over a job exactly as :meth:`state` described it. Raises ValueError
        (KeyError, TypeError) on a state that is not one, and then changes nothing."""
        c = self.config
        held = _Job()
        for t in state["tracks"]:
            if t["kind"] not in KINDS or not isinstance(t["rank"], int) or t["rank"] < JOB_RANK:
                raise ValueError(f"bad track {t.get('kind')!r} of rank {t.get('rank')!r}")
            if len(t["pending"]) > c.open_within or not all(
                isinstance(v, bool) for v in (*t["recent"], t["open"])
            ):
                raise ValueError(f"bad track {t['kind']!r} of rank {t['rank']}")
            if t["kind"] == "issue-stall" and not c.issue_stall:
                continue  # not judged here: its firing alert resolves at the next step
            alone = t.get("alone", t)  # a state from before the peer verdict: the same
            if not all(isinstance(v, bool) for v in (*alone["recent"], alone["open"])):
                raise ValueError(f"bad track {t['kind']!r} of rank {t['rank']}")
            held.tracks[(t["kind"], t["rank"])] = _Track(
                history=deque(map(_number, t["history"]), maxlen=self._window(t["rank"])),
                recent=deque(t["recent"], maxlen=c.open_within),
                run=int(t["run"]),
                open=t["open"],
                pending=deque(map(_number, t["pending"])),
                alone=_Episode(
                    deque(alone["recent"], maxlen=c.open_within), int(alone["run"]), alone["open"]
                ),
            )
        held.alerts = {a["kind"]: _held(a) for a in state["alerts"] if a["kind"] in KINDS}
        self._jobs[job] = held

    def restore(
        self,
        steps: Sequence[tuple[Sequence[Signals], Mapping[int, Sequence[str]]]],
        firing: Sequence[Mapping[str, Any]],
    ) -> None:
        """A job's state after a restart, from what was stored: its latest steps'
        signals with the kinds open on each rank (oldest first), and its slowdown alerts
        still firing (alert messages). Baselines are rebuilt by judging the stored steps
        again (alerts discarded), which also rebuilds the run toward an episode not open
        yet; then each episode is set open exactly where the last stored step had it,
        and each firing alert is held as it was sent, so no second firing alert goes out
        and its resolved one keeps its ``alert_id``."""
        if not steps:
            return
        name = steps[0][0][0].job
        self.forget(name)
        for signals, _ in steps:
            self.observe(signals)
        job = self._jobs[name]
        last_signals, last_open = steps[-1]
        ranks = {s.rank for s in last_signals} | {JOB_RANK}
        for (kind, rank), track in job.tracks.items():
            if rank not in ranks:
                continue
            stored = kind in last_open.get(rank, ())
            if kind in PEER_RELATIVE:
                self._restore_peer(track, stored, _everyone(kind, last_open, ranks - {JOB_RANK}))
            elif track.open != stored:  # the stored verdict wins
                track.open, track.run = stored, 0
                track.recent.clear()
        job.alerts = {a["kind"]: _held(a) for a in firing if a["kind"] in KINDS}
        for kind, alert in job.alerts.items():  # job-level episodes live in alerts only
            held = job.tracks.get((kind, JOB_RANK))
            if held is not None and JOB_RANK in alert.ranks:
                held.open = True

    def _restore_peer(self, track: _Track, stored: bool, everyone: bool) -> None:
        """A peer-judged episode back from the stored rows, which hold it where the
        rank stood out of its peers, or where every rank of the step had it open: the
        rank's own episode is open wherever the row has the kind (elsewhere it is as the
        stored steps rebuilt it), and its peer episode is open exactly where it stood
        out."""
        fresh = _Episode(deque(maxlen=self.config.open_within))
        if stored and not track.open:
            track.open, track.run = True, 0
            track.recent.clear()
        alone = stored and not everyone
        if track.alone.open != alone:
            track.alone = fresh if not alone else _Episode(fresh.recent, 0, True)

    def observe(
        self, signals: Sequence[Signals]
    ) -> tuple[dict[int, list[str]], list[SlowdownAlert]]:
        """(rank -> kinds whose episode stands for it at this step, alert state
        changes). For :data:`PEER_RELATIVE` kinds an episode stands for the rank when it
        stands out of its peers, or when every rank of the step has its own open (the
        job as a whole fell: "everyone-slow" to ``diagnose``); not when it fell alone
        against its own past but not against its peers, the noise of a shared host."""
        if not signals:
            return {}, []
        job = self._jobs.setdefault(signals[0].job, _Job())
        common = {kind: self._common(job, kind, signals) for kind in PEER_RELATIVE}
        stage = _stage_peers(signals)
        findings = [f for s in signals for f in self._rank_findings(job, s, common, stage)]
        findings += self._job_findings(job, signals)
        open_now: dict[int, list[str]] = {}
        standing: dict[int, list[str]] = {}
        for f in findings:
            if self._advance(job, f):
                open_now.setdefault(f.rank, []).append(f.kind)
            if self._advance_alone(job, f):
                standing.setdefault(f.rank, []).append(f.kind)
        last = max(signals, key=lambda s: s.start_ns)
        explained = _explained(standing, {s.rank: (s.dp_rank, s.pp_rank) for s in signals})
        alerts = self._alerts(job, signals[0].job, last.step, last.start_ns, explained, findings)
        return _shown(open_now, standing, {s.rank for s in signals}), alerts

    # -- findings ----------------------------------------------------------------------

    def _common(self, job: _Job, kind: str, signals: Sequence[Signals]) -> dict[int, float]:
        """Per rank, the median over the *other* ranks of the step of their value's
        ratio to their own baseline: what every rank of the job feels at once (the
        host's load, a job-wide phase) rather than this rank alone. Ranks without a
        baseline yet are left out; a rank with no such peer gets 1."""
        attr = SIGNAL_OF[kind]
        ranks, ratios = [], []
        for s in signals:
            value = getattr(s, attr)
            track = job.tracks.get((kind, s.rank))
            if value is None or track is None or len(track.history) < self.config.warmup:
                continue
            base = statistics.median(track.history)
            if value > 0 and base > 0:
                ranks.append(s.rank)
                ratios.append(value / base)
        return dict(zip(ranks, _others_median(ratios), strict=True))

    def _rank_findings(
        self,
        job: _Job,
        s: Signals,
        common: Mapping[str, Mapping[int, float]],
        stage: Mapping[int, float],
    ) -> list[Finding]:
        c = self.config
        out = []
        drops = (
            ("flops-drop", s.flops_per_s, c.flops_drop),
            ("bandwidth-drop", s.busbw, c.bandwidth_drop),
        )
        for kind, value, ratio in drops:
            if value is not None:
                scale = common[kind].get(s.rank, 1.0)
                peer = stage.get(s.rank) if kind == "flops-drop" else None
                out.append(self._judge(job, kind, s.rank, value, _below(ratio), scale, peer))
        void = max(s.v_hidden, s.v_minority)
        out.append(self._judge(job, "void-high", s.rank, void, _above(c.void_floor, c.void_margin)))
        out.append(
            self._judge(job, "gc-pauses", s.rank, s.gc_share, _above(c.gc_floor, c.gc_margin))
        )
        out.append(
            self._judge(
                job, "dataloader-bound", s.rank, s.data_share, _above(c.data_floor, c.data_margin)
            )
        )
        if c.issue_stall and s.issue_p99_us is not None:
            out.append(
                self._judge(
                    job,
                    "issue-stall",
                    s.rank,
                    s.issue_p99_us,
                    lambda v, b: v > c.issue_ratio * b and v > b + c.issue_floor_us,
                )
            )
        return [f for f in out if f is not None]

    def _job_findings(self, job: _Job, signals: Sequence[Signals]) -> list[Finding]:
        values = [s.throughput for s in signals if s.throughput is not None]
        if not values:
            return []
        ratio = self.config.throughput_drop
        f = self._judge(
            job, "throughput-drop", JOB_RANK, statistics.median(values), lambda v, b: v < ratio * b
        )
        return [f] if f is not None else []

    def _judge(
        self,
        job: _Job,
        kind: str,
        rank: int,
        value: float,
        bad: Callable[[float, float], bool],
        scale: float = 1.0,
        peer: float | None = None,
    ) -> Finding | None:
        """The finding of ``value`` against the rank's baseline; for the peer verdict
        (``alone``) judged again after dividing it by ``scale``, the change its peers
        share (:meth:`_common`), and, given ``peer`` (its stage's other ranks' value
        now), only while it is also under the rule against that. A rank that ran
        alone on a core early on had a high baseline; back among its peers, it fell
        against its past and not against them (a busy tuning run's only false alarm).
        The finding keeps the raw value."""
        track = job.tracks.get((kind, rank))
        if track is None:
            track = job.tracks[(kind, rank)] = _Track(
                deque(maxlen=self._window(rank)),
                deque(maxlen=self.config.open_within),
                alone=_Episode(deque(maxlen=self.config.open_within)),
            )
        if len(track.history) < self._warmup(rank):
            track.history.append(value)
            return None
        base = statistics.median(track.history)
        anomalous = bad(value, base) and self._outside_noise(kind, value, track.history)
        if kind not in PEER_RELATIVE:
            return Finding(kind, rank, value, base, anomalous)
        own = value / scale if scale > 0 else value
        alone = anomalous and bad(own, base) and self._outside_noise(kind, own, track.history)
        alone = alone and (peer is None or bad(value, peer))
        return Finding(kind, rank, value, base, anomalous, alone)

    def _window(self, rank: int) -> int:
        return self.config.job_window if rank == JOB_RANK else self.config.window

    def _warmup(self, rank: int) -> int:
        return self.config.job_warmup if rank == JOB_RANK else self.config.warmup

    def _outside_noise(self, kind: str, value: float, history: deque[float]) -> bool:
        """Whether ``value`` lies outside the noise band of the rank's baseline values:
        rates (FLOP/s, bandwidth, throughput, latency) on a log scale, where their
        noise is a factor; shares of the step on their own scale."""
        k = self.config.noise_k
        if kind not in RATES:
            return abs(value - statistics.median(history)) > k * _spread(history)
        logs = [math.log(v) for v in history if v > 0]
        if not logs or not value > 0:
            return True
        return abs(math.log(value) - statistics.median(logs)) > k * _spread(logs)

    # -- episodes ----------------------------------------------------------------------

    def _advance(self, job: _Job, f: Finding) -> bool:
        """Move the (kind, rank) episode on by one step; whether it is open after it."""
        c = self.config
        track = job.tracks[(f.kind, f.rank)]
        if not track.open:
            track.recent.append(f.anomalous)
            if sum(track.recent) >= c.open_after:
                track.open, track.run = True, 0
                track.recent.clear()
                track.pending.clear()  # the episode's first steps: not a yardstick
            else:
                self._admit_later(track, f.value)
        else:
            track.run = track.run + 1 if not f.anomalous else 0
            if track.run >= c.close_after:
                track.open, track.run = False, 0
        return track.open

    def _advance_alone(self, job: _Job, f: Finding) -> bool:
        """The same hysteresis for the rank standing out of its peers (a step that does
        is anomalous too, so this episode opens only where the rank's own does, and
        closes no later): whether the kind's alert stands for this rank now."""
        track = job.tracks[(f.kind, f.rank)]
        if f.alone is None:
            return track.open
        e, c = track.alone, self.config
        if not e.open:
            e.recent.append(f.alone)
            if sum(e.recent) >= c.open_after:
                e.open, e.run = True, 0
                e.recent.clear()
        else:
            e.run = e.run + 1 if not f.alone else 0
            if e.run >= c.close_after:
                e.open, e.run = False, 0
        return e.open

    def _admit_later(self, track: _Track, value: float) -> None:
        """Delayed admission to the baseline: every value outside an episode counts, so
        a signal that swings between two levels (loopback bandwidth on shared cores)
        keeps both in its median, but only once no episode grew out of it, so a fault's
        first steps never become its own yardstick."""
        track.pending.append(value)
        if len(track.pending) > self.config.open_within:
            track.history.append(track.pending.popleft())

    def _alerts(
        self,
        job: _Job,
        name: str,
        step: int,
        ts_ns: int,
        open_now: dict[int, list[str]],
        findings: Sequence[Finding],
    ) -> list[SlowdownAlert]:
        out = []
        for kind in KINDS:
            ranks = tuple(sorted(r for r, kinds in open_now.items() if kind in kinds))
            firing = job.alerts.get(kind)
            if ranks and firing is None:
                alert = SlowdownAlert(
                    name, kind, "firing", step, ts_ns, ranks, _evidence(kind, ranks, findings, step)
                )
                job.alerts[kind] = alert
                out.append(alert)
            elif ranks and firing is not None:
                seen = set(firing.evidence["ranks"]) | set(ranks)
                firing.evidence = {**firing.evidence, "ranks": sorted(seen)}
            elif not ranks and firing is not None:
                del job.alerts[kind]
                evidence = {**firing.evidence, "resolved_at_step": step}
                out.append(
                    SlowdownAlert(
                        name, kind, "resolved", step, ts_ns, tuple(evidence["ranks"]), evidence
                    )
                )
        return out


ORDER = [kind for kind, _ in CAUSES]
"""Kinds that are causes, each before the kinds it can produce as symptoms."""


def _explained(
    open_now: Mapping[int, list[str]], coords: Mapping[int, tuple[int, int]]
) -> dict[int, list[str]]:
    """The episodes an alert stands for: ``open_now`` less each kind open on a rank
    whose own or whose neighbours' open episodes include a kind that can cause it (a GC
    pause lowers its rank's FLOP/s; a slow link, the compute of both ranks it joins, on
    a host where gloo's transfers share the cores), and less the job's throughput while
    any rank's episode says why it dropped: one fault, one alert, naming its cause.
    Neighbours: the ranks of the same stage (the DP collectives) and the adjacent stages
    of the same DP rank (the pipeline's sends)."""
    by_stage: dict[int, set[str]] = {}
    by_worker: dict[tuple[int, int], set[str]] = {}
    for rank, kinds in open_now.items():
        if rank in coords:
            d, p = coords[rank]
            by_stage.setdefault(p, set()).update(kinds)
            by_worker.setdefault((d, p), set()).update(kinds)
    out: dict[int, list[str]] = {}
    for rank, kinds in open_now.items():
        near = set(kinds)
        if rank in coords:
            d, p = coords[rank]
            near |= by_stage.get(p, set())
            near |= by_worker.get((d, p - 1), set()) | by_worker.get((d, p + 1), set())
        kept = [k for k in kinds if not _caused(k, near)]
        if kept:
            out[rank] = kept
    if any(k != "throughput-drop" for r, kinds in out.items() if r != JOB_RANK for k in kinds):
        out.pop(JOB_RANK, None)
    return out


def _caused(kind: str, near: set[str]) -> bool:
    """Whether an open episode of a kind before ``kind`` in :data:`ORDER` explains it."""
    return kind in ORDER and bool(near & set(ORDER[: ORDER.index(kind)]))


def _held(message: Mapping[str, Any]) -> SlowdownAlert:
    """A stored firing alert back as the one the detector holds."""
    e = dict(message["evidence"])
    return SlowdownAlert(
        message["job"],
        message["kind"],
        "firing",
        int(e["fired_at_step"]),
        int(message["ts_ns"]),
        tuple(e["ranks"]),
        e,
    )


def _number(value: float | None) -> float:
    """A value read back from JSON, where NaN travels as null."""
    return math.nan if value is None else float(value)


def _spread(values: Sequence[float] | deque[float]) -> float:
    """A robust standard deviation of ``values``: 1.4826 x their median absolute
    deviation (a few outliers in the baseline do not widen it)."""
    center = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - center) for v in values)


def _shown(
    open_now: Mapping[int, list[str]], standing: Mapping[int, list[str]], ranks: set[int]
) -> dict[int, list[str]]:
    """The kinds a rank's row holds: those standing for it, and each peer-judged kind
    whose own episode every rank of the step has open."""
    shared = [
        k for k in PEER_RELATIVE if len(ranks) > 1 and all(k in open_now.get(r, ()) for r in ranks)
    ]
    out: dict[int, list[str]] = {}
    for rank in sorted(set(open_now) | set(standing)):
        kinds = list(standing.get(rank, []))
        kinds += [k for k in shared if k not in kinds and rank != JOB_RANK]
        if kinds:
            out[rank] = kinds
    return out


def _everyone(kind: str, stored: Mapping[int, Sequence[str]], ranks: set[int]) -> bool:
    """Whether every rank's stored row holds ``kind`` (so it may be the job's shared
    episode, not one rank standing out)."""
    return len(ranks) > 1 and all(kind in stored.get(r, ()) for r in ranks)


def _stage_peers(signals: Sequence[Signals]) -> dict[int, float]:
    """Per rank, the median FLOP/s of the other ranks of its pipeline stage in this step
    (its data-parallel copies: the same layers on the same shapes); ranks alone in
    their stage are left out."""
    by_stage: dict[int, list[Signals]] = {}
    for s in signals:
        if s.flops_per_s is not None and s.flops_per_s > 0:
            by_stage.setdefault(s.pp_rank, []).append(s)
    out: dict[int, float] = {}
    for members in by_stage.values():
        if len(members) > 1:
            medians = _others_median([m.flops_per_s or 0.0 for m in members])
            out.update(zip((m.rank for m in members), medians, strict=True))
    return out


def _others_median(values: Sequence[float]) -> list[float]:
    """For each value, the median of the others (1.0 where there are none), in
    O(n log n): sorted once, each median is read at the positions that dropping one
    element leaves in the middle."""
    n = len(values)
    if n < 2:
        return [1.0] * n
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    where = {i: k for k, i in enumerate(order)}
    m = n - 1
    out = []
    for i in range(n):
        k = where[i]
        lo, hi = ((q if q < k else q + 1) for q in ((m - 1) // 2, m // 2))
        out.append((ranked[lo] + ranked[hi]) / 2)
    return out


def _below(ratio: float) -> Callable[[float, float], bool]:
    return lambda v, b: v < ratio * b


def _above(floor: float, margin: float) -> Callable[[float, float], bool]:
    return lambda v, b: v > max(floor, b + margin)


def _evidence(
    kind: str, ranks: tuple[int, ...], findings: Sequence[Finding], step: int
) -> dict[str, Any]:
    mine = [f for f in findings if f.kind == kind and f.rank in ranks]
    values = [f.value for f in mine]
    bases = [f.baseline for f in mine if f.baseline is not None]
    return {
        "ranks": list(ranks),
        "signal": SIGNAL_OF[kind],
        "value": statistics.median(values) if values else None,
        "baseline": statistics.median(bases) if bases else None,
        "fired_at_step": step,
    }
