"""The live worker's figures for a whole trace, without Kafka or a store.

The ops worker analyses each complete step as it closes, against ideal costs from a
rolling window of the latest analysed steps up to it (:mod:`rankwatch.streams.ops.analyser`),
and stores one row per step; the report and the Grafana boards aggregate those rows.
The offline engine instead takes its ideal costs from the whole trace. Both are right
for their use, and they differ (docs/whatif.md, "Offline and live figures").

:func:`live_figures` runs the worker's own analyser over a trace's steps in order and
aggregates its per-step results exactly as the boards' SQL does
(``rankwatch.grafana.queries``), so ``rankwatch whatif --window W`` reproduces the
stored figures of a job to float precision. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.sim import JobMeta, Trace, slowdown_of, waste_of
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW, WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssembledStep


@dataclass(frozen=True)
class LiveFigures:
    """Per analysed step its simulated and ideal time and attribution rows, as stored."""

    window: int
    steps: np.ndarray  # (S,) analysed steps, ascending
    t_sim: np.ndarray  # (S,)
    t_ideal: np.ndarray  # (S,)
    rows: tuple[tuple[int, str, str, float], ...]
    """(step, dimension, group, S_g): the ``step_attribution`` rows (steps with S >= 1.03)."""
    skipped: dict[int, str]
    """Steps the model could not represent, with the reason."""

    @property
    def slowdown(self) -> float:
        """``sum(T) / sum(T_ideal)``: the Job board's Slowdown S."""
        return slowdown_of(self.t_sim, self.t_ideal)

    @property
    def waste(self) -> float:
        return waste_of(self.slowdown)

    def attribution(self, dimension: str) -> dict[str, float]:
        """Group -> S_g, largest first: ``1 + sum((S_g,i - 1) T_ideal,i) / sum(T_ideal)``
        over the analysed steps (a step without a row counts as S_g = 1), which is
        ``sum(T_g) / sum(T_ideal)`` when every step was attributed."""
        weight = dict(zip(self.steps.tolist(), self.t_ideal.tolist(), strict=True))
        excess: dict[str, float] = {}
        for step, dim, group, s_g in self.rows:
            if dim == dimension:
                excess[group] = excess.get(group, 0.0) + (s_g - 1) * weight[step]
        total = float(self.t_ideal.sum())
        out = {g: 1 + e / total for g, e in excess.items()}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def live_figures(trace: Trace, meta: JobMeta, window: int = DEFAULT_WINDOW) -> LiveFigures:
    """Every step of ``trace`` through the worker's analyser, in step order."""
    analyser = WhatIfAnalyser(window=window)
    steps, t_sim, t_ideal = [], [], []
    rows: list[tuple[int, str, str, float]] = []
    skipped: dict[int, str] = {}
    layout = (meta.dp_size, meta.pp_size)
    for step in np.unique(trace.step).tolist():
        step_trace = trace.select(trace.step == step)
        assembled = AssembledStep(
            job="whatif",
            step=step,
            start_ns=0,
            trace=step_trace,
            partial=False,
            missing_workers=(),
            layout=layout,
        )
        result = analyser.analyse(assembled)
        if result is None:
            skipped[step] = analyser.unmodelled.pop("whatif", "not analysed")
            continue
        steps.append(step)
        t_sim.append(result.t_sim)
        t_ideal.append(result.t_ideal)
        rows += [(step, dim, group, s_g) for dim, group, s_g in result.attributions]
    return LiveFigures(
        window=window,
        steps=np.asarray(steps, dtype=np.int64),
        t_sim=np.asarray(t_sim, dtype=np.float64),
        t_ideal=np.asarray(t_ideal, dtype=np.float64),
        rows=tuple(rows),
        skipped=skipped,
    )


_DIMENSIONS = (
    ("optype", "op type"),
    ("dp_rank", "DP rank"),
    ("stage", "pipeline stage"),
    ("worker", "worker (dp,stage)"),
)


def describe_live(f: LiveFigures, top: int = 3) -> str:
    """The terminal account of :class:`LiveFigures` (``rankwatch whatif --window``)."""
    if not f.steps.size:
        return "No step could be analysed: " + "; ".join(
            f"step {s}: {why}" for s, why in f.skipped.items()
        )
    lines = [
        f"{f.steps.size} step(s) analysed (steps {f.steps.min()}..{f.steps.max()}), each "
        f"against ideal costs from the {f.window} latest analysed steps up to it (rolling "
        "window, as the live worker computes it; `rankwatch report` shows these figures).",
        "",
        f"Slowdown S = {f.slowdown:.3f} (mean simulated step {f.t_sim.mean():.3f} s, ideal "
        f"{f.t_ideal.mean():.3f} s); waste W = {f.waste:.1%}.",
        "Attribution (S_g: the slowdown if only group g kept its real durations):",
    ]
    for dim, words in _DIMENSIONS:
        shown = ", ".join(f"{g} {s:.3f}" for g, s in list(f.attribution(dim).items())[:top])
        lines.append(f"  by {words}: {shown or '-'}")
    if f.skipped:
        lines.append(f"Steps not analysed: {', '.join(map(str, f.skipped))}.")
    lines.append("M_W, M_S and the findings are offline analyses: run without --window.")
    return "\n".join(lines)


def live_json(f: LiveFigures) -> dict[str, object]:
    steps = [str(s) for s in f.steps.tolist()]
    return {
        "method": "live",
        "window": f.window,
        "slowdown": f.slowdown if f.steps.size else None,
        "waste": f.waste if f.steps.size else None,
        "step_time": {
            "simulated": dict(zip(steps, f.t_sim.tolist(), strict=True)),
            "ideal": dict(zip(steps, f.t_ideal.tolist(), strict=True)),
        },
        "attribution": {dim: f.attribution(dim) for dim, _ in _DIMENSIONS},
        "skipped_steps": {str(s): why for s, why in f.skipped.items()},
    }
