"""Live what-if per step: the job's graph cached, ideal costs from a rolling window.

Wraps the online API of :mod:`rankwatch.sim` for the pipeline. Per job it infers
the dependency model once, from the first complete step, and keeps a window of per-step
summaries keyed by step number (:class:`~rankwatch.streams.ops.window.StepWindow`): each
new complete step is put into the window and analysed against the ideal costs of the W
latest analysed steps up to it. After a restart the worker rebuilds the window from the
stored ops of the last analysed steps (:meth:`WhatIfAnalyser.restore`), so the numbers
are those an uninterrupted run gives. A partial step cannot be simulated
(workers are missing), and a step the model cannot represent is counted with its
reason, never raised into the worker.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rankwatch.sim import (
    Analysis,
    IdealCosts,
    JobMeta,
    Measured,
    ModelError,
    OpGraph,
    Workspace,
    analyse_each,
    infer_graph,
    measure_trace,
)
from rankwatch.sim.analysis import DIMENSIONS, WORTH_ATTRIBUTING, ideal_per_node
from rankwatch.sim.durations import joined
from rankwatch.sim.ideal import StepSummary, summarise
from rankwatch.streams.ops.assembly import AssembledStep
from rankwatch.streams.ops.pipeline import StepAnalysis
from rankwatch.streams.ops.window import StepWindow

log = logging.getLogger("rankwatch.analyser")

DEFAULT_WINDOW = 20
"""Steps in the rolling window the ideal costs come from."""


@dataclass
class _JobModel:
    graph: OpGraph
    window: StepWindow


@dataclass
class WhatIfAnalyser:
    window: int = DEFAULT_WINDOW
    unmodelled: dict[str, str] = field(default_factory=dict)
    """job -> why its steps cannot be simulated (the first reason seen)."""
    skipped_steps: int = 0
    _jobs: dict[str, _JobModel] = field(default_factory=dict)
    _saved: dict[str, dict[int, StepSummary]] = field(default_factory=dict)
    """job -> window summaries handed over by another worker (the changelog), put into
    the job's window once its graph is inferred from its next complete step."""
    _workspace: Workspace = field(default_factory=Workspace)
    """Scratch memory of every job's passes (one thread analyses): what it holds is
    bounded by the largest pass, not by the number of jobs times theirs."""

    def analyse(self, step: AssembledStep) -> StepAnalysis | None:
        """One closed step's analysis (None: partial, or not analysable)."""
        return self.analyse_many([step])[0]

    def analyse_many(self, steps: Sequence[AssembledStep]) -> list[StepAnalysis | None]:
        """What :meth:`analyse` gives these steps one by one, in this order, number for
        number: the consecutive steps of a job under one model are simulated in one pass
        (:func:`~rankwatch.sim.analyse_each`), each against its own window's ideal. A
        step the model cannot represent ends the pass before it, as it would one at a
        time (its job's model is inferred again from the next complete step). Nothing
        is raised: a step or pass that fails otherwise (a bug) is logged, counted and
        left unanalysed, and its job's model dropped, as for a step the model refuses."""
        out: list[StepAnalysis | None] = [None] * len(steps)
        run = _Run()
        for k, step in enumerate(steps):
            if step.partial:
                continue
            try:
                model = self._model(step)
                if run.model is not model:
                    self._finish(run, steps, out)
                    run.model = model
                measured = measure_trace(model.graph, step.trace)
                model.window.put(step.step, summarise(model.graph, measured))
                ideal = model.window.ideal(step.step)
                ideal_per_node(model.graph, ideal)  # a ModelError here, not for the run
            except Exception as exc:
                self._finish(run, steps, out)
                self._skip(step.job, exc, 1)
                continue
            run.add(k, measured, ideal)
        self._finish(run, steps, out)
        return out

    def _finish(
        self, run: _Run, steps: Sequence[AssembledStep], out: list[StepAnalysis | None]
    ) -> None:
        """Simulate the run's steps and put each one's result at its index."""
        index, measured, ideals = run.take()
        if run.model is None or not index:
            return
        try:
            results = analyse_each(run.model.graph, joined(measured), ideals, self._workspace)
        except Exception as exc:
            self._skip(steps[index[0]].job, exc, len(index))
            run.model = None
            return
        for k, result in zip(index, results, strict=True):
            out[k] = _step_analysis(result)

    def _skip(self, job: str, exc: Exception, count: int) -> None:
        """``count`` steps of ``job`` not analysed; its model is inferred again."""
        if isinstance(exc, ModelError):
            why = str(exc)
        else:
            log.error("job %s: the what-if failed on %d step(s)", job, count, exc_info=exc)
            why = f"the what-if failed: {exc!r}"
        self.skipped_steps += count
        self.unmodelled.setdefault(job, why)
        self._jobs.pop(job, None)

    def restore(self, steps: list[AssembledStep]) -> None:
        """Refill the windows from steps analysed before a restart (not re-analysed)."""
        for step in sorted(steps, key=lambda s: s.step):
            try:
                model = self._model(step)
                model.window.put(
                    step.step, summarise(model.graph, measure_trace(model.graph, step.trace))
                )
            except ModelError:
                self._jobs.pop(step.job, None)

    def summaries(self, job: str) -> dict[int, StepSummary]:
        """The job's window: step -> summary (what :meth:`restore_summaries` takes)."""
        model = self._jobs.get(job)
        if model is None:
            return dict(self._saved.get(job, {}))
        return dict(model.window.summaries)

    def restore_summaries(self, job: str, summaries: dict[int, StepSummary]) -> None:
        """Refill a job's window from summaries another worker computed (exact: they are
        the numbers its window held). The graph is inferred from the next complete step,
        as after any restart; the summaries do not depend on it (per op type)."""
        model = self._jobs.get(job)
        if model is None:
            self._saved[job] = dict(summaries)
            return
        for step in sorted(summaries):
            model.window.put(step, summaries[step])

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)
        self._saved.pop(job, None)

    def _model(self, step: AssembledStep) -> _JobModel:
        model = self._jobs.get(step.job)
        if model is None:
            model = self._jobs[step.job] = _JobModel(
                graph=infer_graph(step.trace, _meta(step)),
                window=StepWindow(self.window),
            )
            saved = self._saved.pop(step.job, {})
            for number in sorted(saved):
                model.window.put(number, saved[number])
        return model


@dataclass
class _Run:
    """Steps of one job model gathered for one simulation pass."""

    model: _JobModel | None = None
    index: list[int] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    ideals: list[IdealCosts] = field(default_factory=list)

    def add(self, index: int, measured: Measured, ideal: IdealCosts) -> None:
        self.index.append(index)
        self.measured.append(measured)
        self.ideals.append(ideal)

    def take(self) -> tuple[list[int], list[Measured], list[IdealCosts]]:
        """The gathered steps (their indexes, measures and ideals), the run emptied."""
        taken = self.index, self.measured, self.ideals
        self.index, self.measured, self.ideals = [], [], []
        return taken


def _step_analysis(result: Analysis) -> StepAnalysis:
    slowdown = result.slowdown
    return StepAnalysis(
        t_sim=float(result.simulated_S[0]),
        t_ideal=float(result.ideal_S[0]),
        slowdown=slowdown,
        attributions=_attributions(result) if slowdown >= WORTH_ATTRIBUTING else (),
    )


def _meta(step: AssembledStep) -> JobMeta:
    dp, pp = step.layout
    vpp = int(step.trace.mc.max()) + 1 if len(step.trace) else 1
    return JobMeta(dp_size=dp, pp_size=pp, vpp_size=max(vpp, 1))


def _attributions(result: Analysis) -> tuple[tuple[str, str, float], ...]:
    rows = [(d, group, value) for d in DIMENSIONS for group, value in result.attribution(d).items()]
    rows += [("worker", w, v) for w, v in result.workers().items()]
    return tuple((d, g, v) for d, g, v in rows if math.isfinite(v))  # Python floats
