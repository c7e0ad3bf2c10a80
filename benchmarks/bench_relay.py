"""What the host relay costs: the relay process's CPU per frame, and a rank's cost to
hand a frame over, against sending it to Kafka itself.

Run from the repo root (starts its own dev broker; about a minute):

    .venv/bin/python benchmarks/bench_relay.py [--frames 4000] [--records 39,182] [--burst-ms 10]

For frames of each size (39 records: an SE rank's step; 182: the generated job's), a
sender process hands ``--frames`` frames to a real relay process (``rankwatch relay``,
pinned to the last core) as 8 ranks would, one burst of 8 every ``--burst-ms`` (800
frames a second by default: a host of 8 ranks whose steps take 10 ms; real steps take
seconds), and the relay sends its bundles to the broker (joined, ``x-joined``, unless
``--no-join``). Reported: the relay's CPU per
frame received and sent, the bundles and frames per bundle it made, and the sender's
CPU per frame handed over (``RelayTransport.send``); then the same frames sent by the
hooks' own Kafka transport (``KafkaTransport.send``, one message each, as a rank without a relay
sends), CPU per frame. Median and range of ``--repeat`` runs. Figures:
benchmarks/README.md, "What the relay costs".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rankwatch.hooks.transports import KafkaTransport, RelayTransport
from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.examples import example_batch
from rankwatch.schemas.spool import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.devbroker import DevBroker, create_topics
from timing import process_cpu_s  # benchmarks/timing.py (scripts run from this folder)

RANKS = 8


def frames(records: int, count: int) -> list[bytes]:
    return [
        encode_ops(example_batch(records, rank=i % RANKS, batch_seq=i // RANKS, job="bench"))
        for i in range(count)
    ]


def through_relay(
    bootstrap: str, prefix: str, data: list[bytes], work: Path, burst_s: float, join: bool
) -> dict[str, Any]:
    sock, status = work / "relay.sock", work / "relay.json"
    relay = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "relay", "--socket", str(sock), "--kafka", bootstrap,
         "--status-file", str(status), *([] if join else ["--no-join"])],
        env={**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix},
    )  # fmt: skip
    try:
        if shutil.which("taskset"):
            core = str((os.cpu_count() or 1) - 1)
            subprocess.run(["taskset", "-a", "-p", "-c", core, str(relay.pid)],
                           check=False, capture_output=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not sock.exists() or not status.exists():
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.05)
        hooks = RelayTransport(str(sock), _Refuse())
        hooks.send([Message("ops", data[0], 0)])  # the relay's producer connects first
        while json.loads(status.read_text())["frames_sent"] < 1:
            assert time.monotonic() < deadline, "the relay sent nothing"
            time.sleep(0.05)
        hooks.fallbacks = hooks.relayed = 0
        cpu0, relay0 = time.process_time(), process_cpu_s(relay.pid)
        for at in range(0, len(data), RANKS):
            hooks.send([Message("ops", f, 0) for f in data[at : at + RANKS]])
            time.sleep(burst_s)  # bursts: a host's ranks end their steps together
        sender_cpu = time.process_time() - cpu0
        while json.loads(status.read_text())["frames_sent"] < 1 + hooks.relayed:
            assert time.monotonic() < deadline + 300, "the relay did not send everything"
            time.sleep(0.1)
        relay_cpu = process_cpu_s(relay.pid) - relay0
        counters = json.loads(status.read_text())
    finally:
        relay.terminate()
        relay.wait(30)
    return {
        "relay_cpu_us_per_frame": 1e6 * relay_cpu / max(counters["frames_sent"] - 1, 1),
        "sender_cpu_us_per_frame": 1e6 * sender_cpu / len(data),
        "bundles": counters["bundles_sent"],
        "joined": counters["joined_sent"],
        "frames_per_message": counters["frames_sent"] / max(counters["messages_sent"], 1),
        "fallbacks": hooks.fallbacks,
    }


class _Refuse:
    """The sender's direct path in the relay case: counted, never used for timing."""

    def send(self, messages: list[Message]) -> list[bool]:
        return [False] * len(messages)

    def close(self) -> None:
        pass


def direct(bootstrap: str, prefix: str, data: list[bytes]) -> dict[str, Any]:
    kafka = KafkaTransport(bootstrap, key=b"bench", topics={"ops": f"{prefix}.ops"})
    kafka.send([Message("ops", data[0], 0)])  # connected before the clock starts
    cpu0 = time.process_time()
    for at in range(0, len(data), RANKS):
        for f in data[at : at + RANKS]:  # each rank sends its own frame
            assert kafka.send([Message("ops", f, 0)]) == [True]
    cpu = time.process_time() - cpu0
    kafka.close()
    return {"sender_cpu_us_per_frame": 1e6 * cpu / len(data)}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        out[key] = {
            "median": round(statistics.median(values), 2),
            "min": round(min(values), 2),
            "max": round(max(values), 2),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=4_000)
    parser.add_argument(
        "--burst-ms", type=float, default=10.0, help="pause between two bursts of 8 frames"
    )
    parser.add_argument("--records", default="39,182")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-join", action="store_true", help="the relay sends bundles of whole frames"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rw-bench-relay-"))
    broker = DevBroker(work / "kafka")
    results: dict[str, Any] = {}
    try:
        bootstrap = broker.start()
        for records in (int(n) for n in args.records.split(",")):
            data = frames(records, args.frames)
            relayed, alone = [], []
            for i in range(args.repeat):
                prefix = f"r{records}x{i}"
                asyncio.run(create_topics(bootstrap, [f"{prefix}.ops"], 1))
                burst_s, join = args.burst_ms / 1e3, not args.no_join
                relayed.append(through_relay(bootstrap, prefix, data, work, burst_s, join))
                alone.append(direct(bootstrap, prefix, data[: args.frames // 4]))
            results[f"{records} records"] = {
                "frame_bytes": len(data[0]),
                "relay": _summary(relayed),
                "direct": _summary(alone),
            }
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["load_average_1m"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
