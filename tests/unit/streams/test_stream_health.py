"""The health file: written atomically, read back; stale or lagging means unhealthy, and
``rankwatch worker --health`` says so through its exit status."""

from __future__ import annotations

import time
from pathlib import Path

from rankwatch.cli import main
from rankwatch.streams.health import check_status, read_status, write_status


def test_fresh_status_is_healthy_stale_or_lagging_is_not(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_status(path, {"records_in": 5, "sink_lag_s": 0.5, "last_error": None})
    status = read_status(path)
    now = time.time_ns()
    assert status["records_in"] == 5 and status["pid"] > 0
    assert check_status(status, now, max_age_s=30, max_lag_s=60) == []
    assert "old" in check_status(status, now + 31 * 10**9, 30, 60)[0]
    lagging = {**status, "sink_lag_s": 90.0, "last_error": "connection refused"}
    assert "connection refused" in check_status(lagging, now, 30, 60)[0]


def test_health_command_exit_status(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "status.json"
    write_status(path, {"records_in": 1, "sink_lag_s": 0.0})
    assert main(["worker", "--health", str(path)]) == 0
    assert main(["worker", "--health", str(tmp_path / "missing.json")]) == 1
    assert "unhealthy" in capsys.readouterr().out
