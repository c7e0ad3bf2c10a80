"""Scenarios: the measured job replayed on other hardware, network and parallelism.

docs/scenarios.md explains the model. Pure numpy, no I/O::

    cal = calibrate_trace(trace, meta, Hardware.from_mapping(raw_meta.get("hardware")))
    results = run_scenarios(cal, [Scenario.of({}), Scenario.of({"network.inter_x": 2})])
    results[1].step_time_s, results[1].speedup

Calibration (``calibrate``) fits the job's compute and link models to its measured
costs; re-shaping (``reshape``) builds the graph at other DP/PP sizes or microbatch
counts; re-timing (``retime``) gives every op its cost under the scenario; the
what-if engine's simulator does the rest.
"""

from __future__ import annotations

from rankwatch.sim.align import align
from rankwatch.sim.durations import measure
from rankwatch.sim.inference import infer_graph
from rankwatch.sim.scenario.calibrate import Calibration, LinkFit, OpTypeFit, calibrate
from rankwatch.sim.scenario.catalogue import GPUS, Gpu
from rankwatch.sim.scenario.predict import (
    Scenario,
    ScenarioResult,
    run_scenarios,
    scenario_name,
    sweep,
)
from rankwatch.sim.scenario.settings import KEYS, Hardware, ScenarioError, parse_settings
from rankwatch.sim.trace import JobMeta, Trace


def calibrate_trace(trace: Trace, meta: JobMeta, hardware: Hardware | None = None) -> Calibration:
    """Infer the job's graph from ``trace`` and calibrate its models on all its steps."""
    graph = infer_graph(trace, meta)
    times = align(graph, trace)
    return calibrate(graph, measure(graph, times), meta, hardware or Hardware(), times.start_NSD)


__all__ = [
    "GPUS",
    "KEYS",
    "Calibration",
    "Gpu",
    "Hardware",
    "LinkFit",
    "OpTypeFit",
    "Scenario",
    "ScenarioError",
    "ScenarioResult",
    "calibrate",
    "calibrate_trace",
    "parse_settings",
    "run_scenarios",
    "scenario_name",
    "sweep",
]
