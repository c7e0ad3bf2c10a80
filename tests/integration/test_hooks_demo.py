"""``rankwatch demo --workload torch``: the real PyTorch job, stored like the generated one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.commands.demo import DEMO_STEPS

pytestmark = pytest.mark.integration


def test_demo_on_the_real_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--workload", "torch", "--dir", str(tmp_path)]
    assert main([*args, "--clickhouse", f"chdb://{tmp_path}/chdb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job demo: real PyTorch training, DP 2 x PP 2")
    rows = [line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\.\d+s", line)]
    assert [int(r.split()[0]) for r in rows] == list(range(1, DEMO_STEPS + 1))  # step 0 left out
    assert "Live figures, as stored" in out and "Offline figures over the whole trace" in out
    assert (tmp_path / "trace.parquet").is_file() and (tmp_path / "meta.yaml").is_file()
