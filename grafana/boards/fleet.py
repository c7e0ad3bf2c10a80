"""Fleet: all jobs ranked by the GPU-hours their stragglers wasted, and the open alerts."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from rankwatch.grafana import panels
from rankwatch.grafana.boards import job
from rankwatch.grafana.common import board, board_url, link
from rankwatch.grafana.queries import fleet as q

UID = "rankwatch-fleet"


def build() -> Dashboard:
    to_job = link("Open the job board", board_url(job.UID, job="${__data.fields.job}"))
    return (
        board(UID, "rankwatch / Fleet", "Every job: where the GPU-hours go, what is alerting.")
        .with_panel(
            panels.stat(
                "Alerts firing",
                q.OPEN_ALERT_COUNTS,
                "Alerts firing now, by severity.",
                width=8,
                steps=((None, "green"), (1, "orange")),
            )
        )
        .with_panel(
            panels.timeseries(
                "Fleet waste W",
                q.FLEET_WASTE,
                "Share of all analysed GPU time lost to stragglers, across jobs.",
                unit="percentunit",
                width=16,
            ).height(4)
        )
        .with_panel(
            panels.table(
                "Jobs by wasted GPU-hours",
                q.JOBS,
                "Jobs with steps in range; click a job for its board.",
                width=16,
                links=[to_job],
            )
        )
        .with_panel(
            panels.barchart(
                "Wasted GPU-hours by job",
                q.WASTE_BY_JOB,
                "Top 20 jobs.",
                "job",
                steps=((None, "blue"),),
            ).unit("h")
        )
        .with_panel(
            panels.table(
                "Open alerts",
                q.OPEN_ALERTS,
                "Every alert whose latest state is firing, most severe first.",
                links=[to_job],
            )
        )
        .with_panel(
            panels.timeseries(
                "FLOP/s by machine",
                q.FLOPS_BY_HOST,
                "Achieved FLOP/s of every job's ranks on each machine.",
                unit="flops",
            )
        )
        .with_panel(
            panels.timeseries(
                "Bus bandwidth by machine",
                q.BUSBW_BY_HOST,
                "Collective bus bandwidth of every job's ranks on each machine.",
                unit="Bps",
            )
        )
    )
