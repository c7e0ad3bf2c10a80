"""The ops pipeline: replayed traces come out as one row per step with the right step
time; bad messages become counted dead letters, never exceptions, and leave the good
data's results unchanged."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from rankwatch.schemas.codec import decode_ops, encode_ops
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches

SOURCE = Source(topic="rankwatch.ops")
CFG = GenConfig(dp=2, pp=3, microbatches=4, steps=5, stragglers=(Straggler(1, 2, 1.6),), seed=3)


def recorded_step_times(trace) -> dict[int, float]:  # type: ignore[no-untyped-def]
    ends = trace.start_ts + trace.duration
    return {int(s): float(ends[trace.step == s].max()) for s in np.unique(trace.step)}


def run(pipeline: Pipeline, messages: list[bytes]) -> Output:
    out = Output()
    for i, data in enumerate(messages):
        out.extend(pipeline.on_message(data, SOURCE, now_ns=i))
    out.extend(pipeline.flush(now_ns=len(messages)))
    return out


def replayed_messages() -> list[bytes]:
    trace, meta = generate_trace(CFG)
    return [encode_ops(b.batch) for b in replay_batches(trace, meta, "j", origin_ns=10**18)]


def test_each_step_is_one_row_with_its_recorded_time() -> None:
    trace, _ = generate_trace(CFG)
    out = run(Pipeline(analyser=WhatIfAnalyser()), replayed_messages())
    rows = out.rows["steps"]
    expected = recorded_step_times(trace)
    assert sorted(r["step"] for r in rows) == sorted(expected)
    for row in rows:
        assert row["t_base"] == pytest.approx(expected[row["step"]], abs=2e-9)
        assert row["partial"] == 0
        assert row["slowdown"] > 1.0  # worker (1, 2) straggles
    workers = [r for r in out.rows["step_attribution"] if r["dimension"] == "worker"]
    top = max(workers, key=lambda r: r["slowdown"])
    assert top["group"] == "1,2"


BAD = {
    "malformed-json": b'{"schema": "ops", "vers',
    "schema": orjson.dumps({"schema": "ops", "version": 1, "job": 5}),
    "unknown-version": orjson.dumps({"schema": "ops", "version": 99}),
    "too-large": b" " * (9 * 1024 * 1024),
}


def test_bad_messages_are_dead_letters_and_do_not_change_results() -> None:
    good = replayed_messages()
    clean = run(Pipeline(analyser=WhatIfAnalyser()), good)
    mixed_in = good[:3] + list(BAD.values()) + good[3:] + [good[0]]  # and one duplicate
    pipeline = Pipeline(analyser=WhatIfAnalyser())
    dirty = run(pipeline, mixed_in)
    letters = dirty.rows["dead_letters"]
    assert sorted(letter["reason"] for letter in letters) == sorted(BAD)
    assert pipeline.dead_letters == len(BAD)
    assert all(letter["detail"] for letter in letters)
    assert pipeline.assembler.counters.duplicate_batches == 1

    def key(rows: list[dict]) -> list[tuple]:
        return sorted((r["step"], r["t_base"], r["t_sim"], r["t_ideal"]) for r in rows)

    assert key(dirty.rows["steps"]) == key(clean.rows["steps"])


def test_a_step_announced_is_the_step_stored() -> None:
    out = run(Pipeline(analyser=WhatIfAnalyser()), replayed_messages())
    stored = {(r["step"], r["t_base"]) for r in out.rows["steps"]}
    announced = {(m["step"], m["t_base"]) for kind, _, m in out.messages if kind == "steps"}
    assert announced == stored


def test_a_late_batch_turns_a_partial_row_into_the_analysed_one_when_configured() -> None:
    """One rank's batch of step 2 arrives after the grace period: with ``late =
    "reanalyse"`` the step's final row (latest version) is the one an on-time run gives."""
    messages = replayed_messages()
    on_time = {
        r["step"]: r for r in run(Pipeline(analyser=WhatIfAnalyser()), messages).rows["steps"]
    }
    held = next(i for i, m in enumerate(messages) if set(decode_ops(m).step.tolist()) == {2})
    rest = messages[:held] + messages[held + 1 :]
    for late, expect_complete in (("drop", False), ("reanalyse", True)):
        pipeline = Pipeline(
            assembly=AssemblyConfig(grace_s=1.0, quiet_grace_s=1.0, late=late),
            analyser=WhatIfAnalyser(),
        )
        out = Output()
        for i, data in enumerate(rest):
            out.extend(pipeline.on_message(data, SOURCE, now_ns=i))
        out.extend(pipeline.on_tick(now_ns=10**10))  # grace over: step 2 closes partial
        out.extend(pipeline.on_message(messages[held], SOURCE, now_ns=2 * 10**10))
        rows = [r for r in out.rows["steps"] if r["step"] == 2]
        final = max(rows, key=lambda r: r["version"])
        assert rows[0]["partial"] == 1
        assert (final["partial"] == 0) is expect_complete, late
        if expect_complete:
            for name in ("t_base", "t_sim", "t_ideal", "slowdown"):
                assert final[name] == pytest.approx(on_time[2][name], rel=1e-12), name
