"""Store errors a user can cause by hand, on real chDB: an unknown job, a store nothing was
stored in, a chDB path another process holds. One line on stderr, exit code 2."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.grafana import sample
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration


def error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", [["report"], ["hang", "report"], ["diagnose"]])
def test_an_unknown_job_names_the_jobs_there(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    with Store.connect(dsn) as store:
        store.migrate()
        sample.fill(store, "known", time.time_ns())
    line = error_line([*command, "nope", "--clickhouse", dsn], capsys)
    assert line.endswith(f"error: unknown job 'nope' in {dsn} (jobs there: known)")


def test_diagnose_a_job_without_signals_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sample's rank 1 loses FLOP/s; a job whose hooks predate ops v2 has no rows,
    and is diagnosed from its what-if alone; a job with neither is refused."""
    dsn = f"chdb://{tmp_path / 'chdb'}"
    with Store.connect(dsn) as store:
        store.migrate()
        sample.fill(store, "known", time.time_ns())
    assert main(["diagnose", "known", "--clickhouse", dsn]) == 0
    assert "cause: straggler compute (flops-drop on rank 1)" in capsys.readouterr().out
    with Store.connect(dsn) as store:
        store.query("DELETE FROM rank_signals WHERE job = 'known'")
    assert main(["diagnose", "known", "--clickhouse", dsn]) == 0  # the what-if still speaks
    assert "job known: no slowdown signals stored" in capsys.readouterr().out
    with Store.connect(dsn) as store:
        store.query("DELETE FROM steps WHERE job = 'known'")
    line = error_line(["diagnose", "known", "--clickhouse", dsn], capsys)
    assert line.endswith("job 'known' has no slowdown signals and no analysed step (its hooks"
                         " predate ops v2?)")  # fmt: skip


def test_an_empty_store_says_nothing_is_stored_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    line = error_line(["report", "demo", "--clickhouse", dsn], capsys)
    assert f"unknown job 'demo': nothing is stored in {dsn} yet" in line


def test_a_store_held_by_a_running_process_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    holder = (
        "import sys, time\n"
        "from rankwatch.streams.kit.store import Store\n"
        f"with Store.connect({dsn!r}):\n"
        "    print('ready', flush=True)\n"
        "    sys.stdin.read()\n"  # hold the path until the test closes stdin
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            assert proc.stdout.readline().strip() == "ready"
            line = error_line(["report", "demo", "--clickhouse", dsn], capsys)
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)
    assert f"is in use by another process (pid {proc.pid})" in line
    assert line.startswith("rankwatch report: error: chDB data path ")
