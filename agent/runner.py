"""The agent's loop: sample once per interval, tag with job and host, hand to the outbox.

The schedule is anchored on the first tick (``start + i * interval``), so sampling
does not drift; a late tick is taken at once and missed ticks are skipped, not
replayed. The clock and the sleep are passed in so tests run without waiting.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class Sampler(Protocol):
    def sample(self, now_ns: int) -> dict[str, float]: ...


class Sink(Protocol):
    def put(self, key: bytes, value: bytes) -> None: ...


@dataclass(frozen=True)
class AgentConfig:
    job: str
    host: str = ""
    """Empty: this machine's host name."""
    interval_s: float = 1.0

    def host_name(self) -> str:
        return self.host or socket.gethostname()


def metrics_message(job: str, host: str, ts_ns: int, metrics: dict[str, float]) -> dict[str, Any]:
    """A ``metrics`` v1 message; non-finite values and bad names are left out."""
    clean = {k: float(v) for k, v in metrics.items() if NAME.match(k) and math.isfinite(float(v))}
    return {
        "schema": "metrics",
        "version": 1,
        "job": job,
        "host": host,
        "ts_ns": ts_ns,
        "metrics": dict(sorted(clean.items())[:1024]),
    }


class Agent:
    def __init__(self, config: AgentConfig, samplers: list[Sampler], sink: Sink) -> None:
        self.config, self.samplers, self.sink = config, samplers, sink
        self.host = config.host_name()
        self.samples = 0
        self.sampler_errors = 0

    def tick(self, now_ns: int) -> dict[str, Any]:
        metrics: dict[str, float] = {}
        for s in self.samplers:
            try:
                metrics.update(s.sample(now_ns))
            except Exception:  # a sampler bug must not stop the others
                self.sampler_errors += 1
        message = metrics_message(self.config.job, self.host, now_ns, metrics)
        self.sink.put(self.config.job.encode(), orjson.dumps(message))
        self.samples += 1
        return message


def run_agents(
    agents: list[Agent],
    interval_s: float,
    stop: threading.Event,
    count: int | None = None,
    clock: Callable[[], int] = time.time_ns,
    sleep: Callable[[float], Any] | None = None,
) -> int:
    """Tick every agent once per interval until ``stop`` is set or ``count`` ticks."""
    wait = sleep or stop.wait
    step = int(interval_s * 1e9)
    start = clock()
    ticks = i = 0
    while not stop.is_set() and (count is None or ticks < count):
        now = clock()
        due = start + i * step
        if now < due:
            wait((due - now) / 1e9)
            continue
        for agent in agents:
            agent.tick(now)
        ticks += 1
        i = (now - start) // step + 1
    return ticks
