"""A partition whose records faust took off the consumer and never handed to the agent
is read again (docs/running.md, "A partition read past"), on a real broker with a real
faust worker: ``faust_stall_app.py`` moves the client's position past partition 0's
records under faust at the assignment, as faust's dropped fetch does, and the agent
must still get every record of both partitions, once the guard has read the partition
again (and only that one)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from support.faustproc import faust_worker

from rankwatch.streams.kit.health import read_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = Path(__file__).with_name("faust_stall_app.py")
PER_PARTITION = 30


LATER = 10


async def _send(bootstrap: str, topic: str, partitions: tuple[int, ...], n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in partitions:
            for i in range(n):
                await producer.send(topic, b"%d" % i, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.parametrize("then", ["nothing", "more"])
def test_records_faust_read_past_are_read_again(
    then: str, kafka_broker: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """``nothing``: no record comes after the skipped ones, the gap is found (position
    past what the agent got, for 2 s). ``more``: records come after them, the agent gets
    those first, and the hole is found at once (the gap check is off: WAIT_S 1e9)."""
    topic = topic_factory(partitions=2, suffix="in")
    asyncio.run(_send(kafka_broker, topic, (0, 1), PER_PARTITION))
    status_file = tmp_path / "status.json"
    env = {
        "BOOTSTRAP": kafka_broker,
        "APP_ID": f"rankwatch-stall-{uuid.uuid4().hex[:8]}",
        "SOURCE": topic,
        "PARTITIONS": "2",
        "SKIP_TO": str(PER_PARTITION),  # all of partition 0
        "STATUS": str(status_file),
        "DATADIR": str(tmp_path / "faust-data"),
        "WAIT_S": "2" if then == "nothing" else "1e9",
    }
    want = {"0": PER_PARTITION + (LATER if then == "more" else 0), "1": PER_PARTITION}
    log = tmp_path / "worker.log"
    status: dict[str, Any] = {}
    sent_later = False
    with faust_worker(APP, env, log):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if status_file.exists():
                status = read_status(status_file)
                if status.get("distinct") == want:
                    break
                if then == "more" and not sent_later and status.get("got", {}).get("1"):
                    asyncio.run(_send(kafka_broker, topic, (0,), LATER))
                    sent_later = True
            time.sleep(0.3)
    text = log.read_text(errors="replace")
    assert "under faust" in text, text[-3000:]  # the records were skipped
    assert "internals changed" not in text  # the guard sees faust's queue and committed offsets
    assert status.get("distinct") == want, text[-3000:]
    assert status["partitions_read_again"] == 1 and status["partitions_stuck"] == 0
    assert f"{topic}:0: the consumer is at offset" in text
    assert "reading the partition again from 0" in text
    assert status["got"]["1"] == PER_PARTITION  # the other partition was not read twice
