"""Every panel's SQL, with the macros expanded as the ClickHouse plugin expands them, runs
on real chDB tables (migrations applied, steps from a trace replayed through the
pipeline) and returns the columns its panel type needs: one test per panel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rankwatch.grafana import sample
from rankwatch.grafana.build import DASHBOARD_DIR
from rankwatch.grafana.checks import (
    PanelQuery,
    flame_problems,
    panel_queries,
    problems,
    variable_queries,
)
from rankwatch.grafana.macros import QueryContext, expand
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration

JOB = "grafana-job"
MODELS = {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}
PANELS = [q for model in MODELS.values() for q in panel_queries(model)]
VARIABLES = [(m["uid"], name, sql) for m in MODELS.values() for name, sql in variable_queries(m)]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, QueryContext]]:
    now_ns = time.time_ns()
    path = tmp_path_factory.mktemp("grafana") / "chdb"
    with Store.connect(f"chdb://{path}") as store:
        store.migrate()
        yield store, sample.fill(store, JOB, now_ns).context(now_ns)


def _columns(store: Store, sql: str) -> list[tuple[str, str]]:
    return [(r["name"], r["type"]) for r in store.query(f"DESCRIBE TABLE ({sql})")]


def _narrowed(ctx: QueryContext) -> QueryContext:
    """The board after a click: one worker, one metric, one host."""
    return replace(
        ctx, variables={**ctx.variables, "worker": "2,1", "metric": "pcie_bw", "host": "host-1"}
    )


def test_every_board_has_panels() -> None:
    assert set(MODELS) == {"job", "workers", "hangs", "machines", "fleet"}
    assert len(PANELS) == sum(len(m["panels"]) for m in MODELS.values())


@pytest.mark.parametrize("panel", PANELS, ids=lambda p: f"{p.board}:{p.title}")
def test_panel_query_returns_what_its_panel_needs(
    filled: tuple[Store, QueryContext], panel: PanelQuery
) -> None:
    store, ctx = filled
    for context in (ctx, _narrowed(ctx)):
        sql = expand(panel.sql, context)
        assert "$" not in sql.replace("$__all", ""), sql
        columns = _columns(store, sql)
        assert problems(panel, columns) == [], sql
        rows = store.query(sql)
        assert rows, f"no rows for {panel.title}:\n{sql}"
        if panel.type == "flamegraph":
            assert flame_problems(rows) == []
        if panel.type == "stat":
            assert any(v for v in rows[0].values()), rows  # the sample makes each non-zero


@pytest.mark.parametrize("board,name,sql", VARIABLES, ids=[f"{b}:{n}" for b, n, _ in VARIABLES])
def test_variable_query_lists_values(
    filled: tuple[Store, QueryContext], board: str, name: str, sql: str
) -> None:
    store, ctx = filled
    rows = store.query(expand(sql, ctx))
    assert rows and all(len(r) == 1 for r in rows)
    if name == "job":
        assert JOB in [r["job"] for r in rows]


def test_the_numbers_match_the_sample(filled: tuple[Store, QueryContext]) -> None:
    store, ctx = filled
    by_title = {(p.board, p.title): p for p in PANELS}

    def one(board: str, title: str) -> dict[str, object]:
        return store.query(expand(by_title[(board, title)].sql, ctx))[0]

    assert one("rankwatch-job", "Partial steps") == {"partial_steps": 1}
    slowdown = one("rankwatch-job", "Slowdown S")["S"]
    assert isinstance(slowdown, float) and 1.1 < slowdown < 1.3  # the demo job's straggler
    top = store.query(expand(by_title[("rankwatch-workers", "Top workers")].sql, ctx))
    assert top[0]["worker"] == "2,1"  # the generator's straggling worker
    fleet = one("rankwatch-fleet", "Jobs by wasted GPU-hours")
    assert fleet["job"] == JOB and fleet["gpu_hours_wasted"] > 0
    assert one("rankwatch-hangs", "Open hangs") == {"open_hangs": 1}
    alerts = store.query(expand(by_title[("rankwatch-fleet", "Open alerts")].sql, ctx))
    open_hang = ctx.variables["episode"]
    assert {a["alert_id"] for a in alerts} == {"straggler-2", open_hang, "faulty-1"}
    episodes = store.query(expand(by_title[("rankwatch-hangs", "Hang episodes")].sql, ctx))
    assert [(e["state"], e["culprit_ranks"]) for e in episodes] == [
        ("open", "6"),
        ("resolved", "3"),
    ]


def test_flame_graph_counts_ranks_per_call_path(filled: tuple[Store, QueryContext]) -> None:
    store, ctx = filled
    (flame,) = [p for p in PANELS if p.type == "flamegraph"]
    rows = store.query(expand(flame.sql, ctx))
    paths = store.query(
        "SELECT stack, n_ranks FROM stacks FINAL WHERE episode_id = {e:String}",
        {"e": ctx.variables["episode"]},
    )
    root = rows[0]
    assert root["label"] == "all stacks" and root["value"] == sum(p["n_ranks"] for p in paths)
    leaves = {r["label"]: r["self"] for r in rows if r["self"]}
    assert {p["stack"].split(";")[-1]: p["n_ranks"] for p in paths} == leaves
    assert sorted(leaves.values()) == [1, 15, 16]  # the culprit, the waiters, every publisher


def test_dashboard_dir_is_the_source_tree() -> None:
    assert (Path(__file__).resolve().parents[2] / "grafana" / "dashboards") == DASHBOARD_DIR
