"""Configuration: one frozen dataclass per component, filled from file and environment.

Only the shell (CLI commands) reads files and the environment; the core receives
the plain values. Precedence: defaults < config file (TOML) < environment <
command-line flags (applied by the command with :func:`dataclasses.replace`).

Environment variables:

- ``RANKWATCH_KAFKA``: bootstrap servers, ``host:port[,host:port]``
- ``RANKWATCH_CLICKHOUSE``: DSN, ``chdb://<dir>`` (embedded) or ``http(s)://...``
- ``RANKWATCH_DATABASE``: ClickHouse database name (default: the DSN's, else rankwatch)
- ``RANKWATCH_GRACE_S``: seconds before an incomplete step is analysed as partial
- ``RANKWATCH_STEP_WINDOW``: steps a batch may be from its job's newest (else a dead letter)
- ``RANKWATCH_PARTITIONS`` / ``RANKWATCH_REPLICATION``: for the topics a worker creates
- ``RANKWATCH_GROUP``: the workers' Kafka consumer group
- ``RANKWATCH_TOPIC_PREFIX``: topics are ``<prefix>.ops`` etc. (default ``rankwatch``)
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rankwatch.errors import UserError
from rankwatch.streams.assembly import AssemblyConfig

DEFAULT_DSN = "chdb://var/chdb"


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    group: str = "rankwatch-worker"
    topic_prefix: str = "rankwatch"
    """Topics are ``<prefix>.ops``, ``<prefix>.steps``, ... (see rankwatch.schemas.topics)."""
    partitions: int = 8
    """Partitions a worker creates its topics with when they do not exist (it warns
    when an existing topic has another count: keys then map to other partitions)."""
    replication: int = 1
    """Replication factor of the topics a worker creates (3 on a production cluster)."""
    retention_hours: float = 168.0
    """``retention.ms`` of the topics a worker creates: how long a stopped worker may
    stay away and still read everything on restart."""
    connect_wait_s: float = 120.0
    """How long a starting worker waits for the broker before it gives up."""


@dataclass(frozen=True)
class ClickHouseConfig:
    dsn: str = DEFAULT_DSN
    database: str = ""
    """Empty: the database in an HTTP DSN's path, else ``rankwatch``."""


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    clickhouse: ClickHouseConfig = field(default_factory=ClickHouseConfig)
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)


_ENV = {
    "RANKWATCH_KAFKA": ("kafka", "bootstrap"),
    "RANKWATCH_GROUP": ("kafka", "group"),
    "RANKWATCH_TOPIC_PREFIX": ("kafka", "topic_prefix"),
    "RANKWATCH_CLICKHOUSE": ("clickhouse", "dsn"),
    "RANKWATCH_DATABASE": ("clickhouse", "database"),
    "RANKWATCH_GRACE_S": ("assembly", "grace_s"),
    "RANKWATCH_LATE": ("assembly", "late"),
    "RANKWATCH_STEP_WINDOW": ("assembly", "step_window"),
    "RANKWATCH_PARTITIONS": ("kafka", "partitions"),
    "RANKWATCH_REPLICATION": ("kafka", "replication"),
}


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the TOML file's sections, then the environment."""
    env = os.environ if env is None else env
    config = Config()
    if path is not None:
        config = _apply(config, _read_toml(Path(path)), origin=str(path))
    overrides: dict[str, dict[str, Any]] = {}
    for var, (section, key) in _ENV.items():
        if var in env:
            overrides.setdefault(section, {})[key] = env[var]
    return _apply(config, overrides, origin="environment")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read config {path}: {exc}") from exc


def _apply(config: Config, raw: Mapping[str, Any], origin: str) -> Config:
    sections = {f.name: getattr(config, f.name) for f in fields(config)}
    for name, values in raw.items():
        if name not in sections or not isinstance(values, Mapping):
            raise UserError(f"{origin}: unknown config section [{name}]")
        sections[name] = _apply_section(sections[name], values, f"{origin} [{name}]")
    return replace(config, **sections)


def _apply_section(section: Any, values: Mapping[str, Any], origin: str) -> Any:
    types = {f.name: type(getattr(section, f.name)) for f in fields(section)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in types:
            raise UserError(f"{origin}: unknown key {key!r}")
        try:
            changes[key] = types[key](value)
        except (TypeError, ValueError) as exc:
            raise UserError(f"{origin}: {key} must be {types[key].__name__}: {value!r}") from exc
    try:
        return replace(section, **changes)
    except ValueError as exc:  # the section's own checks (e.g. a value out of range)
        raise UserError(f"{origin}: {exc}") from exc
