"""Fixtures for integration tests against a real Kafka broker.

``kafka_broker`` starts one Apache Kafka 4.x broker (``scripts/kafka.sh`` via
``DevBroker``) per test session, on a free loopback port, only when a test asks for it.
``RANKWATCH_TEST_KAFKA=host:port`` uses an already running broker instead.

Each test gets fresh topics (``topic_factory``, ``unique_topic``) and its own consumer
group (``unique_group``), so tests never see each other's messages or offsets.

When any test of the session failed, the broker's logs are copied to
``var/test-logs/<run>/`` and the path is printed in the summary and in the failing test's
report.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from support.devbroker import DevBroker, create_topics

EXTERNAL_BROKER_ENV = "RANKWATCH_TEST_KAFKA"
_KEPT_LOGS = pytest.StashKey[Path]()

TopicFactory = Callable[..., str]


def _kept_log_dir(config: pytest.Config) -> Path:
    """Where this run's broker logs go if a test fails (decided up front so reports can
    name it)."""
    if _KEPT_LOGS not in config.stash:
        run = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        config.stash[_KEPT_LOGS] = config.rootpath / "var" / "test-logs" / run / "kafka"
    return config.stash[_KEPT_LOGS]


@pytest.fixture(scope="session")
def kafka_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The bootstrap address (``127.0.0.1:PORT``) of a real broker for this session."""
    external = os.environ.get(EXTERNAL_BROKER_ENV)
    if external:
        yield external
        return
    broker = DevBroker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        broker.start()
    except Exception:
        _keep_logs(broker, _kept_log_dir(request.config))
        raise
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
        if request.session.testsfailed:
            _keep_logs(broker, _kept_log_dir(request.config))


def _keep_logs(broker: DevBroker, target: Path) -> None:
    if broker.log_dir.is_dir():
        shutil.copytree(broker.log_dir, target, dirs_exist_ok=True)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:80].strip("-")


@pytest.fixture(scope="session", autouse=True)
def _spools_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The hooks of every process the tests start spool into a folder of this session,
    not the machine's default (``$TMPDIR/rankwatch-<uid>/spool``), where ranks a test
    kills would leave their spools for the host's real agent to send."""
    folder = tmp_path_factory.mktemp("spools")
    folder.chmod(0o700)
    before = os.environ.get("RANKWATCH_HOOKS_SPOOL")
    os.environ["RANKWATCH_HOOKS_SPOOL"] = str(folder)
    yield
    if before is None:
        os.environ.pop("RANKWATCH_HOOKS_SPOOL", None)
    else:
        os.environ["RANKWATCH_HOOKS_SPOOL"] = before


@pytest.fixture
def topic_factory(kafka_broker: str, request: pytest.FixtureRequest) -> TopicFactory:
    """``make(partitions=1, suffix="")`` creates a fresh topic for this test, returns its name."""
    base = _safe_name(request.node.name)

    def make(partitions: int = 1, suffix: str = "") -> str:
        name = f"t.{base}.{suffix}{'.' if suffix else ''}{uuid.uuid4().hex[:8]}"
        asyncio.run(create_topics(kafka_broker, [name], partitions))
        return name

    return make


@pytest.fixture
def unique_topic(topic_factory: TopicFactory) -> str:
    """A fresh one-partition topic."""
    return topic_factory()


@pytest.fixture
def unique_group(request: pytest.FixtureRequest) -> str:
    """A consumer group id no other test uses."""
    return f"g.{_safe_name(request.node.name)}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def artifacts_dir(tmp_path: Path) -> Path:
    """Files a test writes for diagnosis (worker logs...); kept under var/test-logs/ if
    the test fails."""
    path = tmp_path / "artifacts"
    path.mkdir()
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not report.failed:
        return report
    fixtures = getattr(item, "fixturenames", ())
    if "kafka_broker" in fixtures and not os.environ.get(EXTERNAL_BROKER_ENV):
        where = _kept_log_dir(item.config)
        report.sections.append(("kafka broker", f"broker logs kept at {where}\n"))
    artifacts = getattr(item, "funcargs", {}).get("artifacts_dir")
    if isinstance(artifacts, Path) and artifacts.is_dir():
        target = _kept_log_dir(item.config).parent / _safe_name(item.nodeid)
        shutil.copytree(artifacts, target, dirs_exist_ok=True)
        report.sections.append(("test artifacts", f"kept at {target}\n"))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    kept = terminalreporter.config.stash.get(_KEPT_LOGS, None)
    if kept is not None and kept.parent.is_dir():
        terminalreporter.write_line(f"integration test logs kept under {kept.parent}")
