"""The ops pipeline turns ops v2 step summaries into rank_signals rows and alerts;
version 1 producers (no summaries) go through exactly as before."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import encode_ops, encode_ops_json
from rankwatch.schemas.codec import decode
from rankwatch.schemas.examples import T0_NS, rank_step
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.pipeline import JobHistory, Pipeline
from rankwatch.streams.slowdown.detector import DetectorConfig
from rankwatch.streams.slowdown.signals import Signals

MS = 1_000_000
SRC = Source("rankwatch.ops")
OPEN = DetectorConfig().open_after
"""Anomalous steps in a row that open an episode."""
SLOW = set(range(12, 15 + OPEN))
"""Rank 1's slow steps: the episode opens at step 11 + OPEN, closes three steps after."""
FIRED = 11 + OPEN
END = 25 + OPEN


def message(rank: int, step: int, flops: float, version: int = 2) -> bytes:
    ident = Identity(job="j", host=f"h{rank}", rank=rank, dp_rank=rank, pp_rank=0, dp_size=2)
    t0 = T0_NS + step * 100 * MS
    records = [(step, "optimizer", 0, -1, -1, -1, t0 + 10 * MS, 80 * MS)]
    item = rank_step(
        step=step,
        prev_end_ns=t0,
        begin_ns=t0 + 10 * MS,
        end_ns=t0 + 100 * MS,
        covered_ns=80 * MS,
        data_wait_ns=0,
        gc_ns=0,
        ops=[{"optype": "optimizer", "n": 1, "time_ns": 80 * MS, "flops": flops}],
    )
    value = (encode_ops if version > 1 else encode_ops_json)(
        ident, records, batch_seq=step, sent_ns=t0 + 100 * MS, steps_done=[(step, 1)],
        rank_steps=[item] if version > 1 else [],
    )  # fmt: skip
    if version == 1:
        value = orjson.dumps({**orjson.loads(value), "version": 1})
    return value


def feed(pipeline: Pipeline, steps: range, slow: set[int], version: int = 2) -> Output:
    """Both ranks' closing message of each step; rank 1 at 1/8 the FLOPs in ``slow``."""
    out = Output()
    for step in steps:
        for rank in (0, 1):
            flops = 1e9 if rank == 1 and step in slow else 8e9
            out.extend(pipeline.on_message(message(rank, step, flops, version), SRC, 0))
    return out


def test_version_1_producers_give_no_signals() -> None:
    out = feed(Pipeline(), range(5), set(), version=1)
    assert len(out.rows["steps"]) == 5 and "rank_signals" not in out.rows


def test_signals_rows_and_one_alert_per_episode() -> None:
    out = feed(Pipeline(), range(END), slow=SLOW)
    rows: list[dict[str, Any]] = out.rows["rank_signals"]
    assert [(r["step"], r["rank"]) for r in rows] == [(s, r) for s in range(END) for r in (0, 1)]
    first = rows[0]
    assert first["flops_per_s"] == 8e9 / 0.080 and first["t_step"] == 0.1
    assert abs(first["v_inter"] - 0.1) < 1e-12 and abs(first["v_minority"] - 1 / 9) < 1e-12
    alerts = [decode("alerts", orjson.dumps(m)) for k, _, m in out.messages if k == "alerts"]
    assert [(a["kind"], a["state"], a["evidence"]["ranks"]) for a in alerts] == [
        ("flops-drop", "firing", [1]),
        ("flops-drop", "resolved", [1]),
    ]
    signals = [m for k, _, m in out.messages if k == "signals"]
    assert all(decode("signals", orjson.dumps(m)) == m for m in signals)
    assert [m["anomalies"] for m in signals if m["step"] == FIRED] == [[], ["flops-drop"]]
    assert [m["anomalies"] for m in signals if m["step"] == FIRED - 1] == [[], []]


def _history(out: Output) -> JobHistory:
    """What the store would give a restarted worker (rank_signals rows, firing alerts)."""
    steps: dict[int, tuple[list[Signals], dict[int, list[str]]]] = {}
    for row in out.rows["rank_signals"]:
        fields = {k: v for k, v in row.items() if k not in ("time", "anomalies", "version")}
        signals, open_now = steps.setdefault(row["step"], ([], {}))
        signals.append(Signals(**fields, start_ns=0))
        if row["anomalies"]:
            open_now[row["rank"]] = row["anomalies"]
    alerts = {m["alert_id"]: m for k, _, m in out.messages if k == "alerts"}
    firing = [m for m in alerts.values() if m["state"] == "firing"]
    return JobHistory(signals=[steps[s] for s in sorted(steps)], slowdown_alerts=firing)


def _alerts(out: Output) -> list[tuple[str, str, str]]:
    return [(m["kind"], m["state"], m["alert_id"]) for k, _, m in out.messages if k == "alerts"]


@pytest.mark.parametrize("killed_after", [14, FIRED, FIRED + 2, FIRED + 5])
def test_a_restarted_pipeline_alerts_as_an_uninterrupted_one(killed_after: int) -> None:
    """Killed two steps into the fault or one step before the episode opens, after the
    alert fired (step FIRED), or as it was closing; restored from the stored rows: the same
    alerts, one firing and one resolved with the same id, as an uninterrupted run."""
    whole = _alerts(feed(Pipeline(), range(END), SLOW))
    before = feed(Pipeline(), range(killed_after), SLOW)
    after = Pipeline()
    after.restore("j", (2, 1), _history(before))
    assert _alerts(before) + _alerts(feed(after, range(killed_after, END), SLOW)) == whole
    assert [state for _, state, _ in whole] == ["firing", "resolved"]


@pytest.mark.parametrize("moved_after", [3, 14, FIRED, FIRED + 2, FIRED + 5])
def test_a_pipeline_handed_over_signals_as_an_uninterrupted_one(moved_after: int) -> None:
    """The job moves to another worker (its jobstate message, through the codec, no
    store) while baselines are warming up, before the episode opens, as it opens, while
    it is open and as it closes: the same signal rows and the same alerts as an
    uninterrupted run, to the bit (the detector's state travels as it is)."""
    from rankwatch.schemas.codec import encode
    from rankwatch.streams.ops.handover import history_from, state_message

    whole = feed(Pipeline(), range(END), SLOW)
    assert [state for _, state, _ in _alerts(whole)] == ["firing", "resolved"]
    old = Pipeline()
    before = feed(old, range(moved_after), SLOW)
    data = encode("jobstate", state_message("j", old.history("j")))
    taker = Pipeline()
    taker.restore("j", (2, 1), history_from(decode("jobstate", data)))
    after = feed(taker, range(moved_after, END), SLOW)
    assert _alerts(before) + _alerts(after) == _alerts(whole)
    signals = [m for k, _, m in before.messages + after.messages if k in ("signals", "alerts")]
    assert signals == [m for k, _, m in whole.messages if k in ("signals", "alerts")]
