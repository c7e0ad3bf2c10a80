"""Bytes <-> messages for every topic: orjson, validated against the schema files.

Every failure raises :class:`InvalidMessage` with a short ``reason`` and a ``detail``
naming the path at fault, so a worker can dead-letter and count it in one place.

Op batches take a faster path than other kinds: jsonschema checks the envelope (header
fields and the shape of the column objects) and numpy checks the column items, with the
rules read from the same schema file (:mod:`rankwatch.schemas.columns`). From version 3
an op batch is a binary frame (:mod:`rankwatch.schemas.frame`): a JSON header checked
the same way, then column blocks read with ``np.frombuffer`` and checked with the same
item rules; :func:`decode_ops` reads either form.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from rankwatch.schemas import bundle, frame, joined
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
    """Parse and validate one message of ``kind``; returns the plain dict (for an ops
    frame, its header with the columns as lists under ``ops`` and ``extra``)."""
    _check_value(data)
    if kind == "ops" and isinstance(data, bytes | bytearray | memoryview) and frame.is_frame(data):
        return _frame_message(_decode_frame(data, max_bytes))
    message = _parse(data, max_bytes)
    if kind == "ops":
        _check_identity(kind, message)
        _batch_from_message(message, bools_possible=_has_bool_literal(data))
    else:
        _check_message(kind, message)
    return message


def _check_message(kind: str, message: Mapping[str, Any]) -> None:
    version = _check_identity(kind, message)
    if kind == "ops" and version in frame.binary_versions():
        raise InvalidMessage(
            "schema", f"ops v{version} is a binary frame: encode an OpBatch with encode_ops"
        )
    if kind == "ops":
        _batch_from_message(message)
        return
    _check_finite(message, "$")
    fast = _fast_check(kind, version)
    if fast is None or not fast(message):
        _validate(validator(kind, version), message)


def prepare(*kinds: str) -> None:
    """Compile the checks of every shipped version of ``kinds`` now. Done lazily, on a
    worker's first message, it cost 0.15 s of that message's job's first step (the
    10,240-GPU benchmark); a worker calls this at start."""
    for kind in kinds:
        for version in versions(kind):
            if kind == "ops":
                _ops_rules(version)
            else:
                _fast_check(kind, version)
                validator(kind, version)


@cache
def _fast_check(kind: str, version: int) -> Check | None:
    """The compiled yes/no check of a kind's schema (jsonschema explains a failure), or
    None where the schema uses a keyword fastcheck does not know: jsonschema alone then.
    Decoding a heartbeat took 199 µs with jsonschema alone, 17 with this first
    (``benchmarks/bench_codec.py``)."""
    try:
        return compile_check(schema(kind, version))
    except ValueError:
        return None


# -- op batches -------------------------------------------------------------------------


def encode_ops(
    batch: OpBatch, *, max_bytes: int = DEFAULT_MAX_BYTES, version: int | None = None
) -> bytes:
    """Serialise a batch after checking its header and columns against the ops schema of
    ``version`` (the latest, a binary frame, by default; 1 and 2 write JSON)."""
    version = latest_version("ops") if version is None else version
    if version in frame.binary_versions():
        return _encode_frame(batch, version, max_bytes)
    rules = _ops_rules(version)
    message = _batch_header(batch, rules.version)
    if not rules.header_ok(message):
        _validate(rules.header, message)
    groups: dict[str, dict[str, Any]] = {group: {} for group in cols.GROUPS}
    for spec, column in _checked_columns(batch, rules):
        groups[spec.group][spec.name] = _json_column(spec, column)
    message["ops"] = groups["ops"]
    if groups["extra"]:
        message["extra"] = groups["extra"]
    return _dumps(message, max_bytes)


def decode_ops(
    data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> OpBatch:
    """Parse and validate an ops message (a JSON document or a binary frame) into an
    :class:`OpBatch`. A frame's columns are read-only views of ``data``."""
    _check_value(data)
    if isinstance(data, bytes | bytearray | memoryview) and frame.is_frame(data):
        return _decode_frame(data, max_bytes)
    message = _parse(data, max_bytes)
    _check_identity("ops", message)
    return _batch_from_message(message, bools_possible=_has_bool_literal(data))


Member = tuple[memoryview | bytes, OpBatch | InvalidMessage]
"""One message of a bundle (or a message alone): its bytes (a joined bundle's members
share the message's), and its batch or why not."""


def decode_ops_members(
    data: bytes | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> list[Member]:
    """Every op batch in a message: a bundle's members (``x-bundle`` or ``x-joined`` of
    the ops schema), each checked as if it had come alone (one bad member does not cost
    the others), or the message alone. A bundle must fit ``max_bytes`` and its envelope
    must be right, else it is refused whole (raises :class:`InvalidMessage`). Which job
    the members may name is the consumer's rule (the message's key: ``Pipeline.on_members``)."""
    _check_value(data)
    if joined.is_joined(data):
        _check_size(data, max_bytes)
        return _decode_joined(bytes(data) if not isinstance(data, bytes) else data)
    if not bundle.is_bundle(data):
        try:
            return [(data, decode_ops(data, max_bytes=max_bytes))]
        except InvalidMessage as exc:
            return [(data, exc)]
    _check_size(data, max_bytes)
    if not isinstance(data, bytes):  # members are views: never of a changing buffer
        data = bytes(data)
    out: list[Member] = []
    for member in bundle.split(data):
        try:
            out.append((member, _decode_frame(member, max_bytes)))
        except InvalidMessage as exc:
            out.append((member, exc))
    return out


def encode_ops_joined(frames: list[bytes], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """One joined bundle of ops frames (``x-joined``: each as ``encode_ops`` writes it,
    all of one job, with the same optional columns)."""
    data = joined.join(frames)
    if data is None:
        raise InvalidMessage(
            "malformed-frame",
            "only two or more whole frames of one version and one extra_columns are joined",
        )
    _check_size(data, max_bytes)
    return data


def encode_ops_bundle(frames: list[bytes], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """One bundle of ops frames (each as ``encode_ops`` writes it, all of one job)."""
    for i, member in enumerate(frames):
        if not frame.is_frame(member):
            raise InvalidMessage("malformed-frame", f"bundle member {i} is not a frame")
    data = bundle.pack(frames)
    _check_size(data, max_bytes)
    return data


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
    header: Validator  # the scalar fields alone (a frame's header: all but the columns)
    header_ok: Check  # the same verdict, faster
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
        header_ok=compile_check(header),
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
    if message["version"] in frame.binary_versions():
        raise InvalidMessage(
            "schema", f"$.version: ops v{message['version']} travels as a binary frame, not JSON"
        )
    rules = _ops_rules(message["version"])
    if not rules.envelope_ok(message):
        _validate(rules.envelope, message)
    read: dict[str, Any] = _header_fields(message)
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
    rank_steps = tuple(message.get("rank_steps", ()))
    return OpBatch(**read, steps_done=_steps_done(message), rank_steps=rank_steps)


def _whole(value: Any, path: str) -> int:
    """An integer the schema has checked, as a Python int. JSON Schema counts ``4.0`` as
    an integer; numpy and the assembly do not, and a float header value would fail
    far from the message that carried it (a frame's ``records`` crashed the decoder)."""
    if type(value) is not int:
        raise InvalidMessage("schema", f"{path}: {value!r} is not an integer")
    return value


def _header_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: message[name] if name in _TEXT_FIELDS else _whole(message[name], f"$.{name}")
        for name in HEADER_FIELDS
    }


def _steps_done(message: Mapping[str, Any]) -> tuple[tuple[int, int], ...]:
    return tuple(
        (
            _whole(d["step"], f"$.steps_done[{i}].step"),
            _whole(d["n_ops"], f"$.steps_done[{i}].n_ops"),
        )
        for i, d in enumerate(message.get("steps_done", ()))
    )


_TEXT_FIELDS = frozenset({"job", "host"})


# -- op batches as binary frames (ops v3) ------------------------------------------------


def _encode_frame(batch: OpBatch, version: int, max_bytes: int) -> bytes:
    rules = _ops_rules(version)
    lay = frame.layout(version)
    blocks, extras, strings = {}, [], {}
    for spec, checked in _checked_columns(batch, rules):
        column = checked
        if spec.type == "string" and spec.enum is None:
            index: dict[str, int] = {}  # (numpy's fixed-width strings drop trailing NULs)
            codes = (index.setdefault(v, len(index)) for v in checked.tolist())
            column = np.fromiter(codes, np.int64, len(checked))
            strings[spec.name] = list(index)
        if spec.group != "ops":
            extras.append(spec.name)
        blocks[spec.name] = column.astype(lay.dtypes[spec.name], copy=False)
    header = _batch_header(
        batch, version, records=len(batch), extra_columns=extras or None, strings=strings or None
    )
    if not rules.header_ok(header):
        _validate(rules.header, header)
    data = frame.pack(_dumps(header, max_bytes), blocks, lay)
    _check_size(data, max_bytes)
    return data


def _batch_header(batch: OpBatch, version: int, **between: Any) -> dict[str, Any]:
    """A batch's scalar fields, then ``between`` (a frame's record count and column
    lists; None is left out), then ``steps_done`` and ``rank_steps``: the same in JSON
    and in a frame's header, in the order the hooks write them (their frames equal the
    codec's, byte for byte)."""
    header: dict[str, Any] = {"schema": "ops", "version": version}
    header.update((name, _plain(getattr(batch, name))) for name in HEADER_FIELDS)
    header.update((key, value) for key, value in between.items() if value is not None)
    if batch.steps_done:
        header["steps_done"] = [
            {"step": _plain(s), "n_ops": _plain(n)} for s, n in batch.steps_done
        ]
    if batch.rank_steps:
        header["rank_steps"] = list(batch.rank_steps)
        _check_finite(header["rank_steps"], "$.rank_steps")
    return header


def _checked_columns(batch: OpBatch, rules: _OpsRules) -> list[tuple[cols.ColumnSpec, np.ndarray]]:
    """The batch's columns present, each checked against its item rules, in schema
    order, all of one length; a required column missing is refused."""
    out, lengths = [], {}
    for spec in rules.specs:
        raw = getattr(batch, spec.name)
        if raw is None:
            if spec.group == "ops":
                raise InvalidMessage("schema", f"{spec.path}: required column is None")
            continue
        column = cols.check_column(spec, np.asarray(raw))
        lengths[spec.path] = column.shape[0]
        out.append((spec, column))
    _check_lengths(lengths, rules.max_items)
    return out


def _decode_frame(data: bytes | bytearray | memoryview, max_bytes: int) -> OpBatch:
    _check_size(data, max_bytes)
    if not _immutable(data):  # the columns are views of it: never of a buffer the caller
        data = bytes(data)  # may still change (Kafka hands over bytes, bundles views of them)
    head, start = frame.split(data)
    header = _frame_header(head, "frame header")
    how, strings = _checked_header(header)
    records = _whole(header["records"], "$.records")
    runs = frame.read_runs(data, start, records, how.plan, how.align)
    return _frame_batch(header, how, runs, strings)


def _frame_header(head: bytes | memoryview, what: str) -> Any:
    try:
        return orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage("malformed-json", f"{what}: {exc}"[:_DETAIL_CHARS]) from None


def _checked_header(header: Any) -> tuple[_FramePlan, Mapping[str, list[str]]]:
    """How to read the columns of a frame with this header, and its string lists."""
    version = _check_identity("ops", header)
    if version not in frame.binary_versions():
        raise InvalidMessage("schema", f"$.version: ops v{version} is JSON, not a binary frame")
    rules = _ops_rules(version)
    if not rules.header_ok(header):
        _validate(rules.header, header)
    how = _frame_plan(version, tuple(header.get("extra_columns", ())))
    strings = header.get("strings", _NO_STRINGS)
    if strings and not how.strings.issuperset(strings):
        unused = sorted(set(strings) - how.strings)
        raise InvalidMessage("schema", f"$.strings: {unused} name no column sent")
    return how, strings


def _frame_batch(
    header: Mapping[str, Any],
    how: _FramePlan,
    runs: list[np.ndarray],
    strings: Mapping[str, list[str]],
) -> OpBatch:
    """The batch of a checked header and its runs of columns, checked here."""
    read: dict[str, Any] = _header_fields(header)
    for run, names, values in zip(how.plan.runs, how.names, runs, strict=True):
        read.update(zip(names, cols.check_run(run.specs, values, strings), strict=True))
    return _batch(header, read)


def _batch(header: Mapping[str, Any], read: dict[str, Any]) -> OpBatch:
    rank_steps = tuple(header.get("rank_steps", ()))
    return OpBatch(**read, steps_done=_steps_done(header), rank_steps=rank_steps)


def _decode_joined(data: bytes) -> list[Member]:
    """The members of a joined bundle (``x-joined``), each checked as if it had come
    alone: the columns are checked once for all members, and member by member only when
    that finds a fault (so the fault is named as it would be alone)."""
    heads, start = joined.split(data)
    headers = [_frame_header(h, f"joined member {i}'s header") for i, h in enumerate(heads)]
    shapes = [joined.shape(h, i) for i, h in enumerate(headers)]
    if len({extras for extras, _ in shapes}) != 1:
        raise InvalidMessage("malformed-frame", "joined members name unlike extra_columns")
    how = _frame_plan(joined.layout().version, shapes[0][0])
    ends = list(itertools.accumulate(records for _, records in shapes))
    runs = frame.read_runs(data, start, ends[-1], how.plan, how.align)
    checked = _checked_jointly(how, runs)
    coded = [
        (run, names, values)
        for run, names, values in zip(how.plan.runs, how.names, runs, strict=True)
        if names[0] in how.strings
    ]
    out: list[Member] = []
    for header, lo, hi in zip(headers, [0, *ends[:-1]], ends, strict=True):
        try:
            _, strings = _checked_header(header)
            if checked is None:
                batch = _frame_batch(header, how, [run[:, lo:hi] for run in runs], strings)
            else:
                read = _header_fields(header)
                read.update((name, column[lo:hi]) for name, column in checked.items())
                for run, names, values in coded:  # codes into this member's own lists
                    mine = cols.check_run(run.specs, values[:, lo:hi], strings)
                    read.update(zip(names, mine, strict=True))
                batch = _batch(header, read)
            out.append((data, batch))
        except InvalidMessage as exc:
            out.append((data, exc))
    return out


def _checked_jointly(how: _FramePlan, runs: list[np.ndarray]) -> dict[str, np.ndarray] | None:
    """Every column but the string-coded ones (each member's codes index its own lists)
    checked over all members at once; None when any item breaks a rule."""
    out: dict[str, np.ndarray] = {}
    try:
        for run, names, values in zip(how.plan.runs, how.names, runs, strict=True):
            if names[0] not in how.strings:
                out.update(zip(names, cols.check_run(run.specs, values, _NO_STRINGS), strict=True))
    except InvalidMessage:
        return None
    return out


def _immutable(data: bytes | bytearray | memoryview) -> bool:
    return isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes))


_NO_STRINGS: dict[str, list[str]] = {}


@dataclass(frozen=True)
class _FramePlan:
    plan: frame.Plan
    align: int
    names: tuple[tuple[str, ...], ...]  # the column names of each run
    strings: frozenset[str]  # the string columns sent


@cache
def _frame_plan(version: int, extras: tuple[str, ...]) -> _FramePlan:
    """How to read a frame naming ``extras``: they must be optional columns, each once,
    in schema order."""
    rules = _ops_rules(version)
    optional = [spec.name for spec in rules.specs if spec.group != cols.GROUPS[0]]
    if [name for name in optional if name in extras] != list(extras):
        raise InvalidMessage(
            "schema",
            f"$.extra_columns: {list(extras)}; each of {optional} at most once, in that order",
        )
    present = [spec for spec in rules.specs if spec.group == cols.GROUPS[0] or spec.name in extras]
    how = frame.plan(version, frozenset(spec.name for spec in present))
    return _FramePlan(
        plan=how,
        align=frame.layout(version).align,
        names=tuple(tuple(spec.name for spec in run.specs) for run in how.runs),
        strings=frozenset(s.name for s in present if s.type == "string" and s.enum is None),
    )


def _frame_message(batch: OpBatch) -> dict[str, Any]:
    """A decoded frame as a plain dict: its header, and its columns as JSON lists."""
    version = latest_binary = frame.binary_versions()[-1]
    rules = _ops_rules(latest_binary)
    message: dict[str, Any] = {"schema": "ops", "version": version}
    message.update((name, getattr(batch, name)) for name in HEADER_FIELDS)
    message["records"] = len(batch)
    groups: dict[str, dict[str, Any]] = {group: {} for group in cols.GROUPS}
    for spec in rules.specs:
        column = getattr(batch, spec.name)
        if column is not None:
            value = _json_column(spec, column)
            groups[spec.group][spec.name] = value if isinstance(value, list) else value.tolist()
    message["ops"] = groups["ops"]
    if groups["extra"]:
        message["extra_columns"] = list(groups["extra"])
        message["extra"] = groups["extra"]
    if batch.steps_done:
        message["steps_done"] = [{"step": s, "n_ops": n} for s, n in batch.steps_done]
    if batch.rank_steps:
        message["rank_steps"] = list(batch.rank_steps)
    return message


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


def _check_value(data: Any) -> None:
    """A Kafka record may have no value: a tombstone (null, what compaction deletes a key
    with) or zero bytes. Neither is a message of any kind; no producer of ours sends one,
    but any client can."""
    if data is None:
        raise InvalidMessage("no-value", "a tombstone: the record's value is null")
    if isinstance(data, bytes | bytearray | memoryview) and len(data) == 0:
        raise InvalidMessage("no-value", "the record's value is empty (0 bytes)")


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
