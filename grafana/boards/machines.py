"""Machines: Minder's score per host and metric over time, candidates, and the faulty-
machine episodes."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from rankwatch.grafana import panels
from rankwatch.grafana.common import board, job_variable, query_variable
from rankwatch.grafana.queries import machines as q

UID = "rankwatch-machines"


def build() -> Dashboard:
    return (
        board(UID, "rankwatch / Machines", "Is one machine going bad (Minder)?")
        .with_variable(job_variable())
        .with_variable(query_variable("metric", "Metric", q.METRICS, include_all=True))
        .with_variable(query_variable("host", "Host", q.HOSTS, include_all=True))
        .with_panel(
            panels.stat(
                "Faulty machines now",
                q.FAULTY_NOW,
                "Machines reported faulty and not resolved.",
                steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            panels.table(
                "Faulty-machine episodes",
                q.FAULTS,
                "Machines that stayed a candidate long enough to be reported; open first.",
                width=18,
            )
        )
        .with_panel(
            panels.timeseries(
                "Score per host",
                q.SCORES_BY_HOST,
                "Minder's distance of each host from the rest (worst selected metric).",
            )
        )
        .with_panel(
            panels.timeseries(
                "Score per metric",
                q.SCORES_BY_METRIC,
                "The same scores per metric (worst selected host).",
            )
        )
        .with_panel(
            panels.table(
                "Candidates",
                q.CANDIDATES,
                "Host and metric pairs flagged as candidates in range, by latest score.",
            )
        )
    )
