"""The fault suite's yardstick: what a clean run of the same input stores, and the check
that a store holds exactly that after a fault (a test helper, not in the wheel).

A clean run is the worker's own pipeline, in process, with its default settings and no
grace deadline, fed every message once in the order it was made. After any fault the
guarantees table (docs/contracts.md, "Guarantees") promises the same rows, read with
``FINAL``: every step analysed as in the clean run, the same attributions and alerts,
and every op record the input holds; :func:`assert_stored_as_clean` checks all four,
and, where a fault may not repeat anything, that no raw row is there twice.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch.schemas.codec import decode_ops
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline

STEP_COLUMNS = ("t_base", "t_sim", "t_ideal", "slowdown", "waste", "partial", "n_ops")
ALERT_COLUMNS = ("kind", "severity", "time", "summary", "evidence")
OP_KEY = ("job", "step", "rank", "optype", "seq_id")


@dataclass(frozen=True)
class Clean:
    """What a clean run stores, keyed as the tables are."""

    steps: dict[tuple[str, int], dict[str, Any]]
    attribution: dict[tuple[str, int, str, str], float]
    alerts: dict[tuple[str, str, str], dict[str, Any]]
    ops: set[tuple[Any, ...]]
    """(job, step, rank, optype, seq_id, start_ns, duration_ns) of every record."""


def clean_run(messages: Iterable[bytes], window: int = 20) -> Clean:
    """The rows of an uninterrupted in-process run of ``messages`` (op-batch bytes, in
    the order they were made) with the worker's defaults."""
    pipeline = Pipeline(
        assembly=AssemblyConfig(grace_s=1e9),
        analyser=WhatIfAnalyser(window=window),
        alerts=StragglerAlerts(),
        keep_ops=True,
    )
    out = Output()
    records: set[tuple[Any, ...]] = set()
    for value in messages:
        out.extend(pipeline.on_message(value, Source("ops"), 0))
        records |= _records(decode_ops(value))
    out.extend(pipeline.flush(0))
    return Clean(
        steps={(r["job"], r["step"]): r for r in out.rows.get("steps", [])},
        attribution={
            (r["job"], r["step"], r["dimension"], r["group"]): r["slowdown"]
            for r in out.rows.get("step_attribution", [])
        },
        alerts={(r["job"], r["alert_id"], r["state"]): r for r in out.rows.get("alerts", [])},
        ops=records,
    )


def _records(batch: Any) -> set[tuple[Any, ...]]:
    from rankwatch.schemas.optypes import OPTYPES

    return {
        (batch.job, int(s), batch.rank, OPTYPES[int(o)], int(q), int(t), int(d))
        for s, o, q, t, d in zip(
            batch.step, batch.optype, batch.seq_id, batch.start_ns, batch.duration_ns,
            strict=True,
        )
    }  # fmt: skip


def assert_stored_as_clean(dsn: str, clean: Clean, *, repeats_allowed: bool = False) -> None:
    """The store at ``dsn`` holds, read with ``FINAL``, exactly the clean run's steps,
    attributions, alerts and op records; without ``repeats_allowed`` no op record is
    stored twice, even unmerged."""
    with Store.connect(dsn) as store:
        steps = store.query(f"SELECT job, step, {', '.join(STEP_COLUMNS)} FROM steps FINAL")
        attribution = store.query(
            "SELECT job, step, dimension, `group`, slowdown FROM step_attribution FINAL"
        )
        alerts = store.query(
            f"SELECT job, alert_id, state, {', '.join(ALERT_COLUMNS)} FROM alerts FINAL"
        )
        ops = store.query(
            "SELECT job, step, rank, optype, seq_id, toUnixTimestamp64Nano(time) AS start_ns,"
            " duration_ns FROM ops FINAL"
        )
        raw_ops = store.query("SELECT count() AS n FROM ops")[0]["n"]
    _same_steps(steps, clean)
    got = {(r["job"], r["step"], r["dimension"], r["group"]): r["slowdown"] for r in attribution}
    assert got.keys() == clean.attribution.keys(), _diff(got, clean.attribution)
    for key, value in got.items():
        assert math.isclose(value, clean.attribution[key], rel_tol=1e-12), key
    _same_alerts(alerts, clean)
    stored = {(r["job"], r["step"], r["rank"], str(r["optype"]), r["seq_id"],
               r["start_ns"], r["duration_ns"]) for r in ops}  # fmt: skip
    assert stored == clean.ops, (
        f"ops: {len(clean.ops - stored)} records missing, {len(stored - clean.ops)} unknown"
    )
    if not repeats_allowed:
        assert raw_ops == len(clean.ops), f"{raw_ops - len(clean.ops)} op records stored twice"


def _same_steps(rows: list[dict[str, Any]], clean: Clean) -> None:
    got = {(r["job"], r["step"]): r for r in rows}
    assert got.keys() == clean.steps.keys(), _diff(got, clean.steps)
    for key, row in got.items():
        want = clean.steps[key]
        for name in STEP_COLUMNS:
            a, b = row[name], want[name]
            same = a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12))
            assert same, f"{key} {name}: stored {a}, clean run {b}"


def _same_alerts(rows: list[dict[str, Any]], clean: Clean) -> None:
    import orjson

    got = {(r["job"], r["alert_id"], r["state"]): r for r in rows}
    assert got.keys() == clean.alerts.keys(), _diff(got, clean.alerts)
    for key, row in got.items():
        want = clean.alerts[key]
        for name in ("kind", "severity", "summary"):
            assert row[name] == want[name], f"alert {key} {name}: {row[name]!r} != {want[name]!r}"
        assert orjson.loads(row["evidence"]) == orjson.loads(want["evidence"]), key


def _diff(got: dict[Any, Any], want: dict[Any, Any]) -> str:
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    return (
        f"missing {missing[:10]} ({len(missing)}), not in the clean run {extra[:10]} ({len(extra)})"
    )


def fill(disk: Path, leave_bytes: int = 256 * 1024) -> Path:
    """Fill ``disk`` to ``leave_bytes`` free with a ballast file (removed to free it)."""
    ballast = disk / "ballast"
    chunk = b"\0" * (1 << 20)
    with ballast.open("wb") as f:
        while True:
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            if free <= leave_bytes:
                break
            try:
                f.write(chunk[: min(len(chunk), free - leave_bytes)])
                f.flush()
            except OSError:
                break
    return ballast


def healthy(status_file: Path) -> tuple[bool, str]:
    """What ``rankwatch worker --health FILE`` says, as an exec probe would run it."""
    done = subprocess.run(
        [sys.executable, "-m", "rankwatch", "worker", "--health", str(status_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0, (done.stdout + done.stderr).strip()
