"""The health file: written atomically, read back; stale, lagging, unsubscribed,
unassigned, behind-and-idle or store-less means unhealthy, with the reason, and
``rankwatch worker --health`` says so through its exit status."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rankwatch.cli import main
from rankwatch.streams.kit.health import check_status, health_problems, read_status, write_status

HEALTHY: dict[str, Any] = {
    "records_in": 5,
    "messages_in": 2,
    "sink_lag_s": 0.5,
    "last_error": None,
    "topics": {"p.ops": 8},
    "assigned": ["p.ops:0"],
    "lag": {"p.ops:0": 0},
    "store_connected": True,
    "store_retry_in_s": 0.0,
}


def test_fresh_status_is_healthy_stale_or_lagging_is_not(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_status(path, HEALTHY)
    status = read_status(path)
    now = time.time_ns()
    assert status["records_in"] == 5 and status["pid"] > 0
    assert check_status(status, now, max_age_s=30, max_lag_s=60) == []
    assert "old" in check_status(status, now + 31 * 10**9, 30, 60)[0]
    lagging = {**status, "sink_lag_s": 90.0, "last_error": "connection refused"}
    assert "connection refused" in check_status(lagging, now, 30, 60)[0]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"topics": {}}, "not subscribed"),
        ({"assigned": []}, "no partitions assigned"),
        ({"messages_in": 0, "lag": {"p.ops:0": 7}}, "p.ops:0 7"),
        ({"messages_in": 0, "lag": {}}, "position unknown"),
        ({"store_connected": False}, "store not writable"),
        ({"store_retry_in_s": 2.0, "last_error": "refused"}, "refused"),
    ],
)
def test_each_unmet_condition_names_its_reason(change: dict[str, Any], reason: str) -> None:
    problems = health_problems({**HEALTHY, **change})
    assert len(problems) == 1 and reason in problems[0]


def test_caught_up_without_input_is_healthy() -> None:
    """A worker restarted on a quiet topic has read nothing and is behind nothing."""
    assert health_problems({**HEALTHY, "messages_in": 0, "lag": {"p.ops:0": 0}}) == []


def test_health_command_exit_status(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "status.json"
    write_status(path, HEALTHY)
    assert main(["worker", "--health", str(path)]) == 0
    write_status(path, {**HEALTHY, "assigned": []})
    assert main(["worker", "--health", str(path)]) == 1
    assert "no partitions assigned" in capsys.readouterr().out
    assert main(["worker", "--health", str(tmp_path / "missing.json")]) == 1
    assert "unhealthy" in capsys.readouterr().out
