"""Scenarios end to end: re-shape, re-time, simulate with the what-if engine.

Every scenario is simulated by :func:`rankwatch.sim.simulate.simulate`, the engine
of the what-if analysis, with launch delays 0 and float64 costs, exactly as the
what-if's T (``Analysis.simulated_S``): a scenario that changes nothing gives T
bit for bit. Scenarios of one shape (same DP, PP, microbatches) share one pass.

Legend: N ops, S steps, D DP ranks, X scenarios.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rankwatch.sim.scenario.calibrate import Calibration
from rankwatch.sim.scenario.reshape import (
    Shape,
    microbatches,
    recognise_schedule,
    reshape,
    same_shape,
)
from rankwatch.sim.scenario.retime import scenario_costs
from rankwatch.sim.scenario.settings import ScenarioError, Settings, parse_settings
from rankwatch.sim.scenarios import choose
from rankwatch.sim.simulate import simulate
from rankwatch.sim.workspace import Workspace


@dataclass(frozen=True)
class Scenario:
    """A name and its checked settings (empty: the job as measured)."""

    name: str
    settings: Mapping[str, float | int | str | bool] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Mapping[str, object], name: str | None = None) -> Scenario:
        checked = parse_settings(settings)
        return cls(name or scenario_name(checked), checked)


@dataclass(frozen=True)
class ScenarioResult:
    """Simulated step times of one scenario and its speedup over the job as measured."""

    scenario: Scenario
    step_S: np.ndarray
    baseline_s: float

    @property
    def step_time_s(self) -> float:
        return float(self.step_S.mean())

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.step_time_s if self.step_time_s > 0 else float("nan")

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.scenario.name,
            "settings": dict(self.scenario.settings),
            "step_time_s": self.step_time_s,
            "speedup": self.speedup,
        }


def scenario_name(settings: Settings) -> str:
    if not settings:
        return "baseline"
    return ",".join(f"{k}={_text(v)}" for k, v in settings.items())


def _text(value: object) -> str:
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return str(value)


def sweep(
    key: str, values: Sequence[object], fixed: Mapping[str, object] | None = None
) -> list[Scenario]:
    """One scenario per value of ``key`` (on top of the ``fixed`` settings)."""
    if not values:
        raise ScenarioError(f"--sweep {key} needs at least one value")
    return [Scenario.of({**(fixed or {}), key: v}) for v in values]


def run_scenarios(
    cal: Calibration, scenarios: Sequence[Scenario], workspace: Workspace | None = None
) -> list[ScenarioResult]:
    """Step times of each scenario; speedups against the job as measured (simulated)."""
    work = workspace or Workspace()
    base = _simulate(same_shape(cal.graph), [cal.cost_NSD], work)[0]
    baseline_s = float(base.mean())
    shapes: dict[tuple[int, int, int], list[int]] = {}
    for i, sc in enumerate(scenarios):
        shapes.setdefault(_shape_key(cal, sc.settings), []).append(i)
    out: list[ScenarioResult | None] = [None] * len(scenarios)
    schedule = functools.cache(lambda: recognise_schedule(cal.graph))
    for (dp, pp, m), members in shapes.items():
        shape = reshape(cal.graph, dp, pp, m, schedule)
        costs = [scenario_costs(cal, shape, scenarios[i].settings) for i in members]
        for i, step_S in zip(members, _simulate(shape, costs, work), strict=True):
            out[i] = ScenarioResult(scenarios[i], step_S, baseline_s)
    return [r for r in out if r is not None]


def _shape_key(cal: Calibration, settings: Settings) -> tuple[int, int, int]:
    tp = int(settings.get("parallel.tp", cal.layout.tp))
    if tp != cal.layout.tp:
        raise ScenarioError(
            "parallel.tp cannot change: tensor-parallel collectives run inside the "
            "compute ops the hooks time, so the trace holds nothing to calibrate them on"
        )
    g = cal.graph
    return (
        int(settings.get("parallel.dp", g.dp_size)),
        int(settings.get("parallel.pp", g.pp_size)),
        int(settings.get("microbatches", microbatches(g))),
    )


def _simulate(shape: Shape, costs: Sequence[np.ndarray], work: Workspace) -> np.ndarray:
    """Step times ``(X, S)`` of one graph under several cost tables, one pass."""
    graph = shape.graph
    pick = np.tile(np.arange(len(costs)), (graph.size, 1))
    table = choose(graph, costs, pick, dtype=np.float64)
    return simulate(graph, table, workspace=work, tag="scenario.")
