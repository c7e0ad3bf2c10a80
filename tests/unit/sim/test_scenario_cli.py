"""``rankwatch scenario``: the JSON contract, the table, the plot, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwatch import cli
from rankwatch.sim import analyse
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.traceio import write_trace


@pytest.fixture(autouse=True)
def only_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("rankwatch.commands.scenario",))


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path, float]:
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=4, steps=2))
    write_trace(trace, tmp_path / "trace.parquet")
    (tmp_path / "meta.yaml").write_text(
        "dp_size: 2\npp_size: 2\nhardware:\n  gpu: A100\n  inter_gbps: 200\n  intra_gbps: 2400\n"
        "  gpus_per_host: 2\n"
    )
    return (
        tmp_path / "trace.parquet",
        tmp_path / "meta.yaml",
        analyse(trace, meta).simulated_S.mean(),
    )


def scenario(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["scenario", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_the_baseline_first_then_the_change(job, capsys) -> None:
    trace, meta, simulated = job
    changes = ["--set", "network.inter_gbps=400", "--set", "gpu.model=H100"]
    code, out, _ = scenario(str(trace), "--meta", str(meta), *changes, "--format", "json",
                            capsys=capsys)  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert list(doc) == ["scenarios"]
    base, changed = doc["scenarios"]
    assert base == {"name": "baseline", "settings": {}, "step_time_s": simulated, "speedup": 1.0}
    assert changed["settings"] == {"network.inter_gbps": 400.0, "gpu.model": "H100"}
    assert set(changed) == {"name", "settings", "step_time_s", "speedup"}
    assert changed["speedup"] > 1


def test_sweep_prints_a_table_and_draws_the_curve(job, capsys, tmp_path: Path) -> None:
    trace, meta, _ = job
    for plot in ("curve.png", "curve.html"):
        code, out, _ = scenario(str(trace), "--meta", str(meta), "--sweep",
                                "network.inter_gbps=100,200,400", "--plot",
                                str(tmp_path / plot), capsys=capsys)  # fmt: skip
        assert code == 0
        assert "network.inter_gbps=400" in out and "speedup" in out
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<img" in (tmp_path / "curve.html").read_bytes()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--set", "network.nope=3"], "unknown scenario key"),
        (["--set", "parallel.tp=4"], "parallel.tp cannot change"),
        (["--set", "gpu.speed"], "KEY=VALUE"),
        (["--sweep", "gpu.speed=x,y"], "must be a number"),
    ],
)
def test_bad_scenarios_exit_2_with_one_line(job, capsys, argv: list[str], words: str) -> None:
    trace, meta, _ = job
    code, out, err = scenario(str(trace), "--meta", str(meta), *argv, capsys=capsys)
    assert code == 2 and out == ""
    assert words in err and err.count("\n") == 1


def test_a_trace_needs_its_meta(job, capsys) -> None:
    code, _, err = scenario(str(job[0]), capsys=capsys)
    assert code == 2 and "--meta" in err
