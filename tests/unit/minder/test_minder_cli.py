"""``rankwatch minder train|eval|detect`` on a small group in the ASD file format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.servergroups import write_group

from rankwatch.cli import main


def test_eval_prints_both_detectors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    group = write_group(tmp_path)
    assert main(["minder", "eval", str(group), "--paper", "--format", "json", "--epochs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("minder", "baseline"):
        assert {"precision", "recall", "f1", "mean_delay_points"} <= set(out[name])
    assert set(out["ablations"]) >= {"no_denoising", "no_continuity", "one_joint_model"}
    assert out["servers"] == [f"omi-{s}" for s in range(1, 7)]
    assert out["ablations"]["no_denoising"]["f1"] > 0.5  # the planted drift is found


def test_train_then_detect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    group = write_group(tmp_path)
    model = tmp_path / "model.npz"
    assert main(["minder", "train", str(group), "--out", str(model), "--epochs", "1"]) == 0
    assert model.exists()
    assert "labels" not in capsys.readouterr().out  # the test labels are left alone...
    with np.load(model) as arrays:
        assert not any("priority" in k and arrays[k].size for k in arrays.files)
    labelled = tmp_path / "labelled.npz"  # ...unless asked for
    args = ["minder", "train", str(group), "--out", str(labelled), "--epochs", "1", "--labels"]
    assert main(args) == 0
    assert "metric priority from the test split's labels" in capsys.readouterr().out
    assert main(["minder", "detect", str(group), "--model", str(model)]) == 0
    lines = capsys.readouterr().out.splitlines()
    hits = [line.split("\t") for line in lines]
    planted = [h for h in hits if h[0] == "omi-3" and h[2] == "metric m2"]
    assert len(planted) >= 5 and len(planted) > len(hits) / 2, lines


def test_detect_live_replays_the_group_through_the_live_monitor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = write_group(tmp_path)
    assert main(["minder", "detect", str(group), "--live"]) == 0
    hits = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert hits and {h[0] for h in hits} == {"omi-3"}  # the planted drift, nothing else
    first = [int(p) for p in hits[0][1].removeprefix("points ").split("-")]
    assert first[1] >= 80 and first[0] < 130  # inside the drift (points 80-129)
    assert main(["minder", "detect", str(group)]) == 2
    assert "needs --model" in capsys.readouterr().err


def test_bad_directory_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["minder", "eval", str(tmp_path)]) == 2
    assert "no *.npz server files" in capsys.readouterr().err


def test_rotate_holds_out_each_server_in_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    group = write_group(tmp_path)
    args = ["minder", "eval", str(group), "--rotate", "--epochs", "1"]
    assert main([*args, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["held_out_servers"] == [f"omi-{s}" for s in range(1, 7)]
    for name in ("minder", "minder_peer", "minder_fused", "baseline"):
        assert len(out[name]["chosen_per_fold"]) == 6
        assert out[name]["held_out"]["segments"] == 1  # omi-3's planted drift
        assert out[name]["held_out"]["machine_days"] == pytest.approx(6 * 200 / 288, abs=0.01)
    segment = out["minder_fused"]["held_out_segments"]
    assert [(s["server"], s["first"], s["last"]) for s in segment] == [("omi-3", 80, 129)]
    assert main([*args, "--holdout", "omi-1"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert main([*args, "--fa-budget", "1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["selection"] == {
        "by": "segments_within_false_alarm_budget",
        "false_alarms_per_machine_day": 1.0,
    }
    for name in ("minder", "minder_peer", "minder_fused", "default", "baseline"):  # per fold
        assert len(out[name]["chosen_per_fold"]) == 6
        assert out[name]["held_out"]["segments"] == 1
    plain = ["minder", "eval", str(group), "--fa-budget", "1", "--epochs", "1"]
    assert main(plain) == 2
    assert "add --holdout or --rotate" in capsys.readouterr().err


def test_holdout_with_the_live_monitor_and_bootstrap_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    group = write_group(tmp_path)
    args = ["minder", "eval", str(group), "--holdout", "omi-3,omi-4", "--epochs", "1", "--live"]
    assert main([*args, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    live = out["minder_live"]
    assert set(live["chosen"]) == {"threshold", "continuity"}
    assert live["held_out"]["segments"] == 1  # omi-3's planted drift
    assert [s["server"] for s in live["held_out_segments"]] == ["omi-3"]
    pairs = out["comparisons"]
    names = (
        "minder",
        "minder_peer",
        "minder_fused",
        "minder_live",
        "minder_live_pairwise",
        "default",
    )
    assert set(pairs) == {f"{n}_vs_baseline" for n in names} | {
        "minder_live_vs_minder_live_pairwise"
    }
    assert set(out["minder_live_pairwise"]["chosen"]) == {"threshold", "continuity"}
    for c in pairs.values():
        for key in (
            "segments_detected",
            "detect_minutes_median",
            "false_alarms_per_machine_day",
            "window_f1",
        ):
            lo, hi = c[key]["ci95"]
            assert lo <= hi
        assert c["bootstrap"]["unit"] == "server-day"
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "minder_live" in text and "paired bootstrap over server-days" in text
    assert main(["minder", "eval", str(group), "--live", "--epochs", "1"]) == 2
    assert "add --holdout or --rotate" in capsys.readouterr().err


def test_any_file_names_are_servers_in_natural_order(tmp_path: Path) -> None:
    """Another dataset in the same layout names its servers otherwise."""
    import numpy as np

    from rankwatch.streams.minder.files import group_files

    for name in ("node10", "node9", "db-2", "node1"):
        np.savez(tmp_path / f"{name}.npz", train=np.zeros((2, 1)))
    np.savez(tmp_path / "model.npz", weights=np.zeros(3))  # a model beside its data
    (tmp_path / "README.md").write_text("not a server")
    assert [p.stem for p in group_files(tmp_path)] == ["db-2", "node1", "node9", "node10"]
