"""Fault: records no producer of ours would send, from a client the project did not write
(the Kafka distribution's console producer): a tombstone (null value), an empty value
and a record without a key, on the ops, heartbeats, stacks and metrics topics, while
the three workers run on one store.

On main a tombstone on the ops topic crashed the ops agent (``TypeError`` in
``schemas/joined.py``); faust restarted it, and the record was neither dead-lettered nor
counted. Now each record is a dead letter with its reason, counted, in every worker;
no worker logs a traceback; the ops input around them is stored as a clean run stores
it."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import find_script
from support.faults import assert_stored_as_clean, clean_run
from support.workers import WorkerProcess, several_jobs, wait_committed

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ODD = ["job-0|NULL", "job-0|", "NULL|{}"]
"""What the console producer sends to each topic (key|value; NULL is a null)."""
REASONS = {"no-value": 2, "no-key": 1}


def console_produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    import subprocess

    done = subprocess.run(
        [str(find_script()), "tool", "org.apache.kafka.tools.ConsoleProducer",
         "--bootstrap-server", bootstrap, "--topic", topic,
         "--property", "parse.key=true", "--property", "key.separator=|",
         "--property", "null.marker=NULL"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_tombstones_empty_values_and_keyless_records_are_dead_letters_in_every_worker(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(["job-0", "job-1"], steps=10, origin_ns=time.time_ns())
    clean = clean_run(encode_ops(b.batch) for b in batches)
    prefix = f"f{uuid.uuid4().hex[:10]}"
    server = ChdbHttp(tmp_path / "store").start()
    dsn = server.dsn()
    common = ["--kafka", kafka_broker, "--clickhouse", dsn]
    hang_status, minder_status = (
        artifacts_dir / "hang.status.json",
        artifacts_dir / "minder.status.json",
    )
    workers = {
        "ops": WorkerProcess(
            kafka_broker, prefix, dsn, artifacts_dir, "ops", RANKWATCH_PARTITIONS="2"
        ),
        "hang": WorkerProcess(
            kafka_broker, prefix, dsn, artifacts_dir, "hang", RANKWATCH_PARTITIONS="2",
            argv=[sys.executable, "-m", "rankwatch", "hang", "worker", *common,
                  "--offset-reset", "earliest", "--status-file", str(hang_status)],
        ),
        "minder": WorkerProcess(
            kafka_broker, prefix, dsn, artifacts_dir, "minder", RANKWATCH_PARTITIONS="2",
            argv=[sys.executable, "-m", "rankwatch", "minder", "worker", *common,
                  "--status-file", str(minder_status)],
        ),
    }  # fmt: skip
    workers["hang"].status_file, workers["minder"].status_file = hang_status, minder_status
    try:
        for name, worker in workers.items():
            worker.wait_for(lambda s: s.get("store_connected") and s.get("assigned"), 120, name)
        for kind in ("ops", "heartbeats", "stacks", "metrics"):
            console_produce(kafka_broker, f"{prefix}.{kind}", ODD)
        publish(kafka_broker, batches, topic=f"{prefix}.ops")
        wait_committed(kafka_broker, f"{prefix}-workers", f"{prefix}.ops", 2, timeout_s=120)
        ops = workers["ops"].wait_for(lambda s: s.get("dead_letters") == 3, 60, "ops refusals")
        assert ops["dead_letter_reasons"] == REASONS, ops
        workers["hang"].wait_for(lambda s: s.get("dead_letters") == 6, 60, "hang refusals")
        workers["minder"].wait_for(lambda s: s.get("dead_letters") == 3, 60, "minder refusals")
        for worker in workers.values():
            worker.settled(60)
    finally:
        for worker in workers.values():
            worker.stop()
        logs = {name: w.tail(10**7) for name, w in workers.items()}
        server_dsn = dsn
    for name, log in logs.items():
        assert "Traceback" not in log, f"{name} worker:\n{log[-4000:]}"
    try:
        with Store.connect(server_dsn) as store:
            letters = store.query(
                "SELECT topic, reason, count() AS n FROM dead_letters FINAL GROUP BY topic, reason"
            )
        got = {(r["topic"].rsplit(".", 1)[1], r["reason"]): r["n"] for r in letters}
        want = {(kind, reason): n for kind in ("ops", "heartbeats", "stacks", "metrics")
                for reason, n in REASONS.items()}  # fmt: skip
        assert got == want
        assert_stored_as_clean(server_dsn, clean)
    finally:
        server.stop()
