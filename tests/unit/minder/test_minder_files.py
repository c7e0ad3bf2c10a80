"""Groups on disk with servers of unequal length: truncated copies of the real ASD
servers (read from ``../shared/data/asd``, written to a temporary directory), and files
whose arrays do not fit together (one clear line, exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rankwatch.cli import main
from rankwatch.streams.minder.detector import MinderConfig, MinderModel
from rankwatch.streams.minder.files import GroupFileError, load_group
from rankwatch.streams.minder.study import baseline_loso, minder_loso

ASD = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "asd"


def asd_copy(root: Path, train_rows: int | None = None, test_rows: int | None = None) -> Path:
    """The six servers, cut to the last ``train_rows`` / first ``test_rows`` rows, with
    omi-3 joining late (1,349 train rows fewer: 7,291 of 8,640 on the full split),
    omi-5 leaving early (its test split a fifth shorter) and omi-2 missing 30 samples
    in the middle of its test split (rows of NaN)."""
    if not ASD.is_dir():
        pytest.skip("../shared/data is absent")
    for i in range(1, 7):
        with np.load(ASD / f"omi-{i}.npz", allow_pickle=False) as z:
            train, test, label = z["train"], z["test"], z["test_label"]
        train = train[-(train_rows or len(train)) :]
        test, label = test[: test_rows or len(test)], label[: test_rows or len(test)]
        if i == 3:
            train = train[1349:]
        if i == 5:
            cut = len(test) * 4 // 5
            test, label = test[:cut], label[:cut]
        if i == 2:
            test = test.copy()
            test[len(test) // 2 : len(test) // 2 + 30] = np.nan
        np.savez(root / f"omi-{i}.npz", train=train, test=test, test_label=label)
    return root


def test_truncated_asd_servers_line_up_and_are_scored(tmp_path: Path) -> None:
    group, names = load_group(asd_copy(tmp_path))
    assert names == [f"omi-{i}" for i in range(1, 7)]
    assert group.train_MTK.shape == (6, 8640, 19) and group.test_MTK.shape == (6, 4320, 19)
    assert (
        np.isnan(group.train_MTK[2, :1349]).all() and not np.isnan(group.train_MTK[2, 1349:]).any()
    )
    assert group.present_MT[4].sum() == 3456 and not group.present_MT[4, 3456:].any()
    assert group.present_MT[1].sum() == 4320 - 30 + 2  # the gap's first two points bridged
    config = MinderConfig(window=8, stride=4, denoise=False)
    minder, folds = minder_loso(group, MinderModel(metrics=group.metrics), config)
    base, _ = baseline_loso(group, config)
    assert len(folds) == 6 and minder.segments == 38 - 1  # omi-5 left before its last
    assert minder.f1 > base.f1 > 0.1  # as on the full servers (0.275 vs 0.179)


def test_eval_cli_on_truncated_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    group = asd_copy(tmp_path, train_rows=1500, test_rows=1000)
    assert main(["minder", "eval", str(group), "--paper", "--format", "json", "--epochs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("minder", "baseline"):
        assert 0.0 <= out[name]["f1"] <= 1.0 and out[name]["segments"] > 0
    model = tmp_path / "model.npz"
    assert main(["minder", "train", str(group), "--out", str(model), "--epochs", "1"]) == 0
    assert main(["minder", "detect", str(group), "--model", str(model)]) == 0


def write(root: Path, i: int, **arrays: np.ndarray) -> None:
    np.savez(root / f"omi-{i}.npz", **arrays)


def test_files_that_do_not_fit_together_are_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.zeros((20, 3), dtype=np.float32)
    label = np.zeros(20, dtype=np.uint8)
    cases = {
        "no test_label array": {"train": x, "test": x},
        "5 labels for 20 rows": {"train": x, "test": x, "test_label": label[:5]},
        "timestamps must increase": {
            "train": x,
            "test": x,
            "test_label": label,
            "test_time": np.zeros(20, dtype=np.int64),
        },
        "disagree on the number of metrics": {"train": x[:, :2], "test": x, "test_label": label},
    }
    for n, (reason, arrays) in enumerate(cases.items()):
        root = tmp_path / str(n)
        root.mkdir()
        times = {"test_time": np.arange(20)} if "test_time" in arrays else {}
        write(root, 1, train=x, test=x, test_label=label, **times)
        write(root, 2, **arrays)
        with pytest.raises(GroupFileError, match=reason):
            load_group(root)
        assert main(["minder", "detect", str(root), "--model", str(tmp_path / "none.npz")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write(mixed, 1, train=x, test=x, test_label=label)
    write(mixed, 2, train=x, test=x, test_label=label, test_time=np.arange(20))
    with pytest.raises(GroupFileError, match="some servers have timestamps"):
        load_group(mixed)


def test_holdout_cli_scores_only_the_named_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    group = asd_copy(tmp_path, train_rows=1500, test_rows=1000)
    args = ["minder", "eval", str(group), "--holdout", "omi-5,omi-6", "--epochs", "1"]
    assert main([*args, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["held_out_servers"] == ["omi-5", "omi-6"]
    assert out["development_servers"] == ["omi-1", "omi-2", "omi-3", "omi-4"]
    for name in ("minder", "minder_peer", "minder_fused", "baseline"):
        held = out[name]["held_out"]
        assert {
            "window_f1",
            "point_f1",
            "segments_detected",
            "false_alarms_per_machine_day",
        } <= set(held)
    assert main(["minder", "eval", str(group), "--holdout", "omi-9", "--epochs", "1"]) == 2
    assert "unknown: omi-9" in capsys.readouterr().err
