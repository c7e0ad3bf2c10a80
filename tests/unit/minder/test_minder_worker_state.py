"""The Minder worker's state without a broker: decoding, dead letters, stored rows and
the alerts it hands back for publishing (only after their rows were inserted)."""

from __future__ import annotations

import numpy as np
import orjson
from support.memstore import MemoryStore

from rankwatch.agent import metrics_message
from rankwatch.schemas.codec import decode
from rankwatch.streams.minder.online import NS, OnlineConfig
from rankwatch.streams.minder.worker import MinderSettings, MinderState


def test_messages_rows_and_alerts() -> None:
    settings = MinderSettings(
        bootstrap="unused:9092",
        dsn="chdb://unused",
        online=OnlineConfig(window_s=10, stride_s=10, continuity=2),
    )
    store = MemoryStore()
    state = MinderState(settings, store=store)  # type: ignore[arg-type]
    state.on_message(b"{not json", "p.metrics", 0, 7)
    state.on_message(orjson.dumps({"schema": "metrics", "version": 1}), "p.metrics", 0, 8)
    rng = np.random.default_rng(0)
    t0 = 1_790_000_000 * NS
    published = []
    for s in range(120):
        for h in range(6):
            cpu = 50 + rng.normal(0, 1) - (30 if h == 2 and s >= 40 else 0)
            msg = metrics_message("j", f"h{h}", t0 + s * NS, {"cpu_util": cpu})
            state.on_message(orjson.dumps(msg))
        assert state.on_tick()
        published += state.delivery.take()  # stored: now for the topics
    assert state.dead_letters == 2
    assert [r["offset"] for r in store.rows["dead_letters"]] == [7, 8]
    dead = [p for p in published if p.kind == "dead-letters"]  # bytes as read
    assert (dead[0].kind, dead[0].value) == ("dead-letters", b"{not json")
    assert [dict(p.headers or [])["rankwatch-source-offset"] for p in dead] == [b"7", b"8"]
    alerts = [decode("alerts", p.value) for p in published if p.kind == "alerts"]
    assert [a["evidence"]["host"] for a in alerts] == ["h2"]
    assert [r["state"] for r in store.rows["alerts"]] == ["firing"]
    assert len(store.rows["machine_faults"]) == 1
    assert {r["host"] for r in store.rows["machine_scores"]} == {f"h{h}" for h in range(6)}
