"""Closed steps analysed later, several at once (``Pipeline.defer_ops``, ``take_closed``,
``WhatIfAnalyser.analyse_many``): the rows, messages and alerts of one step at a time,
in the same order; bounded by the ops waiting."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.optypes import CODE
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssembledStep
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches

CFG = GenConfig(dp=2, pp=2, microbatches=4, steps=10, stragglers=(Straggler(0, 1, 1.5),), seed=5)
SOURCE = Source(topic="ops")
ALERTS = AlertConfig(fire_at=1.05, clear_below=1.01, window=3)
NOW = 10**18  # one clock for every call: the rows' times then match too


def messages(job: str = "j", seed: int = 5) -> list[bytes]:
    trace, meta = generate_trace(CFG.__class__(**{**CFG.__dict__, "seed": seed}))
    return [encode_ops(b.batch) for b in replay_batches(trace, meta, job, origin_ns=10**18)]


def interleaved() -> list[bytes]:
    """Two jobs' messages, alternating."""
    a, b = messages("a", 5), messages("b", 6)
    return [m for pair in zip(a, b, strict=True) for m in pair]


def pipeline(defer_ops: int = 0) -> Pipeline:
    return Pipeline(
        analyser=WhatIfAnalyser(window=4), alerts=StragglerAlerts(ALERTS), defer_ops=defer_ops
    )


def at_once(data: list[bytes]) -> Output:
    p, out = pipeline(), Output()
    for m in data:
        out.extend(p.on_message(m, SOURCE, NOW))
    out.extend(p.flush(NOW))
    return out


@pytest.mark.parametrize("every", [1, 5, 23, 10**6])
def test_taken_later_the_output_is_the_same(every: int) -> None:
    """Taken every ``every`` messages (10**6: only by the final flush)."""
    data = interleaved()
    p, out = pipeline(defer_ops=10**9), Output()
    for i, m in enumerate(data, 1):
        out.extend(p.on_message(m, SOURCE, NOW))
        if i % every == 0:
            out.extend(p.take_closed(NOW))
    out.extend(p.flush(NOW))
    want = at_once(data)
    assert out.rows == want.rows
    assert out.messages == want.messages
    assert [(s.job, s.step) for s in out.steps] == [(s.job, s.step) for s in want.steps]
    assert p.steps_analysed == 2 * CFG.steps
    assert any(kind == "alerts" for kind, _, _ in out.messages)  # the straggler was seen


def test_the_closing_message_names_its_step_and_the_take_brings_its_rows() -> None:
    p = pipeline(defer_ops=10**9)
    outs = [p.on_message(m, SOURCE, NOW) for m in messages()]
    closing = next(o for o in outs if o.steps)
    assert closing.rows.get("steps", []) == []
    taken = p.take_closed(NOW)
    assert taken.steps == []
    assert len(taken.rows["steps"]) == sum(len(o.steps) for o in outs)
    assert p.take_closed(NOW).rows == {}


def test_rows_come_at_once_when_the_waiting_ops_reach_the_bound() -> None:
    data = messages()
    probe = pipeline(defer_ops=10**9)
    closed = [s for m in data for s in probe.on_message(m, SOURCE, NOW).steps]
    two_steps = closed[0].n_ops + closed[1].n_ops
    p = pipeline(defer_ops=two_steps)
    with_rows = [
        [r["step"] for r in out.rows.get("steps", [])]
        for out in (p.on_message(m, SOURCE, NOW) for m in data)
    ]
    first, second, *_ = (r for r in with_rows if r)
    assert first == [closed[0].step, closed[1].step]
    assert second == [closed[2].step, closed[3].step]


def test_a_forgotten_job_leaves_no_step_waiting() -> None:
    p = pipeline(defer_ops=10**9)
    for m in interleaved():
        p.on_message(m, SOURCE, NOW)
    p.forget("a")
    taken = p.take_closed(NOW)
    assert {r["job"] for r in taken.rows["steps"]} == {"b"}


# -- the analyser on its own -------------------------------------------------------------


def steps_of(job: str, seed: int) -> list[AssembledStep]:
    trace, meta = generate_trace(CFG.__class__(**{**CFG.__dict__, "seed": seed}))
    out = []
    for step in np.unique(trace.step).tolist():
        t = trace.select(trace.step == step)
        out.append(AssembledStep(job, step, 0, t, False, (), (meta.dp_size, meta.pp_size)))
    return out


def broken(step: AssembledStep) -> AssembledStep:
    """The step without one backward op: the model cannot represent it."""
    t = step.trace
    gone = (t.optype == CODE["backward-compute"]) & (t.dp_rank == 1) & (t.stage == 0)
    drop = np.flatnonzero(gone)[:1]
    keep = np.ones(len(t), bool)
    keep[drop] = False
    return AssembledStep(step.job, step.step, 0, t.select(keep), False, (), step.layout)


def test_many_at_once_equals_one_at_a_time() -> None:
    """Two jobs interleaved, a partial step and a step the model refuses (its job's
    model is dropped and inferred again from the next step, as one at a time)."""
    a, b = steps_of("a", 5), steps_of("b", 6)
    a[3] = broken(a[3])
    b[2] = AssembledStep("b", b[2].step, 0, b[2].trace, True, (), b[2].layout)
    steps = [s for pair in zip(a, b, strict=True) for s in pair]
    one, many = WhatIfAnalyser(window=4), WhatIfAnalyser(window=4)
    alone = [one.analyse(s) for s in steps]
    together = many.analyse_many(steps)
    assert together == alone
    assert alone[6] is None and alone[5] is None  # the broken step, the partial one
    assert sum(r is not None for r in alone) == len(steps) - 2
    assert many.skipped_steps == one.skipped_steps == 1
    assert many.unmodelled == one.unmodelled
    for job in ("a", "b"):
        assert many.summaries(job).keys() == one.summaries(job).keys()


def test_a_failing_pass_leaves_its_steps_unanalysed_and_the_next_ones_analysed(
    monkeypatch, caplog
) -> None:
    """A bug in the what-if is logged and counted, never raised into the worker (whose
    store would otherwise fail on every try): the steps get rows without figures."""
    from rankwatch.streams.ops import analyser as analyser_module

    steps = steps_of("a", 5)
    analyser = WhatIfAnalyser(window=4)
    real = analyser_module.analyse_each

    def broken_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(analyser_module, "analyse_each", real)
        raise FloatingPointError("injected")

    monkeypatch.setattr(analyser_module, "analyse_each", broken_once)
    first = analyser.analyse_many(steps[:4])
    assert first == [None] * 4
    assert analyser.skipped_steps == 4
    assert "the what-if failed: FloatingPointError('injected')" in analyser.unmodelled["a"]
    assert "the what-if failed on 4 step(s)" in caplog.text
    later = analyser.analyse_many(steps[4:])
    assert all(r is not None for r in later)  # the model inferred again


def test_a_step_that_fails_before_its_pass_is_skipped_alone(monkeypatch) -> None:
    from rankwatch.streams.ops import analyser as analyser_module

    steps = steps_of("a", 5)
    real = analyser_module.measure_trace

    def fails_on_step_2(graph, trace):  # type: ignore[no-untyped-def]
        if int(trace.step[0]) == steps[2].step:
            raise IndexError("injected")
        return real(graph, trace)

    monkeypatch.setattr(analyser_module, "measure_trace", fails_on_step_2)
    got = WhatIfAnalyser(window=4).analyse_many(steps)
    assert [r is None for r in got] == [False, False, True] + [False] * (len(steps) - 3)
