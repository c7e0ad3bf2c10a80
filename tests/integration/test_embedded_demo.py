"""The embedded default on real chDB: the demo command, and dead letters in the table."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.sim.tracegen import GenConfig, demo_config, generate_trace
from rankwatch.streams.kit.output import Source
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.embedded import run_embedded
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches

pytestmark = pytest.mark.integration


def test_demo_prints_one_row_per_step_and_writes_the_heatmap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dir", str(tmp_path), "--clickhouse", f"chdb://{tmp_path}/chdb"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\.\d+s", line)]
    assert len(rows) == demo_config().steps
    assert all(line.rstrip().endswith("complete") for line in rows)
    assert "Slowdown S =" in out
    assert (tmp_path / "heatmap.png").read_bytes().startswith(b"\x89PNG")


def test_bad_messages_land_in_the_dead_letter_table(tmp_path: Path) -> None:
    trace, meta = generate_trace(GenConfig(dp=1, pp=2, microbatches=2, steps=2, seed=1))
    with Store.connect(f"chdb://{tmp_path / 'chdb'}") as store:
        store.migrate()
        pipeline = Pipeline()
        sink = TableSink(store)
        now = time.time_ns()  # rows older than the tables' TTL would vanish
        for offset, data in enumerate((b"not json", b'{"schema": "ops", "version": 7}'), 41):
            source = Source("rankwatch.ops", 0, offset, b"j")
            sink.write(pipeline.on_message(data, source, now))
        run_embedded(replay_batches(trace, meta, "j", origin_ns=now), pipeline, sink)
        letters = store.query("SELECT reason, offset, payload FROM dead_letters ORDER BY reason")
        steps = store.query("SELECT count() AS n FROM steps FINAL WHERE job = 'j'")
    assert [r["reason"] for r in letters] == ["malformed-json", "unknown-version"]
    assert letters[0]["payload"] == "not json" and letters[0]["offset"] == 41
    assert steps[0]["n"] == 2
