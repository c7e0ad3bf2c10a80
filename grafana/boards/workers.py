"""Workers: the SMon heatmap of S_w on the DP x PP grid for a step range, per-step
heatmaps, and one worker's detail; clicking a worker narrows the board to it."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders.dashboard import Dashboard

from rankwatch.grafana import panels
from rankwatch.grafana.common import board, board_url, job_variable, link, query_variable
from rankwatch.grafana.queries import workers as q

UID = "rankwatch-workers"
LAST_STEP = "1000000000000"
"""Default upper end of the step range (no job runs this many steps)."""


def _narrow(worker: str) -> db.DashboardLink:
    url = board_url(
        UID,
        job="${job}",
        worker=worker,
        step_from="${step_from}",
        step_to="${step_to}",
    )
    return link("Narrow the board to this worker", url)


def build() -> Dashboard:
    return (
        board(UID, "rankwatch / Workers", "Which workers (DP rank, stage) slow the job.")
        .with_variable(job_variable())
        .with_variable(db.TextBoxVariable("step_from").label("From step").default_value("0"))
        .with_variable(db.TextBoxVariable("step_to").label("To step").default_value(LAST_STEP))
        .with_variable(query_variable("worker", "Worker (dp,stage)", q.WORKERS, include_all=True))
        .with_panel(
            panels.grid(
                "S_w on the DP x PP grid",
                q.GRID,
                "SMon heatmap: rows are DP ranks, columns pipeline stages; S_w is the"
                " slowdown if only that worker kept its real durations. Click a cell to"
                " narrow the board to the worker.",
                row="dp_rank",
                column="stage",
                value="S_w",
                links=[_narrow("${__data.fields[0]},${__field.name}")],
            )
        )
        .with_panel(
            panels.table(
                "Top workers",
                q.TOP_WORKERS,
                "Workers by S_w over the step range; steps_blamed counts steps where the"
                " worker alone made the step at least 3% slower.",
                width=12,
                height=10,
                links=[_narrow("${__data.fields.worker}")],
            )
        )
        .with_panel(
            panels.heatmap(
                "S_w per step",
                q.PER_STEP,
                "Per-step heatmap: one row of cells per worker (the selected one, or all).",
                width=24,
            )
        )
        .with_panel(
            panels.timeseries(
                "Step slowdown vs the worker's S_w",
                q.WORKER_VS_STEP,
                "S of each step against S_w of the selected worker (the worst worker's"
                " when All): the closer, the more that worker explains the step.",
            )
        )
        .with_panel(
            panels.barchart(
                "Op time per step on the worker",
                q.OP_TIME,
                "Seconds per step by op type on the selected worker's ranks (raw ops).",
                "optype",
                width=12,
                steps=((None, "blue"),),
            ).unit("s")
        )
    )
