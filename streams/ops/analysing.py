"""The ops pipeline as every path builds it: the worker, the demo, ``replay`` and the
embedded workload (pure).

One factory, so that what a user sees embedded is what the cluster would have told
them: the same rolling what-if, straggler alerts and slowdown signals, raw ops kept for
``diagnose`` and ``scenario``. On main the embedded commands built a pipeline of their
own without alerts or raw ops: ``make demo`` stored a straggling job and ``report``
said "Open alerts: 0", and ``diagnose`` and ``scenario`` refused the demo's job.
"""

from __future__ import annotations

from rankwatch.schemas.codec import DEFAULT_MAX_BYTES
from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW, WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.slowdown.detector import DetectorConfig, SlowdownDetector


def analysing_pipeline(
    *,
    assembly: AssemblyConfig | None = None,
    window: int = DEFAULT_WINDOW,
    alerts: AlertConfig | None = None,
    slowdown: DetectorConfig | None = None,
    keep_ops: bool = True,
    max_message_bytes: int = DEFAULT_MAX_BYTES,
    defer_ops: int = 0,
) -> Pipeline:
    """The pipeline of the ops worker with these settings (defaults: the worker's)."""
    return Pipeline(
        assembly=assembly or AssemblyConfig(),
        analyser=WhatIfAnalyser(window=window),
        alerts=StragglerAlerts(alerts or AlertConfig()),
        keep_ops=keep_ops,
        slowdown=SlowdownDetector(slowdown or DetectorConfig()),
        max_message_bytes=max_message_bytes,
        defer_ops=defer_ops,
    )
