"""A pipeline restored from what was stored gives the numbers of an uninterrupted run:
stored steps' re-delivered batches are late (no second row), the window comes back from
the stored steps' records (rebuilt in the same canonical order), alerts continue."""

from __future__ import annotations

import numpy as np

from rankwatch.schemas.codec import encode_ops
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import Alert, AlertConfig, StragglerAlerts, mark_of
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssembledStep, step_from_columns
from rankwatch.streams.ops.pipeline import JobHistory, Pipeline
from rankwatch.streams.ops.replay import replay_batches

CFG = GenConfig(dp=2, pp=2, microbatches=4, steps=12, stragglers=(Straggler(0, 1, 1.5),), seed=5)
SOURCE = Source(topic="ops")
ALERTS = AlertConfig(fire_at=1.05, clear_below=1.01, window=3)


def pipeline() -> Pipeline:
    return Pipeline(analyser=WhatIfAnalyser(window=4), alerts=StragglerAlerts(ALERTS))


def feed(p: Pipeline, messages: list[bytes]) -> Output:
    out = Output()
    for i, m in enumerate(messages):
        out.extend(p.on_message(m, SOURCE, i))
    return out


def rebuilt(step: AssembledStep) -> AssembledStep:
    """The step as recovery reads it back from the ops table (records in any order)."""
    t = step.trace
    order = np.random.default_rng(1).permutation(len(t))
    columns = {
        "step": t.step, "rank": t.rank, "dp_rank": t.dp_rank, "stage": t.stage,
        "optype": t.optype, "seq_id": t.seq_id, "mb_id": t.mb_id, "chunk": t.mc, "gmc": t.gmc,
        "start_ns": step.start_ns + np.round(t.start_ts * 1e9).astype(np.int64),
        "duration_ns": np.round(t.duration * 1e9).astype(np.int64),
    }  # fmt: skip
    return step_from_columns(
        step.job, step.step, {k: v[order] for k, v in columns.items()}, step.layout
    )


def stored_alert(message: dict) -> Alert:  # type: ignore[type-arg]
    """An announced alert as the store gives it back."""
    return Alert(**{name: message[name] for name in Alert.__dataclass_fields__})


def test_restart_from_stored_state_matches_an_uninterrupted_run() -> None:
    trace, meta = generate_trace(CFG)
    messages = [encode_ops(b.batch) for b in replay_batches(trace, meta, "j", 10**18)]
    whole = feed(pipeline(), messages)
    cut = len(messages) // 2 + 1
    before = feed(pipeline(), messages[:cut])
    stored = {r["step"]: r for r in before.rows["steps"]}
    attributed: dict[int, list[tuple[str, str, float]]] = {}
    for r in before.rows.get("step_attribution", []):
        attributed.setdefault(r["step"], []).append((r["dimension"], r["group"], r["slowdown"]))
    history = JobHistory(
        closed_steps=sorted(stored),
        analysed=[rebuilt(s) for s in before.steps][-4:],
        marks={s: mark_of(r["slowdown"], attributed.get(s, [])) for s, r in stored.items()},
        last_alert=next(
            (stored_alert(m) for k, _, m in reversed(before.messages) if k == "alerts"), None
        ),
    )
    restarted = pipeline()
    restarted.restore("j", (meta.dp_size, meta.pp_size), history)
    after = feed(restarted, messages)  # re-delivered from the start
    assert restarted.assembler.counters.late_batches == len(stored) * 4
    rows = before.rows["steps"] + after.rows["steps"]
    assert sorted(r["step"] for r in rows) == sorted(r["step"] for r in whole.rows["steps"])
    expected = {r["step"]: r for r in whole.rows["steps"]}
    for row in rows:
        for name in ("t_base", "t_sim", "t_ideal", "slowdown"):
            assert row[name] == expected[row["step"]][name], (row["step"], name)
    assert whole.rows.get("alerts"), "the straggler fires an alert"
    alerts = before.rows.get("alerts", []) + after.rows.get("alerts", [])
    assert [(a["alert_id"], a["state"]) for a in alerts] == [
        (a["alert_id"], a["state"]) for a in whole.rows.get("alerts", [])
    ]


def test_a_restart_past_the_first_batches_keeps_the_jobs_first_seen() -> None:
    trace, meta = generate_trace(CFG)
    messages = [encode_ops(b.batch) for b in replay_batches(trace, meta, "j", 10**18)]
    whole = feed(pipeline(), messages)
    cut = len(messages) // 2 + 1
    before = feed(pipeline(), messages[:cut])
    first_row = before.rows["jobs"][0]
    restarted = pipeline()
    restarted.restore(
        "j",
        (meta.dp_size, meta.pp_size),
        JobHistory(
            first_seen_ns=int(first_row["first_seen"].timestamp() * 1e9),
            hosts=frozenset(first_row["hosts"]),
        ),
    )
    after = feed(restarted, messages[cut:])  # committed up to the cut: not re-delivered
    final = max(after.rows["jobs"], key=lambda r: r["version"])
    expected = max(whole.rows["jobs"], key=lambda r: r["version"])
    assert {**final, "last_seen": None, "version": None} == {
        **expected,
        "last_seen": None,
        "version": None,
    }
    assert feed(pipeline(), messages[cut:]).rows["jobs"][0]["first_seen"] > final["first_seen"]
