"""``rankwatch demo`` keeps its generator path when asked (the default without torch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankwatch.cli import main

pytestmark = pytest.mark.integration


def test_demo_on_the_generated_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workload", "generator", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job demo: DP ")
    rows = [line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\.\d+s", line)]
    assert len(rows) == 12 and "Slowdown S =" in out
