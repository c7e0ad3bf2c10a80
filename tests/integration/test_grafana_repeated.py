"""A board shows the same whether a row was stored once or twice.

Every table is a ReplacingMergeTree: a retried flush, a restarted worker analysing a
step again, or raw ops inserted without the collapse (``Store.insert_ops``) store a row
twice, and the copies become one only at a merge or under ``FINAL``. A panel that sums
or counts rows without either shows the double until ClickHouse gets round to merging.
Here the whole demo sample is stored a second time, merges stopped, and every panel
must return what it returned before."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rankwatch.grafana import sample
from rankwatch.grafana.build import DASHBOARD_DIR
from rankwatch.grafana.checks import panel_queries
from rankwatch.grafana.macros import QueryContext, expand
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration

JOB = "repeated-job"
BOARDS = [json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))]
PANELS = [q for board in BOARDS for q in panel_queries(board)]
NOW_DEPENDENT = {"stalled_s"}
"""Columns computed from the query's own clock, which moves between the two reads."""


def _answers(store: Store, ctx: QueryContext) -> dict[str, list[dict[str, Any]]]:
    return {
        f"{p.board}:{p.title}": [
            {k: v for k, v in row.items() if k not in NOW_DEPENDENT}
            for row in store.query(expand(p.sql, ctx))
        ]
        for p in PANELS
    }


def test_every_panel_counts_a_row_stored_twice_once(tmp_path: Path) -> None:
    now_ns = time.time_ns()
    with Store.connect(f"chdb://{tmp_path / 'chdb'}") as store:
        store.migrate()
        for row in store.query("SHOW TABLES"):
            store.query(f"SYSTEM STOP MERGES {row['name']}")
        filled = sample.fill(store, JOB, now_ns)
        ctx = filled.context(now_ns)
        once = _answers(store, ctx)
        assert sample.fill(store, JOB, now_ns) == filled  # the same rows again
        twice = _answers(store, ctx)
    assert sum(len(rows) for rows in once.values()) > 0
    differ = {title: (once[title], twice[title]) for title in once if once[title] != twice[title]}
    assert not differ, "\n".join(f"{t}: once {a!r}\n  twice {b!r}" for t, (a, b) in differ.items())
