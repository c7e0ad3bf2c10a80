"""A real single-node Kafka broker for development and integration tests.

``DevBroker`` drives ``scripts/kafka.sh`` (the one place that knows how to fetch, format,
start and stop Apache Kafka 4.x in KRaft mode on loopback), so a test session, a developer
shell and CI start the broker the same way. It is not a mock: clients talk to it over TCP.

``create_topics`` makes topics with a given partition count through aiokafka's admin
client; tests create their topics explicitly rather than relying on auto-creation, which
would give them ``num.partitions=1`` (and faust refuses a table whose source topic and
changelog disagree on partitions).

A test helper, not part of the wheel (``tests/support``, importable as ``support`` under
pytest, whose ``pythonpath`` names ``tests``; the stream benchmark adds it itself). The
script it drives is found through ``RANKWATCH_KAFKA_SCRIPT``, in this repository, or
under the current directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

SCRIPT_ENV = "RANKWATCH_KAFKA_SCRIPT"


class DevBrokerError(RuntimeError):
    """The development broker could not be fetched, started, stopped or used."""


def find_script() -> Path:
    """Locate ``scripts/kafka.sh``; raise ``DevBrokerError`` naming where it looked."""
    candidates: list[Path] = []
    if env := os.environ.get(SCRIPT_ENV):
        candidates.append(Path(env))
    # this file is <repo>/tests/support/devbroker.py
    candidates.append(Path(__file__).resolve().parents[2] / "scripts" / "kafka.sh")
    candidates.append(Path.cwd() / "scripts" / "kafka.sh")
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise DevBrokerError(f"scripts/kafka.sh not found (looked at {looked}; set {SCRIPT_ENV})")


class DevBroker:
    """One broker process whose data and logs live in ``directory``.

    Use as a context manager (``with DevBroker(tmp) as broker: broker.bootstrap``) or call
    ``start``/``stop``. ``port=None`` takes a free port. The broker is told to stop when
    this Python process exits, so an interrupted test run does not leave it behind.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        port: int | None = None,
        script: Path | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.port = port
        self.script = script or find_script()
        self.start_timeout_s = start_timeout_s
        self._bootstrap: str | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for clients (``kafka://`` + this for faust)."""
        if self._bootstrap is None:
            raise DevBrokerError("the broker is not started")
        return self._bootstrap

    @property
    def log_dir(self) -> Path:
        """Where ``server.log`` (and the JVM's stdout, ``kafka.out``) are written."""
        return self.directory / "logs"

    @property
    def server_log(self) -> Path:
        return self.log_dir / "server.log"

    def start(self) -> str:
        """Start the broker (fetching and formatting as needed); return its bootstrap."""
        args = ["start", "--dir", str(self.directory), "--watch-pid", str(os.getpid())]
        if self.port is not None:
            args += ["--port", str(self.port)]
        out = self._run(args, timeout_s=self.start_timeout_s)
        self._bootstrap = out.strip().splitlines()[-1]
        return self._bootstrap

    def stop(self) -> None:
        """Stop the broker; its data and logs stay in ``directory``."""
        self._run(["stop", "--dir", str(self.directory)], timeout_s=60.0)
        self._bootstrap = None

    def is_running(self) -> bool:
        result = subprocess.run(
            [str(self.script), "status", "--dir", str(self.directory)],
            capture_output=True,
            text=True,
            check=False,
        )
        return result.returncode == 0

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create one topic (no-op if it exists). Not for use inside a running event loop."""
        asyncio.run(create_topics(self.bootstrap, [name], partitions, config))

    def __enter__(self) -> DevBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, args: list[str], timeout_s: float) -> str:
        try:
            result = subprocess.run(
                [str(self.script), *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DevBrokerError(
                f"kafka.sh {args[0]} took over {timeout_s:.0f}s; logs in {self.log_dir}"
            ) from exc
        if result.returncode != 0:
            raise DevBrokerError(
                f"kafka.sh {args[0]} failed (exit {result.returncode}); logs in "
                f"{self.log_dir}\n{result.stderr.strip()}"
            )
        return result.stdout


async def create_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
) -> None:
    """Create topics with ``partitions`` partitions and one replica; existing ones are kept.

    Waits until every partition has a leader, so a producer or consumer started right
    after does not race the broker's metadata (the workers' own start-up path,
    :func:`rankwatch.streams.kit.topics.ensure_topics`).
    """
    from rankwatch.streams.kit.topics import TopicError, TopicPlan, ensure_topics

    plan = TopicPlan(partitions, 1, retention_ms=None, config=dict(config or {}))
    try:
        await ensure_topics(bootstrap, names, plan)
    except TopicError as exc:
        raise DevBrokerError(str(exc)) from exc
