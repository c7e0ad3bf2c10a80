"""Straggler alerts: a job's rolling slowdown over a threshold, one alert per episode.

Pure: each analysed step is offered with its slowdown and top attribution; the rolling
job-level S is the mean slowdown of the job's latest analysed steps up to that step
(:class:`~rankwatch.streams.window.SlowdownWindow`), so a restart that reloads those
steps decides the same. An episode starts when the rolling S reaches ``fire_at`` and
ends when it drops below ``clear_below`` (hysteresis: no flapping around one value).
Its ``alert_id`` names the job and the step that started it, so the firing and the
resolved message share it, and a re-analysis after a restart produces the same id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rankwatch.schemas.tables import CONTRACTS
from rankwatch.streams.times import utc
from rankwatch.streams.window import SlowdownWindow


def alert_row(message: Mapping[str, Any]) -> dict[str, Any]:
    """The ``alerts`` row of an alert message (straggler, hang or Minder): the message's
    fields as its table contract says, evidence as JSON, ``time`` its ms copy."""
    row = CONTRACTS["alerts"].row(message, time=utc(message["ts_ns"]))
    row["evidence"] = orjson.dumps(message["evidence"]).decode()
    return row


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


@dataclass
class StragglerAlerts:
    config: AlertConfig = field(default_factory=AlertConfig)
    _jobs: dict[str, _JobAlerts] = field(default_factory=dict)

    def restore(self, job: str, slowdowns: dict[int, float], open_episode: str | None) -> None:
        """After a restart: the job's latest analysed slowdowns and its firing alert."""
        state = self._job(job)
        for step, value in slowdowns.items():
            state.slowdowns.put(step, value)
        state.episode = open_episode

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
    ) -> Alert | None:
        """Take one analysed step; return the alert it fires or resolves, if any."""
        state = self._job(job)
        state.slowdowns.put(step, slowdown)
        if top is not None:
            state.last_top = (step, top)
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
            blame = f", most from {top[0]} {top[1]} (S={top[2]:.2f})" if top else ""
            summary = f"job {job} runs {rolling:.2f}x its straggler-free time{blame}"
            return Alert(state.episode, job, "firing", severity, start_ns, summary, evidence)
        if state.episode is not None and rolling < cfg.clear_below:
            alert_id, state.episode = state.episode, None
            summary = f"job {job} back to {rolling:.2f}x its straggler-free time"
            return Alert(alert_id, job, "resolved", "info", start_ns, summary, evidence)
        return None

    def _job(self, job: str) -> _JobAlerts:
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _JobAlerts(SlowdownWindow(self.config.window))
        return state
