"""The process-wide hooks: ``init`` once per rank, then module-level ``op``/``step_*``.

Before ``init`` (or with ``RANKWATCH_HOOKS=off``) every call is a no-op, so library
code can be instrumented unconditionally — the global off switch.

Where records go, first match wins: ``sink`` (a callable, the embedded mode), Kafka
(``kafka=`` or ``RANKWATCH_KAFKA``), else a spool file only, when one is named
(``spool_dir`` or ``RANKWATCH_HOOKS_SPOOL``), else nowhere. With Kafka, messages the
broker does not take are spooled: by default under
:func:`~rankwatch.schemas.spool.default_spool_dir` (``$TMPDIR/rankwatch-<uid>/spool``),
elsewhere with ``spool_dir`` or ``RANKWATCH_HOOKS_SPOOL``, not at all with ``off``. A
spool a rank leaves behind (its job ended while the broker was away) is sent by the
host's ``rankwatch agent`` or ``rankwatch relay``. Nothing here ever raises into the
training program: a destination that cannot be used is one warning in the log, and the
hooks go on without it (or, with none at all, do nothing).

``RANKWATCH_RELAY`` (``HooksConfig.relay``): the socket of this host's relay, with
Kafka: small op messages go through it, bundled with the host's other ranks' (a worker
pays its per-message cost once for all of them); everything else goes to Kafka.

``RANKWATCH_OPS_FROM=tp0`` (``HooksConfig.ops_from``): only the tensor- and
context-parallel rank 0 of each (DP rank, stage) sends its op records; the others send
heartbeats and stack dumps only. The what-if reads only those ranks' ops anyway (TP and
CP peers move in lockstep), so on a large job this cuts the ops traffic by TP x CP
(``docs/sizing.md``).

``RANKWATCH_HEARTBEAT_S`` and ``RANKWATCH_WATCHDOG_S`` (seconds an op may stay in
flight before the watchdog dumps the stacks; 0: off), when set, override what the
program passed to ``init``: the operator tunes hang detection without editing the
training script.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity, identity_from_env
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.tracker import NOOP, RankWatch
from rankwatch.hooks.transports import (
    KafkaTransport,
    RelayTransport,
    SinkTransport,
    SpoolTransport,
    Transport,
)
from rankwatch.hooks.watchdog import WatchdogConfig
from rankwatch.schemas.beacon import Beacon, beats_dir
from rankwatch.schemas.spool import DEFAULT_MAX_BYTES as DEFAULT_SPOOL_BYTES
from rankwatch.schemas.spool import SUFFIX as SPOOL_SUFFIX
from rankwatch.schemas.spool import Spool, SpoolBusy, default_spool_dir, private_dir
from rankwatch.schemas.topics import TOPICS

OFF_VALUES = frozenset({"0", "off", "false", "no"})
log = logging.getLogger("rankwatch.hooks")
OPS_FROM = ("all", "tp0")


@dataclass(frozen=True)
class HooksConfig:
    enabled: bool = True
    kafka: str = ""
    """Bootstrap servers; empty: no Kafka."""
    topic_prefix: str = "rankwatch"
    spool_dir: str = ""
    """Where this rank's spool goes: empty for :func:`default_spool_dir`, ``off`` for no
    spool at all (a broker that is away then costs the records it does not take)."""
    spool_max_bytes: int = DEFAULT_SPOOL_BYTES
    capacity: int = 100_000
    """Records the buffer holds before dropping the oldest."""
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    ops_from: str = "all"
    """"all": every rank sends its op records; "tp0": only ranks with tp_rank 0 and
    cp_rank 0 do (the rest send heartbeats and stack dumps)."""
    relay: str = ""
    """The Unix socket of this host's relay (``rankwatch relay``), which bundles the
    host's ranks' small op messages into one; empty: none. Only with ``kafka``, which
    the rest goes to (and every message the relay does not take)."""
    beacon: bool = True
    """With Kafka: each heartbeat also goes into a file beside the spool
    (``schemas/beacon.py``), where the host's agent sees a rank whose heartbeats stopped
    and takes its stack from outside; ``RANKWATCH_BEACON=off`` for none."""

    def __post_init__(self) -> None:
        if self.ops_from not in OPS_FROM:
            raise ValueError(f"ops_from must be one of {', '.join(OPS_FROM)}: {self.ops_from!r}")

    def sends_ops(self, identity: Identity) -> bool:
        return self.ops_from == "all" or (identity.tp_rank == 0 and identity.cp_rank == 0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **given: Any) -> HooksConfig:
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "enabled": env.get("RANKWATCH_HOOKS", "on").lower() not in OFF_VALUES,
            "kafka": env.get("RANKWATCH_KAFKA", ""),
            "topic_prefix": env.get("RANKWATCH_TOPIC_PREFIX", "rankwatch"),
            "spool_dir": env.get("RANKWATCH_HOOKS_SPOOL", ""),
            "ops_from": env.get("RANKWATCH_OPS_FROM", "all").lower(),
            "relay": env.get("RANKWATCH_RELAY", ""),
            "beacon": env.get("RANKWATCH_BEACON", "on").lower() not in OFF_VALUES,
        }
        values.update({k: v for k, v in given.items() if v is not None})
        return with_env_overrides(cls(**values), env)


def with_env_overrides(config: HooksConfig, env: Mapping[str, str] | None = None) -> HooksConfig:
    """``config`` with the heartbeat period and watchdog threshold the environment sets."""
    env = os.environ if env is None else env
    beat, watch = env.get("RANKWATCH_HEARTBEAT_S"), env.get("RANKWATCH_WATCHDOG_S")
    if beat:
        config = replace(config, publisher=replace(config.publisher, heartbeat_s=float(beat)))
    if watch:
        config = replace(config, watchdog=replace(config.watchdog, threshold_s=float(watch)))
    return config


_current: RankWatch | None = None


def init(
    config: HooksConfig | None = None,
    identity: Identity | None = None,
    sink: Callable[[str, bytes], None] | None = None,
    clock: Clock | None = None,
) -> RankWatch | None:
    """Start this rank's hooks (replacing any earlier ones); None when switched off."""
    global _current
    config = with_env_overrides(config or HooksConfig.from_env())
    if _current is not None:
        _current.close()
        _current = None
    if not config.enabled:
        return None
    identity = identity or identity_from_env()
    destination = _destination(config, identity, sink)
    if destination is None:
        return None
    transport, spool = destination
    beacon = open_beacon(config, identity) if config.kafka and sink is None else None
    publisher = replace(config.publisher, send_ops=config.sends_ops(identity))
    _current = RankWatch(
        identity,
        transport,
        clock=clock,
        capacity=config.capacity,
        publisher=publisher,
        spool=spool,
        watchdog=config.watchdog,
        beacon=beacon,
    )
    atexit.register(_current.close)
    return _current


def open_spool(config: HooksConfig, identity: Identity) -> Spool | None:
    """This rank's spool, or None (``off``, or it cannot be used: said in the log). Named
    for the job and rank, no pid, so that a restarted rank finds its predecessor's spool
    and resends it; while another live process holds that one, the pid is added."""
    if config.spool_dir.lower() in OFF_VALUES | {"none"}:
        return None
    meta = {
        "job": identity.job,
        "rank": identity.rank,
        "topic_prefix": config.topic_prefix,
        "kafka": config.kafka,
    }  # where a spool left behind is sent (rankwatch.agent.spools)
    try:
        folder = private_dir(Path(config.spool_dir) if config.spool_dir else default_spool_dir())
        name = f"{identity.job}.rank{identity.rank}"
        size = config.spool_max_bytes
        try:
            return Spool(folder / f"{name}{SPOOL_SUFFIX}", size, meta=meta)
        except SpoolBusy:
            return Spool(folder / f"{name}.{os.getpid()}{SPOOL_SUFFIX}", size, meta=meta)
    except OSError as exc:
        log.warning("rankwatch hooks: no spool (%s): records the broker misses are lost", exc)
        return None


def open_beacon(config: HooksConfig, identity: Identity) -> Beacon | None:
    """This rank's beacon (``schemas/beacon.py``), beside its spool (the default folder
    when the spool is off), or None (switched off, or the folder cannot be used: said
    in the log)."""
    if not config.beacon:
        return None
    off = config.spool_dir.lower() in OFF_VALUES | {"none"}
    base = default_spool_dir() if off or not config.spool_dir else Path(config.spool_dir)
    try:
        folder = private_dir(beats_dir(private_dir(base)))
    except OSError as exc:
        log.warning("rankwatch hooks: no beacon (%s): the host agent cannot see this rank", exc)
        return None
    return Beacon(folder, identity.job, identity.rank, config.topic_prefix)


def _destination(
    config: HooksConfig, identity: Identity, sink: Callable[[str, bytes], None] | None
) -> tuple[Transport, Spool | None] | None:
    """Where this rank's messages go, and its spool; None when nowhere (logged)."""
    # in-process (a sink) only a spool asked for: the sink is the destination
    spool = open_spool(config, identity) if sink is None or config.spool_dir else None
    if sink is not None:
        return SinkTransport(sink), spool
    if config.kafka:
        topics = {kind: f"{config.topic_prefix}.{kind}" for kind in TOPICS}
        direct = KafkaTransport(config.kafka, key=identity.job.encode(), topics=topics)
        if config.relay:
            return RelayTransport(config.relay, direct), spool
        return direct, spool
    if spool is None or not config.spool_dir:  # a spool alone only when one is named
        if spool is not None:
            spool.close()
        log.warning(
            "rankwatch hooks: off, nothing is recorded: no destination (set"
            " RANKWATCH_KAFKA, or RANKWATCH_HOOKS_SPOOL to record to a file)"
        )
        return None
    return SpoolTransport(spool), None


def current() -> RankWatch | None:
    return _current


def shutdown() -> None:
    """Flush and stop the process-wide hooks."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


def op(optype: str, mb: int = -1, chunk: int | None = None, gmc: int | None = None) -> Any:
    rw = _current
    return NOOP if rw is None else rw.op(optype, mb, chunk, gmc)


def phase(name: str, bound_s: float | None = None) -> Any:
    """``with rankwatch.hooks.phase("checkpoint-save"):`` (:meth:`RankWatch.phase`)."""
    rw = _current
    return NOOP if rw is None else rw.phase(name, bound_s)


def step_begin(step: int) -> None:
    if _current is not None:
        _current.step_begin(step)


def step_end() -> None:
    if _current is not None:
        _current.step_end()
