"""Push the boards to an existing Grafana: ``rankwatch grafana publish --url --token``.

Idempotent: each board keeps its uid, is saved only when its content differs from what
Grafana holds (so re-publishing unchanged boards creates no new version), and each save
is a new Grafana version whose message names the rankwatch version and the content
digest. The folder is created on first use. Uses grafana-client (the ``grafana`` extra).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from rankwatch.grafana.boards import BOARDS
from rankwatch.grafana.build import board_model

_VOLATILE = ("id", "version")
"""Keys Grafana sets on save: not part of the content compared."""


class PublishError(RuntimeError):
    """Grafana refused or could not be reached."""


@dataclass(frozen=True)
class Published:
    uid: str
    action: str  # created | updated | unchanged
    version: int
    url: str


def digest(model: dict[str, Any]) -> str:
    content = {k: v for k, v in model.items() if k not in _VOLATILE}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def folder_uid(title: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-") or "rankwatch"


def publish(
    url: str, token: str, folder: str = "rankwatch", api: Any | None = None
) -> list[Published]:
    """Create or update every board in ``folder``; returns what happened to each."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    api = api or GrafanaApi.from_url(url, credential=token)
    try:
        folder_id = _ensure_folder(api, folder, GrafanaException)
        return [
            _publish_one(api, board_model(name), folder_id, GrafanaException) for name in BOARDS
        ]
    except GrafanaException as exc:
        raise PublishError(f"Grafana at {url}: {exc.status_code} {exc.message}") from exc
    except OSError as exc:  # connection refused, DNS
        raise PublishError(f"Grafana at {url}: {exc}") from exc


def _ensure_folder(api: Any, title: str, errors: type[Exception]) -> str:
    uid = folder_uid(title)
    try:
        api.folder.get_folder(uid)
    except errors as exc:
        if getattr(exc, "status_code", None) != 404:
            raise
        api.folder.create_folder(title, uid=uid)
    return uid


def _publish_one(
    api: Any, model: dict[str, Any], folder: str, errors: type[Exception]
) -> Published:
    uid = model["uid"]
    try:
        current = api.dashboard.get_dashboard(uid)
    except errors as exc:
        if getattr(exc, "status_code", None) != 404:
            raise
        current = None
    if current is not None:
        held = current["dashboard"]
        same_folder = current.get("meta", {}).get("folderUid", folder) == folder
        if same_folder and digest(held) == digest(model):
            return Published(uid, "unchanged", int(held.get("version", 0)), _url(current))
    body = {k: v for k, v in model.items() if k not in _VOLATILE}
    if current is not None:
        body["version"] = current["dashboard"].get("version", 0)
    saved = api.dashboard.update_dashboard(
        {
            "dashboard": body,
            "folderUid": folder,
            "overwrite": True,
            "message": f"rankwatch {_version()} ({digest(model)})",
        }
    )
    action = "created" if current is None else "updated"
    return Published(uid, action, int(saved.get("version", 0)), str(saved.get("url", "")))


def _url(current: dict[str, Any]) -> str:
    return str(current.get("meta", {}).get("url", ""))


def _version() -> str:
    try:
        return metadata.version("rankwatch")
    except metadata.PackageNotFoundError:
        return "dev"
