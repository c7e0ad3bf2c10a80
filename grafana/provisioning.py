"""Provisioning for a Grafana that starts with the rankwatch boards and datasource.

``provisioning/datasources/rankwatch-clickhouse.yaml`` reads the ClickHouse address
from Grafana's environment; :func:`datasource_env` derives those variables from the
DSN the rest of rankwatch uses (``RANKWATCH_CLICKHOUSE``), so one DSN configures both.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

PROVISIONING_DIR = Path(__file__).resolve().parent / "provisioning"

_DEFAULT_PORTS = {"http": 8123, "https": 8443}


def datasource_env(dsn: str, database: str = "") -> dict[str, str]:
    """The ``RANKWATCH_CH_*`` variables of the datasource file for an HTTP(S) DSN.

    The plugin speaks ClickHouse's HTTP or native protocol to a server; an embedded
    ``chdb://`` store has no server for Grafana to reach, so it is refused.
    """
    parts = urlsplit(dsn)
    if parts.scheme not in _DEFAULT_PORTS:
        where = dsn.rsplit("@", maxsplit=1)[-1]  # never echo a password
        raise ValueError(
            f"{where!r}: Grafana needs a ClickHouse server: http(s)://user:pw@host:port/db"
        )
    if not parts.hostname:
        raise ValueError(f"{parts.scheme}:// DSN without a host")
    return {
        "RANKWATCH_CH_HOST": parts.hostname,
        "RANKWATCH_CH_PORT": str(parts.port or _DEFAULT_PORTS[parts.scheme]),
        "RANKWATCH_CH_PROTOCOL": "http",
        "RANKWATCH_CH_SECURE": "true" if parts.scheme == "https" else "false",
        "RANKWATCH_CH_USER": unquote(parts.username or "default"),
        "RANKWATCH_CH_PASSWORD": unquote(parts.password or ""),
        "RANKWATCH_CH_DATABASE": database or parts.path.strip("/") or "rankwatch",
    }
