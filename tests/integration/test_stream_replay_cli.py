"""``rankwatch replay`` embedded (no Kafka): trace ST into chDB, one row per step."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.streams.kit.store import Store

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "stragglers"
pytestmark = pytest.mark.integration


def test_replay_embedded_stores_every_step(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    if not (DATA / "trace-ST.parquet").exists():
        pytest.skip("../shared/data is absent")
    dsn = f"chdb://{tmp_path / 'chdb'}"
    args = [str(DATA / "trace-ST.parquet"), "--meta", str(DATA / "meta-ST.yaml")]
    assert main(["replay", *args, "--job", "st", "--clickhouse", dsn]) == 0
    assert "32 complete and 0 partial steps" in capsys.readouterr().out
    with Store.connect(dsn) as store:
        rows = store.query("SELECT count() AS n, countIf(slowdown > 1) AS slow FROM steps")
    assert rows[0]["n"] == 32 and rows[0]["slow"] > 0
