"""Errors a user can cause by hand: one line on stderr, a non-zero exit, no traceback.

The store's errors (unknown job, a chDB path another process holds) need chDB and are in
tests/integration/test_cli_store_errors.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rankwatch import cli
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.traceio import write_trace


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path]:
    trace, _ = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=2))
    write_trace(trace, tmp_path / "trace.parquet")
    (tmp_path / "meta.yaml").write_text("dp_size: 2\npp_size: 2\n")
    return tmp_path / "trace.parquet", tmp_path / "meta.yaml"


def error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_missing_trace_says_no_such_file(job, capsys: pytest.CaptureFixture[str]) -> None:
    _, meta = job
    missing = "nowhere/trace.parquet"
    line = error_line(["whatif", missing, "--meta", str(meta)], capsys)
    assert line == f"rankwatch whatif: error: no such file: {missing}"


def test_a_missing_meta_says_no_such_file(job, capsys: pytest.CaptureFixture[str]) -> None:
    trace, meta = job
    line = error_line(["replay", str(trace), "--meta", f"{meta}.gone", "--job", "j"], capsys)
    assert line == f"rankwatch replay: error: no such file: {meta}.gone"


@pytest.mark.parametrize(
    "text,reason",
    [
        ("- 1\n- 2\n", "is not a mapping"),
        ("pp_size: 2\n", "lacks dp_size"),
        ("dp_size: two\npp_size: 2\n", "dp_size must be a non-negative integer"),
        ("dp_size: 2\npp_size: [2\n", "is not YAML"),
        ("dp_size: 2\npp_size: 2\ntp_size: 0\n", "tp_size must be at least 1"),
    ],
)
def test_bad_meta_is_named(job, text: str, reason: str, capsys) -> None:
    trace, meta = job
    meta.write_text(text)
    assert reason in error_line(["whatif", str(trace), "--meta", str(meta)], capsys)


def test_sizes_inconsistent_with_the_world_are_rejected(job, capsys) -> None:
    """SE's meta with tp_size 4: 32 x 2 x 2 x 4 = 512 ranks, but world_size says 128."""
    trace, meta = job
    meta.write_text("dp_size: 32\ndsp_size: 2\npp_size: 2\ntp_size: 4\nworld_size: 128\n")
    line = error_line(["whatif", str(trace), "--meta", str(meta)], capsys)
    assert "world_size 128 is not dp_size x dsp_size x pp_size x tp_size" in line
    assert "= 512" in line


def test_a_closed_pipe_is_one_line_and_exit_141(job) -> None:
    """``rankwatch whatif ... | head``: the reader is gone before anything is written."""
    trace, meta = job
    command = [sys.executable, "-m", "rankwatch", "whatif", str(trace), "--meta", str(meta)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # no reader left: the command's first flush gets EPIPE
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == cli.BROKEN_PIPE
    assert err.splitlines() == ["rankwatch whatif: output closed early (broken pipe)"]
