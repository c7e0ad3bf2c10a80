"""What every worker's settings hold: where the broker and the store are, its consumer
group, its topics, its timer and its group session.

Each worker's settings extend :class:`ServiceSettings` with their own section (the
ops worker's ``WorkerSettings``, ``HangSettings``, ``MinderSettings``) and their own
group; ``rankwatch.config.service_settings`` fills these fields from the config tree.
Pure: plain values.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwatch.streams.kit.housekeeping import DEFAULT_NICE

DEFAULT_TIMEOUT_S = 30.0
"""How long a ClickHouse server may stay silent on one request before the store calls
it a transient failure (the worker then keeps the rows and retries with backoff). This
bounds how long a hung server holds a store: the ops and hang workers read on meanwhile,
the Minder worker's event loop waits (clickhouse-connect's own default is 300 s)."""

STOP_WAIT_S = 25.0
"""How long a stopping worker may take before the process ends anyway: under
Kubernetes' default grace of 30 s, so the worker's own log says why it ended, not a
SIGKILL (``streams/kit/faustapp.py``, ``serve``)."""


@dataclass(frozen=True)
class ServiceSettings:
    bootstrap: str
    dsn: str
    database: str | None = None
    """None: the DSN's database, else ``rankwatch``."""
    group: str = "rankwatch-worker"
    topic_prefix: str = "rankwatch"
    """Topics are ``<prefix>.<kind>``; tests use a fresh prefix each."""
    partitions: int = 8
    """Of the topics the worker creates at start."""
    tick_s: float = 1.0
    """How often the worker's timer runs (closing steps, evaluating jobs, storing)."""
    session_timeout_s: float = 30.0
    """Kafka group session: how long a killed worker's partitions wait for a successor."""
    stop_wait_s: float = STOP_WAIT_S
    """How long a stop (SIGTERM, SIGINT) may take before the process ends anyway."""
    housekeeping_nice: int = DEFAULT_NICE
    """Embedded chDB's background threads run at this nice value (0: untouched)."""
    store_timeout_s: float = DEFAULT_TIMEOUT_S
    """A ClickHouse server's longest silence on one request (then: retried)."""
    status_file: str | None = None
    """Where the worker writes its health (JSON) every tick; ``rankwatch worker --health
    FILE`` checks it (any worker's)."""
    retire_after_s: float = 3600.0
    """A job none of whose messages came for this long, with nothing of it open or
    unstored, is forgotten: the store (and, for the ops worker, its jobstate message)
    holds its state, and a message of it that comes later brings it back as a job first
    met. No message says a job ended; without this a worker running for weeks kept every
    job it ever saw (docs/sizing.md, "Jobs that end"). Every worker."""
