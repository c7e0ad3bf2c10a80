"""``rankwatch whatif``: JSON and text output, heatmap, exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwatch import cli
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.traceio import write_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "stragglers"


@pytest.fixture(autouse=True)
def only_whatif(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command under test alone: other commands' modules are not this test's concern."""
    monkeypatch.setattr(cli, "COMMANDS", ("rankwatch.commands.whatif",))


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path]:
    trace, meta = generate_trace(
        GenConfig(dp=2, pp=4, microbatches=4, steps=3, stragglers=(Straggler(1, 3, 1.6),))
    )
    write_trace(trace, tmp_path / "trace.parquet")
    (tmp_path / "meta.yaml").write_text(f"dp_size: {meta.dp_size}\npp_size: {meta.pp_size}\n")
    return tmp_path / "trace.parquet", tmp_path / "meta.yaml"


def test_json_output(job, capsys: pytest.CaptureFixture[str]) -> None:
    trace, meta = job
    assert cli.main(["whatif", str(trace), "--meta", str(meta), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slowdown"] > 1.03
    assert set(out["step_time"]) == {"base", "simulated", "ideal"}
    assert next(iter(out["attribution"]["worker"])) == "1,3"
    assert next(iter(out["attribution"]["stage"])) == "3"


def test_text_output_explains_in_words(job, capsys: pytest.CaptureFixture[str]) -> None:
    trace, meta = job
    assert cli.main(["whatif", str(trace), "--meta", str(meta)]) == 0
    text = capsys.readouterr().out
    assert "Slowdown S = " in text and "of the slowdown" in text and "Finding:" in text


def test_heatmap_is_a_png(job, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, meta = job
    png = tmp_path / "heat.png"
    assert cli.main(["whatif", str(trace), "--meta", str(meta), "--heatmap", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreadable_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_size: 1\npp_size: 1\n")
    assert cli.main(["whatif", str(bad), "--meta", str(meta)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read trace" in err[0]


def test_unmodellable_trace_exits_2(job, capsys: pytest.CaptureFixture[str]) -> None:
    trace, meta = job
    meta.write_text("dp_size: 2\npp_size: 2\n")  # the trace has 4 stages
    assert cli.main(["whatif", str(trace), "--meta", str(meta)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot model" in err[0] and "stage" in err[0]


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no shipped traces at {DATA}")
def test_st_matches_the_published_slowdown(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["whatif", str(DATA / "trace-ST.parquet"), "--meta", str(DATA / "meta-ST.yaml")]
    assert cli.main([*args, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    published = json.loads((DATA / "result-ST.json").read_text())
    assert out["slowdown"] == pytest.approx(published["blocking_slowdown"], rel=0.005)
    assert out["M_S"] == pytest.approx(1.2194, abs=0.02)


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no shipped traces at {DATA}")
def test_se_findings_do_not_contradict_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    """SE: the last stage explains 68.8%; the DP-rank spread may speak only for the rest
    (it once said the slowdown was 'not ... the stage split' right below)."""
    args = ["whatif", str(DATA / "trace-SE.parquet"), "--meta", str(DATA / "meta-SE.yaml")]
    assert cli.main(args) == 0
    findings = [line for line in capsys.readouterr().out.splitlines() if "Finding:" in line]
    assert len(findings) == 2
    assert "the last pipeline stage explains 68.8% of the slowdown" in findings[0]
    assert "the other 31.2% of the slowdown is spread over the job" in findings[1]
    assert not any("stage split" in line for line in findings)
