"""The committed boards are what the builders make, load as the SDK's dashboard model,
keep their uids, and follow the ClickHouse plugin's conventions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel

from rankwatch.grafana.boards import BOARDS, UIDS
from rankwatch.grafana.build import DASHBOARD_DIR, build_all, load_model, render, stale
from rankwatch.grafana.common import PLUGIN, ClickHouseQuery

EXPECTED_UIDS = {
    "job": "rankwatch-job",
    "workers": "rankwatch-workers",
    "hangs": "rankwatch-hangs",
    "machines": "rankwatch-machines",
    "fleet": "rankwatch-fleet",
}


def committed(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARD_DIR / f"{name}.json").read_text())
    return data


def test_committed_boards_are_up_to_date() -> None:
    assert stale() == [], "run: rankwatch grafana build"


def test_building_twice_writes_the_same_bytes(tmp_path: Path) -> None:
    first = {p.name: p.read_bytes() for p in build_all(tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in build_all(tmp_path / "b")}
    assert first == second
    assert first == {f"{n}.json": (DASHBOARD_DIR / f"{n}.json").read_bytes() for n in BOARDS}
    assert sorted(p.name for p in DASHBOARD_DIR.glob("*.json")) == sorted(first)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_loads_as_the_sdk_dashboard_model(name: str) -> None:
    data = committed(name)
    model = Dashboard.from_json(data)
    assert load_model(data) == data  # nothing lost or added by the typed model
    targets = [t for p in model.panels or [] if isinstance(p, Panel) for t in p.targets or []]
    assert targets and all(isinstance(t, ClickHouseQuery) for t in targets)
    assert render(data) == (DASHBOARD_DIR / f"{name}.json").read_text()


def test_uids_are_stable() -> None:
    assert UIDS == EXPECTED_UIDS
    assert {n: committed(n)["uid"] for n in BOARDS} == EXPECTED_UIDS


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_follows_the_plugin_conventions(name: str) -> None:
    data = committed(name)
    assert data["timezone"] == "utc"
    assert data["time"] == {"from": "now-6h", "to": "now"}
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["query"] == PLUGIN
    if name != "fleet":
        assert variables["job"]["type"] == "query"
    titles = [p["title"] for p in data["panels"]]
    assert len(titles) == len(set(titles))
    for panel in data["panels"]:
        assert panel["datasource"] == {"type": PLUGIN, "uid": "${datasource}"}
        (target,) = panel["targets"]
        sql = target["rawSql"]
        assert target["editorType"] == "sql"
        if panel["type"] in ("timeseries", "heatmap"):
            assert target["queryType"] == "timeseries" and target["format"] == 0
            assert re.match(
                r"SELECT (\$__timeInterval\(time\) AS time|\w*\.?time AS time|time)", sql
            )
        else:
            assert target["queryType"] == "table" and target["format"] == 1
        if "${job}" in sql or "'${job}'" in sql:
            assert "job = '${job}'" in sql  # single values go in unquoted: the SQL quotes


def test_links_between_boards_use_known_uids() -> None:
    text = "".join((DASHBOARD_DIR / f"{n}.json").read_text() for n in BOARDS)
    linked = set(re.findall(r"/d/([\w-]+)", text))
    assert linked and linked <= set(EXPECTED_UIDS.values())


def test_the_issue_s_panels_are_there() -> None:
    titles = {n: {p["title"] for p in committed(n)["panels"]} for n in BOARDS}
    assert {
        "Step time: recorded, simulated, ideal",
        "Slowdown S and waste W",
        "GPU-hours wasted",
        "Top op types",
        "Top pipeline stages",
        "Top DP ranks",
        "Partial steps",
    } <= titles["job"]
    assert {"S_w on the DP x PP grid", "S_w per step"} <= titles["workers"]
    assert {"Hang episodes", "Merged stacks"} <= titles["hangs"]
    assert {"Score per host", "Score per metric", "Faulty-machine episodes"} <= titles["machines"]
    assert {"Jobs by wasted GPU-hours", "Open alerts"} <= titles["fleet"]
    types = {p["type"] for n in BOARDS for p in committed(n)["panels"]}
    assert {"flamegraph", "heatmap", "table", "timeseries", "stat", "barchart"} <= types


def test_the_readme_lists_every_panel() -> None:
    readme = (Path(__file__).resolve().parents[3] / "grafana" / "README.md").read_text()
    missing = [
        (n, p["title"]) for n in BOARDS for p in committed(n)["panels"] if p["title"] not in readme
    ]
    assert missing == []
