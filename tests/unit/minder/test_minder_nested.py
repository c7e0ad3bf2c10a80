"""The nested protocol of ``rankwatch minder eval DIR`` (``streams/minder/nested.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.servergroups import write_group

from rankwatch.cli import main
from rankwatch.streams.minder.blend import fit_blend
from rankwatch.streams.minder.files import load_group
from rankwatch.streams.minder.nested import default_candidates, held_out_predictions, nested_study
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import Group

ASD = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "asd"


def asd() -> Group:
    if not ASD.is_dir():
        pytest.skip("../shared/data is absent")
    return load_group(ASD)[0]


def test_on_the_development_servers_the_default_beats_the_baseline_clearly() -> None:
    """The figures in docs/minder.md, "The nested protocol" (deterministic)."""
    out = nested_study(asd())
    assert out["default"]["window_f1"] == pytest.approx(0.342, abs=5e-4)
    assert out["baseline"]["window_f1"] == pytest.approx(0.1791, abs=5e-4)
    diff = out["default_vs_baseline"]
    assert diff["window_f1"]["ci95"][0] > 0 and diff["false_alarms_per_machine_day"]["ci95"][1] < 0
    assert out["default"]["segments"] == 38
    assert out["peer_metrics"] == [f"m{k}" for k in range(7, 20)]  # m1-m6 move on their own


def test_a_servers_own_labels_never_reach_its_predictions() -> None:
    group = asd()
    fit = fit_blend(group.train_MTK, 8, 4)
    starts = window_starts(group.test_MTK.shape[1], 8, 4)
    candidates = default_candidates(group, fit)
    before, _ = held_out_predictions(candidates, group, starts, 8)
    labels = group.label_MT.copy()
    labels[2] = np.roll(1 - labels[2], 500)  # server 2's labels: anything at all
    scrambled = Group(group.metrics, group.train_MTK, group.test_MTK, labels)
    after, _ = held_out_predictions(candidates, scrambled, starts, 8)
    assert np.array_equal(before[:, 2], after[:, 2])
    assert not np.array_equal(before, after)  # the other folds did read them


def test_eval_needs_no_training_and_finds_the_planted_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = write_group(tmp_path)
    assert main(["minder", "eval", str(group), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["servers"] == [f"omi-{s}" for s in range(1, 7)]
    assert out["default"]["segments_detected"] == 1 and out["default"]["window_f1"] > 0.5
    assert {"window_f1", "false_alarms_per_machine_day"} <= set(out["default_vs_baseline"])
    assert main(["minder", "eval", str(group)]) == 0
    text = capsys.readouterr().out
    assert "default - baseline (95% intervals" in text and "window F1" in text


def test_one_server_cannot_be_evaluated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    group = write_group(tmp_path, servers=1)
    assert main(["minder", "eval", str(group)]) == 2
    assert "at least two servers" in capsys.readouterr().err
