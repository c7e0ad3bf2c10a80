"""Bytes <-> messages for every topic: orjson, validated against the schema files.

Every failure raises :class:`InvalidMessage` with a short ``reason`` and a ``detail``
naming the path at fault, so a worker can dead-letter and count it in one place.

Op batches take a faster path than other kinds: jsonschema checks the envelope (header
fields and the shape of the column objects) and numpy checks the column items, with the
rules read from the same schema file (:mod:`rankwatch.schemas.columns`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from rankwatch.schemas import columns as cols
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.fastcheck import Check, compile_check
from rankwatch.schemas.opbatch import HEADER_FIELDS, OpBatch
from rankwatch.schemas.registry import (
    KINDS,
    compile_schema,
    latest_version,
    schema,
    validator,
    versions,
)

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""Largest encoded message accepted either way (Kafka's own default limit is ~1 MiB per
message unless the broker is configured otherwise; callers pass theirs)."""

_VALUE_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "minLength"}
    | {"maxLength", "pattern", "propertyNames"}
)
_DETAIL_CHARS = 300

# -- any kind ---------------------------------------------------------------------------


def encode(
    kind: str,
    message: Mapping[str, Any],
    *,
    validate: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
    """Serialise ``message`` (which carries its ``schema`` and ``version``).

    With ``validate`` (the default) the message is checked first, so a producer fails
    loudly rather than poisoning a topic; pass False only on a measured hot path.
    """
    if validate:
        _check_message(kind, message)
    return _dumps(message, max_bytes)


def decode(
    kind: str, data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """Parse and validate one message of ``kind``; returns the plain dict."""
    message = _parse(data, max_bytes)
    if kind == "ops":
        _check_identity(kind, message)
        _batch_from_message(message, bools_possible=_has_bool_literal(data))
    else:
        _check_message(kind, message)
    return message


def _check_message(kind: str, message: Mapping[str, Any]) -> None:
    version = _check_identity(kind, message)
    if kind == "ops":
        _batch_from_message(message)
        return
    _check_finite(message, "$")
    _validate(validator(kind, version), message)


# -- op batches -------------------------------------------------------------------------


def encode_ops(batch: OpBatch, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Serialise a batch after checking its header and columns against the ops schema."""
    rules = _ops_rules(latest_version("ops"))
    header = {name: _plain(getattr(batch, name)) for name in HEADER_FIELDS}
    message: dict[str, Any] = {"schema": "ops", "version": rules.version, **header}
    if batch.steps_done:
        message["steps_done"] = [
            {"step": _plain(s), "n_ops": _plain(n)} for s, n in batch.steps_done
        ]
    if batch.rank_steps:
        message["rank_steps"] = list(batch.rank_steps)
        _check_finite(message["rank_steps"], "$.rank_steps")
    _validate(rules.header, message)
    groups: dict[str, dict[str, Any]] = {group: {} for group in cols.GROUPS}
    lengths = {}
    for spec in rules.specs:
        raw = getattr(batch, spec.name)
        if raw is None:
            if spec.group == "ops":
                raise InvalidMessage("schema", f"{spec.path}: required column is None")
            continue
        column = cols.check_column(spec, np.asarray(raw))
        lengths[spec.path] = column.shape[0]
        groups[spec.group][spec.name] = _json_column(spec, column)
    _check_lengths(lengths, rules.max_items)
    message["ops"] = groups["ops"]
    if groups["extra"]:
        message["extra"] = groups["extra"]
    return _dumps(message, max_bytes)


def decode_ops(
    data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> OpBatch:
    """Parse and validate an ops message into an :class:`OpBatch`."""
    message = _parse(data, max_bytes)
    _check_identity("ops", message)
    return _batch_from_message(message, bools_possible=_has_bool_literal(data))


def _has_bool_literal(data: bytes | bytearray | memoryview) -> bool:
    """Whether a JSON boolean can be anywhere in ``data``: a byte search, far cheaper than
    looking at the type of every decoded number (strings holding "true" only cost the
    fast path, never correctness)."""
    raw = data if isinstance(data, bytes | bytearray) else bytes(data)
    return b"true" in raw or b"false" in raw


@dataclass(frozen=True)
class _OpsRules:
    version: int
    specs: tuple[cols.ColumnSpec, ...]
    envelope: Validator  # the message with column items unchecked
    envelope_ok: Check  # the same verdict, faster; jsonschema explains a failure
    header: Validator  # the scalar fields alone
    max_items: int
    block: cols.IntegerBlock  # the required plain integer columns, read in one go


@cache
def _ops_rules(version: int) -> _OpsRules:
    """The rules of one ops schema version: producers of every shipped version are
    accepted (version 1 has no ``rank_steps``; its messages decode as before)."""
    raw = schema("ops", version)
    envelope = cols.envelope_schema(raw)
    header = {
        **envelope,
        "properties": {k: v for k, v in envelope["properties"].items() if k not in cols.GROUPS},
        "required": [k for k in envelope["required"] if k not in cols.GROUPS],
    }
    specs = cols.column_specs(raw)
    return _OpsRules(
        version=version,
        specs=specs,
        envelope=compile_schema(envelope),
        envelope_ok=compile_check(envelope),
        header=compile_schema(header),
        max_items=cols.max_items(raw),
        block=cols.IntegerBlock.of(
            tuple(
                spec
                for spec in specs
                if spec.group == cols.GROUPS[0] and spec.type == "integer" and spec.enum is None
            )
        ),
    )


def _batch_from_message(message: Mapping[str, Any], *, bools_possible: bool = True) -> OpBatch:
    rules = _ops_rules(message["version"])
    if not rules.envelope_ok(message):
        _validate(rules.envelope, message)
    read: dict[str, Any] = {name: message[name] for name in HEADER_FIELDS}
    groups = {group: message.get(group) or {} for group in cols.GROUPS}
    present = []
    for spec in rules.specs:
        values = groups[spec.group].get(spec.name)
        if values is not None:
            present.append((spec, values))
    sizes = {len(values) for _, values in present}
    if len(sizes) != 1 or not 1 <= min(sizes) <= rules.max_items:
        _check_lengths({spec.path: len(values) for spec, values in present}, rules.max_items)
    left = present
    if not bools_possible:  # the common case: every integer column in one conversion
        ops = groups[cols.GROUPS[0]]
        specs = rules.block.specs
        block = rules.block.read([ops[spec.name] for spec in specs])
        if block is not None:
            read.update((spec.name, row) for spec, row in zip(specs, block, strict=True))
            left = [(spec, values) for spec, values in present if spec.name not in read]
    for spec, values in left:  # in schema order: the first fault found is the one named
        read[spec.name] = cols.read_column(spec, values, bools_possible=bools_possible)
    steps_done = tuple((d["step"], d["n_ops"]) for d in message.get("steps_done", ()))
    rank_steps = tuple(message.get("rank_steps", ()))
    return OpBatch(**read, steps_done=steps_done, rank_steps=rank_steps)


def _check_lengths(lengths: Mapping[str, int], max_items: int) -> None:
    distinct = set(lengths.values())
    if len(distinct) > 1:
        shown = ", ".join(f"{path}={n}" for path, n in lengths.items())
        raise InvalidMessage("column-length", f"columns differ in length: {shown}")
    (n,) = distinct
    if not 1 <= n <= max_items:
        raise InvalidMessage("column-length", f"a batch holds 1 to {max_items} records, not {n}")


def _json_column(spec: cols.ColumnSpec, column: np.ndarray) -> Any:
    """What orjson writes for a column: numbers as numpy, strings as lists."""
    if spec.enum is not None:
        names = np.asarray(spec.enum, dtype=object)
        return names[column].tolist()
    if column.dtype == object:
        return column.tolist()
    return np.ascontiguousarray(column)


def _plain(value: Any) -> Any:
    """numpy scalars in a header become Python ones (jsonschema and orjson want those)."""
    return value.item() if isinstance(value, np.generic) else value


# -- shared steps -----------------------------------------------------------------------


def _dumps(message: Mapping[str, Any], max_bytes: int) -> bytes:
    try:
        data = orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:  # orjson.JSONEncodeError: a lone surrogate, an odd type...
        raise InvalidMessage("schema", f"cannot serialise: {exc}") from None
    _check_size(data, max_bytes)
    return data


def _parse(data: bytes | bytearray | memoryview, max_bytes: int) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidMessage("malformed-json", f"expected bytes, got {type(data).__name__}")
    _check_size(data, max_bytes)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage("malformed-json", str(exc)[:_DETAIL_CHARS]) from None


def _check_size(data: bytes | bytearray | memoryview, max_bytes: int) -> None:
    size = len(data) if not isinstance(data, memoryview) else data.nbytes
    if size > max_bytes:
        raise InvalidMessage("too-large", f"{size} bytes, more than the limit of {max_bytes}")


def _check_identity(kind: str, message: Any) -> int:
    """The message is an object of ``kind`` at a known version; returns that version."""
    if kind not in KINDS:
        raise InvalidMessage("unknown-kind", f"no message kind {kind!r}; kinds: {', '.join(KINDS)}")
    if not isinstance(message, Mapping):
        raise InvalidMessage(
            "schema", f"$: a message is a JSON object, not {type(message).__name__}"
        )
    if message.get("schema") != kind:
        raise InvalidMessage(
            "schema", f"$.schema: {message.get('schema')!r} where {kind!r} expected"
        )
    version = message.get("version")
    if type(version) is not int:
        raise InvalidMessage("schema", f"$.version: {version!r} is not an integer")
    if version not in versions(kind):
        raise InvalidMessage(
            "unknown-version", f"$.version: {version}; known: {list(versions(kind))}"
        )
    return version


def _validate(compiled: Validator, message: Any) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(compiled.iter_errors(message))
    if error is None:
        return
    reason = "bad-value" if error.validator in _VALUE_KEYWORDS else "schema"
    raise InvalidMessage(reason, f"{error.json_path}: {error.message}"[:_DETAIL_CHARS])


def _check_finite(value: Any, path: str) -> None:
    """jsonschema accepts NaN as a number and orjson writes it as null: refuse it here."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidMessage("bad-value", f"{path}: {value} is not finite")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_finite(item, f"{path}[{i}]")
