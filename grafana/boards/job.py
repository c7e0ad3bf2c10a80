"""Job: step time actual vs simulated ideal, S and W, GPU-hours wasted and who is to
blame (op type, stage, DP rank), partial steps."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from rankwatch.grafana import panels
from rankwatch.grafana.common import SLOWDOWN_THRESHOLDS, board, job_variable
from rankwatch.grafana.queries import job as q

UID = "rankwatch-job"


def build() -> Dashboard:
    return (
        board(UID, "rankwatch / Job", "How much stragglers slow one job, and who is to blame.")
        .with_variable(job_variable())
        .with_panel(
            panels.stat(
                "Slowdown S",
                q.SLOWDOWN,
                "Simulated step time over ideal (no stragglers), over the analysed steps.",
                steps=SLOWDOWN_THRESHOLDS,
            )
        )
        .with_panel(
            panels.stat(
                "Waste W",
                q.WASTE,
                "Share of GPU time lost waiting on stragglers: 1 - 1/S.",
                unit="percentunit",
                steps=((None, "green"), (0.03, "yellow"), (0.1, "orange"), (0.2, "red")),
            )
        )
        .with_panel(
            panels.stat(
                "GPU-hours wasted",
                q.GPU_HOURS_WASTED,
                "Recorded step time x W x world size (from the jobs table), in GPU-hours.",
                unit="h",
            )
        )
        .with_panel(
            panels.stat(
                "Partial steps",
                q.PARTIAL_STEPS,
                "Steps closed by timeout with workers missing: not simulated.",
                steps=((None, "green"), (1, "orange")),
            )
        )
        .with_panel(
            panels.timeseries(
                "Step time: recorded, simulated, ideal",
                q.STEP_TIMES,
                "Per step: what it took, what the model replays, and the straggler-free ideal.",
                unit="s",
            )
        )
        .with_panel(
            panels.timeseries(
                "Slowdown S and waste W",
                q.SLOWDOWN_OVER_TIME,
                "S = T / T_ideal and W = 1 - 1/S per interval.",
            )
        )
        .with_panel(
            panels.barchart(
                "Top op types",
                q.TOP_OPTYPES,
                "S_g: the slowdown if only this op type kept its real durations.",
                "optype",
            )
        )
        .with_panel(
            panels.barchart(
                "Top pipeline stages",
                q.TOP_STAGES,
                "S_g: the slowdown if only this stage kept its real durations.",
                "stage",
            )
        )
        .with_panel(
            panels.barchart(
                "Top DP ranks",
                q.TOP_DP_RANKS,
                "S_g: the slowdown if only this DP rank kept its real durations.",
                "dp_rank",
            )
        )
        .with_panel(
            panels.timeseries(
                "GPU-hours wasted per interval",
                q.GPU_HOURS_OVER_TIME,
                "Needs the job's world size in the jobs table.",
                unit="h",
            )
        )
        .with_panel(
            panels.timeseries(
                "Partial and complete steps",
                q.STEP_COUNTS_OVER_TIME,
                "Steps closed per interval; partial ones had workers missing.",
            )
        )
        .with_panel(
            panels.timeseries(
                "FLOP/s by rank",
                q.FLOPS_BY_RANK,
                "Declared FLOPs over compute time (GC inside left out): a throttled device"
                " drops here first, whether or not it straggles.",
                unit="flops",
            )
        )
        .with_panel(
            panels.timeseries(
                "Bus bandwidth by rank",
                q.BUSBW_BY_RANK,
                "Collective bytes x NCCL factor over the fastest group member's time: a"
                " slow link or network drops here, not a straggler's waiting peers.",
                unit="Bps",
            )
        )
        .with_panel(
            panels.timeseries(
                "Step shares: between steps, untimed, GC, data",
                q.STEP_SHARES,
                "V_inter, V_minority, GC and data-loader shares of the step, mean over ranks.",
                unit="percentunit",
            )
        )
        .with_panel(
            panels.timeseries(
                "Throughput",
                q.THROUGHPUT,
                "Samples per second (median over ranks).",
            )
        )
        .with_panel(
            panels.table(
                "Open slowdown signals",
                q.SIGNAL_ANOMALIES,
                "Rank-steps with a flops-drop, bandwidth-drop, void-high, gc-pauses,"
                " dataloader-bound or issue-stall episode open (rankwatch diagnose JOB).",
            )
        )
        .with_panel(panels.table("Steps", q.STEPS, "The latest steps, newest first."))
        .with_panel(panels.table("Alerts", q.ALERTS, "Alert state changes of this job."))
        .with_panel(
            panels.table(
                "Scenarios (latest run)",
                q.SCENARIOS,
                "Simulated step time and speedup of the job's latest stored scenario run"
                " (rankwatch scenario JOB --store; docs/scenarios.md).",
            )
        )
    )
