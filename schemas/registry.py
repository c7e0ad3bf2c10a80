"""The JSON Schema files of this folder, loaded once, and their compiled validators.

A schema file is ``<kind>.v<version>.schema.json``; the file is the contract, everything
else (codec column rules, DDL checks) is read from it. jsonschema is imported lazily so
that code which only encodes without validating needs nothing beyond orjson.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.topics import TOPICS

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

SCHEMA_DIR = Path(__file__).resolve().parent
KINDS: tuple[str, ...] = tuple(TOPICS)
_FILE_NAME = re.compile(r"^(?P<kind>[a-z_]+)\.v(?P<version>[0-9]+)\.schema\.json$")


@cache
def versions(kind: str) -> tuple[int, ...]:
    """Schema versions shipped for ``kind``, ascending (empty for an unknown kind)."""
    found = []
    for path in SCHEMA_DIR.glob(f"{kind}.v*.schema.json"):
        match = _FILE_NAME.match(path.name)
        if match and match["kind"] == kind:
            found.append(int(match["version"]))
    return tuple(sorted(found))


def latest_version(kind: str) -> int:
    """The version new messages of ``kind`` are written with."""
    return _known_versions(kind)[-1]


@cache
def schema(kind: str, version: int = 1) -> Mapping[str, Any]:
    """The parsed schema of ``kind`` at ``version``.

    Raises :class:`InvalidMessage` (``unknown-kind`` / ``unknown-version``).
    """
    if version not in _known_versions(kind):
        raise InvalidMessage(
            "unknown-version",
            f"{kind} messages have schema versions {list(versions(kind))}, not {version!r}",
        )
    path = SCHEMA_DIR / f"{kind}.v{version}.schema.json"
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


@cache
def validator(kind: str, version: int = 1) -> Validator:
    """A compiled draft 2020-12 validator for ``kind`` (built once per process)."""
    return compile_schema(schema(kind, version))


def compile_schema(raw: Mapping[str, Any]) -> Validator:
    """Check ``raw`` is itself a valid draft 2020-12 schema and compile it."""
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(raw)
    compiled: Validator = Draft202012Validator(raw)
    return compiled


def _known_versions(kind: str) -> tuple[int, ...]:
    if kind not in KINDS:
        raise InvalidMessage("unknown-kind", f"no message kind {kind!r}; kinds: {', '.join(KINDS)}")
    found = versions(kind)
    if not found:  # a packaging fault, not bad input
        raise RuntimeError(f"no schema file for {kind!r} in {SCHEMA_DIR}")
    return found
