"""The shipped traces reproduce their published what-if results (docs/whatif.md, "Checks";
the data's own README)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rankwatch.sim import Analysis, analyse
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "stragglers"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"no shipped traces at {DATA}")
TRACES = ("SE", "ST")
REL = 0.005  # the correctness bar: 0.5% relative


@cache
def analysed(name: str) -> Analysis:
    return analyse(
        read_trace(DATA / f"trace-{name}.parquet"), read_meta(DATA / f"meta-{name}.yaml")
    )


@cache
def published(name: str, kind: str = "result") -> dict:
    return json.loads((DATA / f"{kind}-{name}.json").read_text())


@pytest.mark.parametrize("name", TRACES)
def test_slowdowns_match(name: str) -> None:
    a, pub = analysed(name), published(name)
    assert a.slowdown == pytest.approx(pub["blocking_slowdown"], rel=REL)
    assert a.launch_slowdown == pytest.approx(pub["launch_slowdown"], rel=REL)


@pytest.mark.parametrize("name", TRACES)
def test_step_times_match(name: str) -> None:
    a, pub = analysed(name), published(name)
    steps = [str(s) for s in a.steps.tolist()]
    assert sorted(steps) == sorted(pub["step_t_base"])
    for ours, key in (
        (a.base_S, "step_t_base"),
        (a.simulated_S, "step_t_nodelay"),
        (a.ideal_S, "step_t_noblk"),
    ):
        theirs = np.array([pub[key][s] for s in steps])
        np.testing.assert_allclose(ours, theirs, rtol=REL)
    theirs = np.array([pub["blocking_step_slowdown"][s] for s in steps])
    np.testing.assert_allclose(a.step_slowdown, theirs, rtol=REL)


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("dim", ["optype", "dp_rank", "stage"])
def test_attributions_match_with_the_same_top_group(name: str, dim: str) -> None:
    a, pub = analysed(name), published(name)
    ours, theirs = a.attribution(dim), pub[f"blocking_decompose_by_{dim}"]
    assert set(ours) == set(theirs)
    for group, value in theirs.items():
        assert ours[group] == pytest.approx(value, rel=REL), group
    assert next(iter(ours)) == max(theirs, key=theirs.get)


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("dim", ["optype", "dp_rank", "stage"])
def test_attributions_per_step_match(name: str, dim: str) -> None:
    a, pub = analysed(name), published(name)
    ours = a.attribution_per_step(dim)
    theirs = pub[f"blocking_decompose_by_{dim}_per_step"]
    for i, step in enumerate(a.steps.tolist()):
        for group, value in theirs[str(step)].items():
            assert ours[group][i] == pytest.approx(value, rel=REL), (step, group)


@pytest.mark.parametrize("name", TRACES)
def test_worker_and_stage_fixes_match(name: str) -> None:
    a = analysed(name)
    assert a.m_s == pytest.approx(published(name, "ms")["Ms"], abs=0.02)
    assert a.m_w == pytest.approx(published(name, "mw")["Mw"], abs=0.02)


@pytest.mark.parametrize("name", TRACES)
def test_replay_with_launch_delays_reproduces_recorded_step_times(name: str) -> None:
    assert analysed(name).replay_error < 1e-6


def test_json_has_the_cli_keys() -> None:
    out = analysed("ST").to_json()
    for key in ("slowdown", "launch_slowdown", "waste", "step_time", "step_slowdown", "M_W", "M_S"):
        assert key in out
    assert set(out["step_time"]) >= {"base", "simulated", "ideal"}  # type: ignore[arg-type]
    assert set(out["attribution"]) >= {"optype", "dp_rank", "stage", "worker"}  # type: ignore[arg-type]
    assert next(iter(out["attribution"]["worker"])) == "1,3"  # type: ignore[index]
    json.dumps(out, allow_nan=False)
