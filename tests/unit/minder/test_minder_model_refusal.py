"""A model trained on metrics the agent never sends is refused when the worker starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankwatch.agent.sampler import HostSampler, ProcessSampler
from rankwatch.cli import main
from rankwatch.schemas.agentmetrics import agent_metric
from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.serial import model_to_arrays
from rankwatch.streams.minder.worker import model_refusal

NS = 1_000_000_000


def save(path: Path, metrics: tuple[str, ...]) -> str:
    savez: Any = np.savez  # numpy's stub types **arrays as the allow_pickle flag
    savez(path, **model_to_arrays(MinderModel(metrics=metrics)))
    return str(path)


def test_a_model_of_asd_metrics_is_refused_at_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asd = save(tmp_path / "asd.npz", tuple(f"m{k}" for k in range(1, 20)))
    assert main(["minder", "worker", "--model", asd, "--kafka", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none of which the agent sends" in err
    assert "m1" in err and "cpu_util" in err


def test_a_model_of_the_agents_metrics_is_accepted(tmp_path: Path) -> None:
    assert model_refusal(save(tmp_path / "ok.npz", ("cpu_util", "gpu3_power_w"))) is None
    assert model_refusal("") is None
    assert "cannot read the model" in str(model_refusal(str(tmp_path / "missing.npz")))


def test_a_damaged_model_file_is_refused_not_raised(tmp_path: Path) -> None:
    """A copy cut short (a zip without its directory) or a file that is no model."""
    good = Path(save(tmp_path / "ok.npz", ("cpu_util",))).read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good[: len(good) // 2])
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a model at all")
    for path in (cut, junk):
        assert "cannot read the model" in str(model_refusal(str(path)))


def test_every_metric_the_samplers_send_is_the_agents() -> None:
    """The catalogue the refusal reads is the samplers' own tables: what this box's
    /proc gives, both samplers, is in it."""
    sent: set[str] = set()
    for sampler in (HostSampler(), ProcessSampler(os.getpid())):
        sampler.sample(0)
        sent |= set(sampler.sample(NS))
    assert {"cpu_util", "mem_used_bytes", "involuntary_switches_ps"} <= sent
    assert all(agent_metric(name) for name in sent), sorted(n for n in sent if not agent_metric(n))
    assert not agent_metric("m1") and agent_metric("gpu0_nvlink_tx_Bps")
