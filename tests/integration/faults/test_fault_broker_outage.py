"""Fault: the broker is down for 20 s while three jobs publish through the real hooks
(each rank a real publisher thread with its Kafka transport and its default-on spool);
one job ends during the outage, and its spools are sent by the host's relay.

On main, with the grace (here 15 s) shorter than the outage: the hooks dropped what the
broker did not take unless a spool was named (``rankwatch workload`` ignored
``RANKWATCH_HOOKS_SPOOL``); with a spool, the drained records arrived after the worker
had closed their steps as partial, and were dropped as late (10,754 records, 288 partial
steps); a job ending during the outage left its spool on disk for ever; and the
worker's health stayed green, its lag a stale 0. Now the worker is unhealthy while it
cannot reach the broker, the time it could not read restarts its open steps' grace,
each rank's spool drains in order, the relay sends the ended job's spools, and the
store holds every record the hooks made, once, with every step as a clean run of the
same messages analyses it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.devbroker import DevBroker
from support.faults import assert_stored_as_clean, clean_run, healthy
from support.hookedjob import HookedJob
from support.lifetime import tied
from support.workers import WorkerProcess, several_jobs, until, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOBS = ["job-0", "job-1", "ends-early"]
STEPS = 120
"""0.22-s steps: about 27 s of publishing."""
OUTAGE_FROM_S, OUTAGE_S = 5.0, 20.0
ENDS_AT_S = 12.0
"""When the ranks of ``ends-early`` close: the broker is away, their spools stay."""


def test_a_broker_outage_loses_no_record_and_closes_no_step_early(
    own_broker: DevBroker, tmp_path: Path, artifacts_dir: Path
) -> None:
    bootstrap = own_broker.bootstrap
    prefix = f"f{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    spools = tmp_path / "spool"
    spools.mkdir(mode=0o700)
    env = {"RANKWATCH_PARTITIONS": "2", "RANKWATCH_GRACE_S": "15"}
    worker = WorkerProcess(bootstrap, prefix, dsn, artifacts_dir, **env)
    relay_log = (artifacts_dir / "relay.log").open("ab")
    relay = subprocess.Popen(
        tied([sys.executable, "-m", "rankwatch", "relay", "--socket", str(tmp_path / "relay.sock"),
              "--kafka", bootstrap, "--spool-dir", str(spools)]),
        env={**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix},
        stdout=relay_log, stderr=relay_log,
    )  # fmt: skip
    batches = several_jobs(JOBS, steps=STEPS, origin_ns=time.time_ns())
    job = HookedJob(bootstrap, prefix, batches, spools, stop_jobs_at={"ends-early": ENDS_AT_S})
    try:
        worker.wait_for(lambda s: s.get("store_connected") and s.get("assigned"), 120, "start")
        job.start()
        time.sleep(OUTAGE_FROM_S)
        own_broker.stop()
        down = worker.wait_for(lambda s: s.get("broker_unreachable_s", 0) > 0, 30, "the outage")
        ok, said = healthy(worker.status_file)
        assert not ok and "broker unreachable" in said, said
        time.sleep(max(0.0, OUTAGE_S - 2))
        own_broker.start()  # same port, same data
        job.join(timeout_s=180)
        until(lambda: not list(spools.glob("*.spool")), 90, "every spool sent")
        wait_committed(bootstrap, group, topic, 2, timeout_s=120)
        status = worker.settled(60)
        assert healthy(worker.status_file)[0]
    finally:
        worker.stop()
        relay.terminate()
        relay.wait(30)
        relay_log.close()
    made = sum(s.put for s in job.stats.values())
    dropped = sum(s.dropped_send + s.dropped_buffer for s in job.stats.values())
    assert dropped == 0 and sum(s.spooled for s in job.stats.values()) > 0, job.stats
    ended = [s for (name, _), s in job.stats.items() if name == "ends-early"]
    assert sum(s.in_spool for s in ended) > 0  # left behind, sent by the relay
    assert status["late_records"] == 0 and status["steps_partial"] == 0, status
    assert down["broker_unreachable_s"] > 0
    clean = clean_run(job.produced)
    assert len(clean.ops) == made == job.records()
    assert_stored_as_clean(dsn, clean)
