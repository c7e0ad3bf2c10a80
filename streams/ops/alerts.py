"""Straggler alerts: a job's rolling slowdown over a threshold, one alert per episode.

Pure: each analysed step is offered with its slowdown and top attribution; the rolling
job-level S is the mean slowdown of the job's latest analysed steps up to that step
(:class:`~rankwatch.streams.ops.window.SlowdownWindow`), so a restart that reloads those
steps decides the same. An episode starts when the rolling S reaches ``fire_at`` and
ends when it drops below ``clear_below`` (hysteresis: no flapping around one value).
Its ``alert_id`` names the job and the step that started it, so the firing and the
resolved message share it, and a re-analysis after a restart produces the same id.

Chronic or spread (docs/detection.md, "4. Who a straggler alert blames"): a firing alert
names a worker, DP rank or stage only when that group was the top contributor of its
dimension (largest S_g) in at least ``chronic_share`` of the window's attributed steps
(two at least). A group that leads one step and not the next is a one-off; a slowdown
whose lead moves from rank to rank is reported as spread, as the offline M_W (fixing
the worst 3% of workers explains little) says of such a job. When groups of several
dimensions are chronic, the one that explains most (largest mean S_g over the steps it
led) is named, the most specific among near ties (within ``TIE``): a straggling worker
lifts its DP rank and stage as much as itself, a badly partitioned stage lifts the
stage more than any one of its workers (the offline M_S). Looking at one step's top
attribution would blame whichever rank happened to lag in it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwatch.streams.ops.window import SlowdownWindow

BLAME = ("worker", "dp_rank", "stage")
"""Dimensions an alert may blame, most specific first (op types are not to blame)."""
TIE = 0.005
"""Mean S_g this close to the best counts as a tie (the more specific group is named)."""
Leaders = dict[str, tuple[str, float]]
"""dimension -> (top group, its S_g) of one step."""


def _words(blame: Mapping[str, Any]) -> str:
    if blame["chronic"]:
        name = {"worker": "worker", "dp_rank": "DP rank", "stage": "stage"}[blame["dimension"]]
        return (
            f"chronic: {name} {blame['group']} led {blame['steps_led']} "
            f"of the last {blame['steps']} steps"
        )
    return (
        f"spread: no worker, DP rank or stage led {blame['needed']} "
        f"of the last {blame['steps']} steps"
    )


@dataclass(frozen=True)
class AlertConfig:
    fire_at: float = 1.10
    """Rolling job-level S at which a straggler episode starts."""
    clear_below: float = 1.05
    """Rolling S under which it ends."""
    window: int = 10
    """Analysed steps in the rolling S."""
    min_steps: int = 3
    """Steps the window must hold before an alert may fire."""
    critical_at: float = 1.5
    """Rolling S from which a firing alert is critical rather than a warning."""
    chronic_share: float = 0.6
    """A group is blamed when it led its dimension in this share of the window's steps."""


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


@dataclass
class _JobAlerts:
    slowdowns: SlowdownWindow
    episode: str | None = None
    last_top: tuple[int, tuple[str, str, float]] | None = None
    """(step, top attribution) of the latest step that had one: the evidence when the
    step that tips the rolling S was itself below the attribution threshold."""
    leaders: dict[int, Leaders] = field(default_factory=dict)
    """step -> the top group of each blame dimension in that step (the window's steps)."""
    last: Alert | None = None
    """The latest alert state this job sent (re-announced by a worker that takes the job
    over)."""


@dataclass(frozen=True)
class JobAlertState:
    """What :class:`StragglerAlerts` holds of one job, for another worker to go on from."""

    slowdowns: dict[int, float]
    episode: str | None
    leaders: dict[int, Leaders]
    last_top: tuple[int, tuple[str, str, float]] | None
    last: Alert | None


@dataclass
class StragglerAlerts:
    config: AlertConfig = field(default_factory=AlertConfig)
    _jobs: dict[str, _JobAlerts] = field(default_factory=dict)

    def restore(
        self,
        job: str,
        slowdowns: dict[int, float],
        open_episode: str | None,
        leaders: dict[int, Leaders] | None = None,
    ) -> None:
        """After a restart: the job's latest analysed slowdowns, its firing alert and
        the leading groups of those steps."""
        state = self._job(job)
        for step, value in slowdowns.items():
            state.slowdowns.put(step, value)
        state.episode = open_episode
        for step, lead in (leaders or {}).items():
            self._lead(state, step, lead)

    def state(self, job: str) -> JobAlertState:
        """The job's state: its window's slowdowns and leaders, its open episode, the
        latest top attribution and the latest alert sent."""
        state = self._jobs.get(job) or _JobAlerts(SlowdownWindow(self.config.window))
        return JobAlertState(
            slowdowns=dict(state.slowdowns.values),
            episode=state.episode,
            leaders={step: dict(lead) for step, lead in state.leaders.items()},
            last_top=state.last_top,
            last=state.last,
        )

    def load(self, job: str, saved: JobAlertState) -> None:
        """Take over a job exactly as :meth:`state` described it (another worker's)."""
        self.forget(job)
        self.restore(job, saved.slowdowns, saved.episode, saved.leaders)
        state = self._job(job)
        state.last_top, state.last = saved.last_top, saved.last

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def rolling(self, job: str, step: int) -> float:
        return self._job(job).slowdowns.rolling(step)[0]

    def observe(
        self,
        job: str,
        step: int,
        start_ns: int,
        slowdown: float,
        top: tuple[str, str, float] | None,
        leaders: Leaders | None = None,
    ) -> Alert | None:
        """Take one analysed step (``leaders``: its top group per blame dimension);
        return the alert it fires or resolves, if any."""
        state = self._job(job)
        state.slowdowns.put(step, slowdown)
        if top is not None:
            state.last_top = (step, top)
        if leaders:
            self._lead(state, step, leaders)
        top_step, top = state.last_top if state.last_top is not None else (step, None)
        rolling, n = state.slowdowns.rolling(step)
        cfg = self.config
        evidence: dict[str, Any] = {
            "step": step,
            "rolling_slowdown": rolling,
            "window_steps": n,
            "step_slowdown": slowdown,
            "threshold": cfg.fire_at,
        }
        if top is not None:
            evidence["top_attribution"] = {"dimension": top[0], "group": top[1], "slowdown": top[2]}
            evidence["top_attribution_step"] = top_step
        if state.episode is None and n >= cfg.min_steps and rolling >= cfg.fire_at:
            state.episode = f"straggler:{job}:{step}"
            severity = "critical" if rolling >= cfg.critical_at else "warning"
            blame = self._blame(state, step)
            evidence["blame"] = blame
            summary = f"job {job} runs {rolling:.2f}x its straggler-free time, {_words(blame)}"
            state.last = Alert(state.episode, job, "firing", severity, start_ns, summary, evidence)
            return state.last
        if state.episode is not None and rolling < cfg.clear_below:
            alert_id, state.episode = state.episode, None
            summary = f"job {job} back to {rolling:.2f}x its straggler-free time"
            state.last = Alert(alert_id, job, "resolved", "info", start_ns, summary, evidence)
            return state.last
        return None

    def _lead(self, state: _JobAlerts, step: int, leaders: Leaders) -> None:
        state.leaders[step] = dict(leaders)
        while len(state.leaders) > self.config.window:
            del state.leaders[min(state.leaders)]

    def _blame(self, state: _JobAlerts, step: int) -> dict[str, Any]:
        """The chronic group that explains most (most specific among near ties), or
        why there is none."""
        steps = sorted(s for s in state.leaders if s <= step)[-self.config.window :]
        need = max(2, math.ceil(self.config.chronic_share * len(steps)))
        candidates: list[tuple[float, str, str, int]] = []  # (mean S_g, dim, group, led)
        most: dict[str, int] = {}
        for dim in BLAME:
            led = [state.leaders[s][dim] for s in steps if dim in state.leaders[s]]
            group, n = next(iter(Counter(g for g, _ in led).most_common(1)), ("", 0))
            most[dim] = n
            if n >= need:
                candidates.append((sum(v for g, v in led if g == group) / n, dim, group, n))
        if not candidates:
            return {"chronic": False, "steps": len(steps), "needed": need, "most_led": most}
        best = max(c[0] for c in candidates)
        mean, dim, group, n = next(c for c in candidates if c[0] >= best - TIE)
        return {"chronic": True, "dimension": dim, "group": group, "steps_led": n} | {
            "steps": len(steps),
            "mean_slowdown": mean,
        }

    def _job(self, job: str) -> _JobAlerts:
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _JobAlerts(SlowdownWindow(self.config.window))
        return state
