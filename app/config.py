"""Configuration: one tree of frozen dataclasses, one section per component.

Every setting of every service lives here, and this module is the one place that reads
the config file and the environment; components receive their section as plain values.
Precedence: defaults < config file (TOML) < environment < command-line flags (a
command passes its flags to :func:`with_flags`). ``rankwatch config show`` prints the
merged tree and where each value came from.

Environment variables (``ENVIRONMENT`` below is the authoritative list):

- ``RANKWATCH_KAFKA``: bootstrap servers, ``host:port[,host:port]``
- ``RANKWATCH_CLICKHOUSE``: DSN, ``chdb://<dir>`` (embedded) or ``http(s)://...``
- ``RANKWATCH_DATABASE``: ClickHouse database name (default: the DSN's, else rankwatch)
- ``RANKWATCH_HOUSEKEEPING_NICE``: nice value of embedded chDB's merges (default 19)
- ``RANKWATCH_STORE_TIMEOUT_S``: a ClickHouse server's longest silence on one request
- ``RANKWATCH_GRACE_S``: seconds of its job's messages before an incomplete step is
  analysed as partial; ``RANKWATCH_QUIET_GRACE_S``: seconds a silent job's steps wait
- ``RANKWATCH_STEP_WINDOW``: steps a batch may be from its job's newest (else a dead letter)
- ``RANKWATCH_PARTITIONS`` / ``RANKWATCH_REPLICATION``: for the topics a worker creates
- ``RANKWATCH_GROUP``: the workers' Kafka consumer group
- ``RANKWATCH_TOPIC_PREFIX``: topics are ``<prefix>.ops`` etc. (default ``rankwatch``)
- ``RANKWATCH_SESSION_TIMEOUT_S``: Kafka group session of every worker
- the ops worker's ``[worker]`` section: ``RANKWATCH_WINDOW``, ``RANKWATCH_KEEP_OPS``,
  ``RANKWATCH_MAX_MESSAGE_BYTES``, ``RANKWATCH_FETCH_BYTES``,
  ``RANKWATCH_FETCH_WAIT_MS``, ``RANKWATCH_TICK_S``, ``RANKWATCH_STORE_GAP_S``,
  ``RANKWATCH_COMMIT_INTERVAL_S``, ``RANKWATCH_STATUS_FILE``,
  ``RANKWATCH_ALERT_SLOWDOWN``, ``RANKWATCH_ALERT_CLEAR``, ``RANKWATCH_ALERT_WINDOW``
- ``RANKWATCH_HOOKS_SPOOL``: where the host's ranks spool (``[host] spool_dir``: the agent
  and the relay send the spools ranks left)
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rankwatch.errors import UserError
from rankwatch.schemas.codec import DEFAULT_MAX_BYTES
from rankwatch.streams.hang.detector import HangConfig
from rankwatch.streams.kit.housekeeping import DEFAULT_NICE
from rankwatch.streams.kit.settings import DEFAULT_TIMEOUT_S, STOP_WAIT_S
from rankwatch.streams.minder.online import OnlineConfig
from rankwatch.streams.ops.alerts import AlertConfig
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.slowdown.detector import DetectorConfig

DEFAULT_DSN = "chdb://var/chdb"


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    group: str = "rankwatch-worker"
    """The ops workers' consumer group; the hang and Minder workers add ``-hang`` and
    ``-minder``."""
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
    session_timeout_s: float = 30.0
    """Kafka group session of every worker: how long a dead worker's partitions wait
    before they move to another."""
    stop_wait_s: float = STOP_WAIT_S
    """How long a stopping worker (SIGTERM, SIGINT) may take: its last store, its
    consumer's goodbye to the group. Past it the process ends anyway, saying so (faust
    waits for ever on a consumer whose broker is gone)."""


@dataclass(frozen=True)
class ClickHouseConfig:
    dsn: str = DEFAULT_DSN
    database: str = ""
    """Empty: the database in an HTTP DSN's path, else ``rankwatch``."""
    housekeeping_nice: int = DEFAULT_NICE
    """Nice value of embedded chDB's merges and other background threads (0-19; 0:
    as the worker), so that they take the CPU a worker leaves (docs/sizing.md). A
    ClickHouse server has its own setting for this, ``os_threads_nice_value_merge_mutate``."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """A server's longest silence on one request before the worker calls it a failure,
    keeps the rows and retries (embedded chDB: unused)."""

    def __post_init__(self) -> None:
        if not 0 <= self.housekeeping_nice <= 19:
            raise ValueError("housekeeping_nice must be 0 to 19")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be above 0")


@dataclass(frozen=True)
class WorkerConfig:
    """The ops worker (``rankwatch worker``) beyond Kafka, store and assembly."""

    window: int = DEFAULT_WINDOW
    """Steps in the rolling ideal window each step is compared with."""
    keep_ops: bool = True
    """Store raw op records (``ops``): needed to restore windows after a restart."""
    max_message_bytes: int = DEFAULT_MAX_BYTES
    """Larger op-batch messages are dead letters."""
    fetch_bytes: int = 4 * 1024 * 1024
    """Bytes per partition and fetch."""
    fetch_wait_ms: int = 50
    """Longest a fetch waits at the broker for new data."""
    tick_s: float = 1.0
    """Seconds between stores of the buffer (and grace checks)."""
    store_gap_s: float = 0.1
    """A step that closes is stored and announced at once, not at the next tick, but
    never sooner than this after the previous store: many jobs closing steps make at
    most 1/store_gap_s stores a second (an insert per table and jobstate messages each),
    not one per step."""
    commit_interval_s: float = 1.0
    """How often stored offsets are committed."""
    retire_after_s: float = 3600.0
    """A job silent this long, with nothing of it open or unstored, is forgotten (restored
    as a job first met if it speaks again)."""
    status_file: str = ""
    """Health file written every tick (empty: none); ``rankwatch worker --health``."""
    alert_slowdown: float = AlertConfig.fire_at
    """Rolling job-level S at which a straggler alert fires..."""
    alert_clear: float = AlertConfig.clear_below
    """...and under which it resolves."""
    alert_window: int = AlertConfig.window
    """Analysed steps a straggler alert reads (docs/detection.md): it fires no sooner
    than this many steps into a job or an episode. 20 steps is 20 s of a 1 s step and
    20 min of a 60 s one: a job of long steps may want fewer (a shorter window is more
    easily fooled by noise)."""

    def alerts(self) -> AlertConfig:
        """The straggler alerts' rule as these settings make it."""
        return AlertConfig(
            fire_at=self.alert_slowdown, clear_below=self.alert_clear, window=self.alert_window
        )

    def __post_init__(self) -> None:
        if self.store_gap_s < 0:
            raise ValueError("store_gap_s must be 0 or more")
        if not self.retire_after_s > 0:
            raise ValueError("retire_after_s must be above 0")


@dataclass(frozen=True)
class HangWorkerConfig:
    """The hang worker (``rankwatch hang worker``); docs/detection.md, section 1."""

    k: float = HangConfig.k
    """A rank stalls after k x its median step time..."""
    floor_s: float = HangConfig.floor_s
    """...and never before this many seconds."""
    warmup_s: float = HangConfig.warmup_s
    """The bound of a job's first steps (compilation, warm-up, the first data)."""
    max_phase_s: float = HangConfig.max_phase_s
    """The most an announced phase (a checkpoint) may claim as its own bound."""
    silent_after_s: float = HangConfig.silent_after_s
    """Heartbeats missing this long: the rank is silent."""
    tick_s: float = 1.0
    offset_reset: str = "latest"
    """Where a new consumer group starts: ``latest`` (heartbeats are about now) or
    ``earliest``."""
    retire_after_s: float = 3600.0
    """A job none of whose ranks beat this long is forgotten (recalled from the store,
    its open episode included, if it beats again)."""
    status_file: str = ""
    """Health file written every tick (empty: none); ``rankwatch worker --health``."""

    def __post_init__(self) -> None:
        if self.offset_reset not in ("latest", "earliest"):
            raise ValueError("offset_reset must be one of latest, earliest")
        if not self.retire_after_s > 0:
            raise ValueError("retire_after_s must be above 0")


SCORINGS = ("pairwise", "residual", "blend")


@dataclass(frozen=True)
class MinderWorkerConfig:
    """The Minder worker (``rankwatch minder worker``); docs/minder.md."""

    window_s: int = OnlineConfig.window_s
    """Seconds of metrics per detection window (also the stride)."""
    continuity: int = OnlineConfig.continuity
    """Consecutive windows a machine must stand out in before it is called faulty."""
    threshold: float = OnlineConfig.threshold
    scoring: str = OnlineConfig.scoring
    """"pairwise" (the paper's; the default), "residual" (each host against its own
    usual place among its peers, learnt from the stream) or "blend" (``minder eval``'s
    default detector, its yardsticks learnt from the stream); docs/minder.md says why
    neither is the default yet."""
    model: str = ""
    """MODEL.npz from ``rankwatch minder train`` (empty: no denoising, default order)."""
    retire_after_s: float = 3600.0
    """A job whose metrics stopped this long ago is forgotten (recalled from its latest
    snapshot if they come again)."""
    status_file: str = ""
    """Health file written every tick (empty: none); ``rankwatch worker --health``."""

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}")
        if not self.retire_after_s > 0:
            raise ValueError("retire_after_s must be above 0")


@dataclass(frozen=True)
class HostConfig:
    """What the per-host processes (``rankwatch agent``, ``rankwatch relay``) share."""

    spool_dir: str = ""
    """Where this host's ranks spool what the broker did not take (as their hooks' own
    ``RANKWATCH_HOOKS_SPOOL``; empty: the hooks' default, ``$TMPDIR/rankwatch-<uid>/spool``;
    ``off``: none). The agent and the relay send the spools of ranks that are gone."""


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    clickhouse: ClickHouseConfig = field(default_factory=ClickHouseConfig)
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    slowdown: DetectorConfig = field(default_factory=DetectorConfig)
    """The ops worker's hidden-slowdown detector (docs/detection.md, section 3)."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    hang: HangWorkerConfig = field(default_factory=HangWorkerConfig)
    minder: MinderWorkerConfig = field(default_factory=MinderWorkerConfig)
    host: HostConfig = field(default_factory=HostConfig)


ENVIRONMENT: dict[str, str] = {
    "RANKWATCH_KAFKA": "kafka.bootstrap",
    "RANKWATCH_GROUP": "kafka.group",
    "RANKWATCH_TOPIC_PREFIX": "kafka.topic_prefix",
    "RANKWATCH_PARTITIONS": "kafka.partitions",
    "RANKWATCH_REPLICATION": "kafka.replication",
    "RANKWATCH_SESSION_TIMEOUT_S": "kafka.session_timeout_s",
    "RANKWATCH_STOP_WAIT_S": "kafka.stop_wait_s",
    "RANKWATCH_CLICKHOUSE": "clickhouse.dsn",
    "RANKWATCH_DATABASE": "clickhouse.database",
    "RANKWATCH_HOUSEKEEPING_NICE": "clickhouse.housekeeping_nice",
    "RANKWATCH_STORE_TIMEOUT_S": "clickhouse.timeout_s",
    "RANKWATCH_GRACE_S": "assembly.grace_s",
    "RANKWATCH_QUIET_GRACE_S": "assembly.quiet_grace_s",
    "RANKWATCH_LATE": "assembly.late",
    "RANKWATCH_STEP_WINDOW": "assembly.step_window",
    "RANKWATCH_WINDOW": "worker.window",
    "RANKWATCH_KEEP_OPS": "worker.keep_ops",
    "RANKWATCH_MAX_MESSAGE_BYTES": "worker.max_message_bytes",
    "RANKWATCH_FETCH_BYTES": "worker.fetch_bytes",
    "RANKWATCH_FETCH_WAIT_MS": "worker.fetch_wait_ms",
    "RANKWATCH_TICK_S": "worker.tick_s",
    "RANKWATCH_STORE_GAP_S": "worker.store_gap_s",
    "RANKWATCH_COMMIT_INTERVAL_S": "worker.commit_interval_s",
    "RANKWATCH_RETIRE_AFTER_S": "worker.retire_after_s",
    "RANKWATCH_STATUS_FILE": "worker.status_file",
    "RANKWATCH_ALERT_SLOWDOWN": "worker.alert_slowdown",
    "RANKWATCH_ALERT_CLEAR": "worker.alert_clear",
    "RANKWATCH_ALERT_WINDOW": "worker.alert_window",
    "RANKWATCH_HOOKS_SPOOL": "host.spool_dir",
}
"""Environment variable -> the setting (``section.key``) it sets."""

Origins = dict[str, str]
"""``section.key`` -> where its value came from: ``default``, the file's path,
``env VAR`` or ``flag``."""


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the TOML file's sections, then the environment."""
    return load_config_origins(path, env)[0]


def load_config_origins(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[Config, Origins]:
    """:func:`load_config`, and where each setting came from."""
    env = os.environ if env is None else env
    config, origins = Config(), Origins()
    if path is not None:
        config = _apply(config, _read_toml(Path(path)), str(path), origins)
    for var, setting in ENVIRONMENT.items():
        if var in env:
            section, key = setting.split(".")
            config = _apply(config, {section: {key: env[var]}}, f"env {var}", origins)
    return config, origins


def with_flags(config: Config, flags: Mapping[str, Any], origins: Origins | None = None) -> Config:
    """``config`` with the command-line values that were given (None: not given)."""
    sections: dict[str, dict[str, Any]] = {}
    for setting, value in flags.items():
        if value is not None:
            section, key = setting.split(".")
            sections.setdefault(section, {})[key] = value
    return _apply(config, sections, "flag", {} if origins is None else origins)


def service_settings(config: Config, group_suffix: str = "") -> dict[str, Any]:
    """What every worker's settings take from the shared sections (as keyword
    arguments): where the broker and the store are, its group, topics and session."""
    return {
        "bootstrap": config.kafka.bootstrap,
        "dsn": config.clickhouse.dsn,
        "database": config.clickhouse.database or None,
        "group": f"{config.kafka.group}{group_suffix}",
        "topic_prefix": config.kafka.topic_prefix,
        "partitions": config.kafka.partitions,
        "session_timeout_s": config.kafka.session_timeout_s,
        "stop_wait_s": config.kafka.stop_wait_s,
        "housekeeping_nice": config.clickhouse.housekeeping_nice,
        "store_timeout_s": config.clickhouse.timeout_s,
    }


def settings(config: Config, origins: Origins) -> dict[str, dict[str, tuple[Any, str]]]:
    """section -> key -> (value, origin): what ``rankwatch config show`` prints."""
    return {
        f.name: {
            k.name: (
                getattr(getattr(config, f.name), k.name),
                origins.get(f"{f.name}.{k.name}", "default"),
            )
            for k in fields(getattr(config, f.name))
        }
        for f in fields(config)
    }


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read config {path}: {exc}") from exc


def _apply(config: Config, raw: Mapping[str, Any], origin: str, origins: Origins) -> Config:
    sections = {f.name: getattr(config, f.name) for f in fields(config)}
    for name, values in raw.items():
        if name not in sections or not isinstance(values, Mapping):
            raise UserError(f"{origin}: unknown config section [{name}]")
        sections[name] = _apply_section(sections[name], values, f"{origin} [{name}]")
        origins.update({f"{name}.{key}": origin for key in values})
    return replace(config, **sections)


def _apply_section(section: Any, values: Mapping[str, Any], origin: str) -> Any:
    types = {f.name: type(getattr(section, f.name)) for f in fields(section)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in types:
            raise UserError(f"{origin}: unknown key {key!r}")
        try:
            changes[key] = _coerce(types[key], value)
        except (TypeError, ValueError) as exc:
            raise UserError(f"{origin}: {key} must be {types[key].__name__}: {value!r}") from exc
    try:
        return replace(section, **changes)
    except ValueError as exc:  # the section's own checks (e.g. a value out of range)
        raise UserError(f"{origin}: {exc}") from exc


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(kind: type, value: Any) -> Any:
    """``value`` (from TOML, the environment or a flag) as ``kind``; a boolean from a
    string only when it says so (``bool("0")`` would be True)."""
    if kind is bool and isinstance(value, str):
        if value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(value)
    if kind is bool and not isinstance(value, bool):
        raise TypeError(value)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if kind is int and isinstance(value, str):
        return int(float(value)) if float(value).is_integer() else int(value)
    return kind(value)
