"""How many jobstate messages a job's new owner reads, for a given ``segment.ms``.

Kafka compacts only closed segments, so reading a compacted partition returns every
message sent since its active segment rolled. This sends one 20 KB state per job and
second for SECONDS seconds to a fresh topic on a real dev broker, then reads the
partition back as a worker restoring a moved job does (``ChangelogReader``):

    .venv/bin/python benchmarks/jobstate_compaction.py --segment-ms 3600000 --seconds 150
    .venv/bin/python benchmarks/jobstate_compaction.py --segment-ms 60000 --seconds 150

Figures: docs/sizing.md, "Costs and limits".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rankwatch.streams.kit.changelog import ChangelogReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.devbroker import DevBroker, create_topics

JOBS = 4
STATE_BYTES = 20_000


async def measure(bootstrap: str, segment_ms: int, seconds: int) -> str:
    from aiokafka import AIOKafkaProducer

    topic = f"bench.jobstate.{segment_ms}"
    config = {
        "cleanup.policy": "compact,delete",
        "segment.ms": str(segment_ms),
        "min.cleanable.dirty.ratio": "0.01",
    }
    await create_topics(bootstrap, [topic], 1, config)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    started = time.monotonic()
    try:
        for second in range(seconds):
            for job in range(JOBS):
                value = b"x" * STATE_BYTES + str(second).encode()
                await producer.send_and_wait(topic, key=f"job{job}".encode(), value=value)
            await asyncio.sleep(max(0.0, started + second + 1 - time.monotonic()))
    finally:
        await producer.stop()
    reader = ChangelogReader(bootstrap, topic, 1 << 20)
    try:
        latest = await reader.latest(0)
    finally:
        await reader.stop()
    return (
        f"segment.ms={segment_ms}: {seconds * JOBS} states sent over {seconds} s, "
        f"a restore read {reader.records_read} of them ({len(latest)} jobs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segment-ms", type=int, default=60_000)
    parser.add_argument("--seconds", type=int, default=150)
    args = parser.parse_args()
    with DevBroker(tempfile.mkdtemp()) as broker:
        print(asyncio.run(measure(broker.bootstrap, args.segment_ms, args.seconds)))


if __name__ == "__main__":
    main()
