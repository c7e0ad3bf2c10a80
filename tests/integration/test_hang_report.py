"""Hang rows on real chDB and the ``rankwatch hang report`` command reading them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.schemas.codec import encode
from rankwatch.streams.hang.detector import NS, HangConfig
from rankwatch.streams.hang.service import HangService
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration


def heartbeat(rank: int, since_ns: int, optype: str) -> bytes:
    return encode(
        "heartbeats",
        {
            "schema": "heartbeats",
            "version": 1,
            "job": "j",
            "host": f"node{rank // 2}",
            "rank": rank,
            "dp_rank": rank % 2,
            "pp_rank": rank // 2,
            "tp_rank": 0,
            "cp_rank": 0,
            "sent_ns": since_ns,
            "step": 3,
            "pid": 1,
            "last_done": None,
            "in_flight": {"optype": optype, "seq_id": 1, "mb_id": 0, "since_ns": since_ns},
        },
    )


def stacks(rank: int, function: str, sent_ns: int) -> bytes:
    frames = [
        {"file": "train.py", "line": 5, "function": "main"},
        {"file": "train.py", "line": 9, "function": function},
    ]
    return encode(
        "stacks",
        {
            "schema": "stacks",
            "version": 1,
            "job": "j",
            "host": f"node{rank // 2}",
            "rank": rank,
            "sent_ns": sent_ns,
            "reason": "in flight 120 s",
            "threads": [{"name": "MainThread", "thread_id": 7, "native": False, "frames": frames}],
        },
    )


def test_report_names_the_culprit_and_prints_folded_stacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = HangService(HangConfig(floor_s=5, warmup_s=5, silent_after_s=3))
    t0 = time.time_ns()
    out = Output()
    for r in range(4):
        out.extend(svc.on_heartbeat(heartbeat(r, t0, "forward-compute"), Source("hb"), t0))
    for r in (0, 1, 3):
        out.extend(svc.on_stacks(stacks(r, "all_reduce", t0 + NS), Source("st"), t0 + NS))
    for s in range(1, 10):  # rank 2 stopped
        now = t0 + s * NS
        for r in (0, 1, 3):
            out.extend(
                svc.on_heartbeat(
                    heartbeat(r, t0 + NS // 2, "grads-reduce-scatter"), Source("hb"), now
                )
            )
        out.extend(svc.on_tick(now))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    with Store.connect(dsn) as store:
        store.migrate()
        sink = TableSink(store)
        sink.write(out)
        sink.flush()
    assert main(["hang", "report", "j", "--clickhouse", dsn]) == 0
    text = capsys.readouterr().out
    assert "culprits: 2 on node1" in text and "waiting: 0-1,3" in text
    assert "[0-1,3 | 2] train.py:main;train.py:all_reduce" in text
    assert "no stack of the culprits (2) was taken" in text
    assert main(["hang", "report", "j", "--clickhouse", dsn, "--folded"]) == 0
    assert capsys.readouterr().out == "train.py:main;train.py:all_reduce 3\n"

    # the host agent's dump of the stopped rank, taken from outside, comes in later
    late = t0 + 12 * NS
    rows = svc.on_stacks(stacks(2, "forward_stopped_here", late), Source("st"), late)
    with Store.connect(dsn) as store:
        sink = TableSink(store)
        sink.write(rows)
        sink.flush()
    assert main(["hang", "report", "j", "--clickhouse", dsn]) == 0
    own, _, others = capsys.readouterr().out.partition("merged stacks of the others")
    assert "the culprits' own stacks" in own
    assert "[2 | 0-1,3] train.py:main;train.py:forward_stopped_here" in own
    assert "[0-1,3 | 2] train.py:main;train.py:all_reduce" in others
