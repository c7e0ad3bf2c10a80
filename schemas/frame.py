"""The binary frame of ops v3: op batches as little-endian column blocks.

A JSON op batch costs a parser pass over every number and a Python object per value
before numpy sees it; a frame is read with one ``np.frombuffer`` per run of columns of one
type, and the arrays it gives are views of the message's own bytes (which a worker holds
anyway until the batch is stored: the decoded batch costs no second copy).

The layout is the schema's (``ops.v3.schema.json``: its description and ``x-binary``):
magic, header length (uint32), header JSON, zero padding to ``align``, then the column
blocks in ``x-binary.order`` with nothing between them (wider types first, so each block
is aligned to its item size). This module only cuts and packs frames; the codec checks
the header against the schema and the columns against their item rules
(``rankwatch.schemas.codec``, ``columns.check_block``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from rankwatch.schemas import columns as cols
from rankwatch.schemas.bundle import (
    HEAD,
    is_frame,  # noqa: F401 (frame.is_frame: one definition)
)
from rankwatch.schemas.bundle import layout as bundle_layout
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.registry import schema, versions

FRAME_FIELDS: tuple[str, ...] = ("records", "extra_columns", "strings")
"""Header fields that say how the frame lays out its columns (not part of the records)."""

_HEAD = HEAD
"""Magic and header length: the 8 bytes every frame starts with (defined once, in the
numpy-free bundle module, which a host's relay imports)."""


@dataclass(frozen=True)
class FrameLayout:
    """How one binary version lays out its columns (read from its schema file)."""

    version: int
    magic: bytes
    align: int
    order: tuple[str, ...]
    """Every column, in block order."""
    dtypes: Mapping[str, np.dtype[Any]]
    """Column name -> its block's item type (little-endian)."""


@dataclass(frozen=True)
class Run:
    """Consecutive blocks of one type and the same item rules, read and checked as one
    (columns, records) array."""

    specs: tuple[cols.ColumnSpec, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class Plan:
    """How to read the frames of one version that carry one set of optional columns."""

    runs: tuple[Run, ...]
    record_bytes: int
    """Bytes per record over all blocks: a frame's body is exactly records x this."""


@cache
def binary_versions() -> tuple[int, ...]:
    """The ops versions that travel as frames (their schema has ``x-binary``)."""
    return tuple(v for v in versions("ops") if "x-binary" in schema("ops", v))


@cache
def layout(version: int) -> FrameLayout:
    raw = schema("ops", version)
    binary = raw["x-binary"]
    magic = binary["magic"].encode("ascii")
    if len(magic) != _HEAD.size - 4:
        raise RuntimeError(f"ops v{version}: the magic must be 4 ASCII bytes, not {magic!r}")
    codes: dict[str, str] = binary["dtypes"]
    for name, code in codes.items():
        if not code.startswith("<" if np.dtype(code).itemsize > 1 else ("<", "|")):
            raise RuntimeError(f"ops v{version}: {name} must be little-endian ('<'), not {code}")
    dtypes = {name: np.dtype(code) for name, code in codes.items()}
    specs = cols.column_specs(raw)
    for spec in specs:  # a type that cannot hold the bounds is a schema bug
        dtype = dtypes.get(spec.name)
        if dtype is None:
            raise RuntimeError(f"ops v{version}: no x-binary dtype for column {spec.name}")
        _check_holds(version, spec, dtype)
    order = tuple(binary["order"])
    if sorted(order) != sorted(spec.name for spec in specs):
        raise RuntimeError(f"ops v{version}: x-binary.order must name every column once")
    sizes = [dtypes[name].itemsize for name in order]
    if sizes != sorted(sizes, reverse=True) or max(sizes) > binary["align"]:
        raise RuntimeError(f"ops v{version}: x-binary.order must put wider types first")
    return FrameLayout(version, magic, int(binary["align"]), order, dtypes)


def _check_holds(version: int, spec: cols.ColumnSpec, dtype: np.dtype[Any]) -> None:
    if spec.enum is not None or spec.type == "string":
        most = cols.max_items(schema("ops", version))
        need = len(spec.enum) - 1 if spec.enum is not None else most
        if dtype.kind not in "iu" or np.iinfo(dtype).max < need:
            raise RuntimeError(f"ops v{version}: {spec.name} codes do not fit {dtype}")
        return
    if spec.type == "number":
        if dtype.kind != "f":
            raise RuntimeError(f"ops v{version}: {spec.name} is a number, not {dtype}")
        return
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is None or spec.minimum is None or spec.maximum is None:
        raise RuntimeError(f"ops v{version}: {spec.name} needs bounds and an integer dtype")
    if not info.min <= spec.minimum <= spec.maximum <= info.max:
        raise RuntimeError(f"ops v{version}: {dtype} cannot hold {spec.name}'s bounds")


@cache
def plan(version: int, present: frozenset[str]) -> Plan:
    """The runs of blocks of a frame carrying the columns ``present``."""
    lay = layout(version)
    specs = {spec.name: spec for spec in cols.column_specs(schema("ops", version))}
    runs: list[Run] = []
    for name in lay.order:
        if name not in present:
            continue
        spec, dtype = specs[name], lay.dtypes[name]
        last = runs[-1] if runs else None
        if last is not None and last.dtype == dtype and _same_rules(last.specs[0], spec):
            runs[-1] = Run((*last.specs, spec), dtype)
        else:
            runs.append(Run((spec,), dtype))
    record_bytes = sum(lay.dtypes[name].itemsize for name in present)
    return Plan(tuple(runs), record_bytes)


def _same_rules(a: cols.ColumnSpec, b: cols.ColumnSpec) -> bool:
    return (a.group, a.type, a.minimum, a.maximum, a.enum, a.max_length) == (
        b.group,
        b.type,
        b.minimum,
        b.maximum,
        b.enum,
        b.max_length,
    ) and a.type == "integer"


def magic() -> bytes:
    """What a frame starts with (every binary version shares it; the header names its
    version). JSON starts with ``{`` or white space, so the two never mix up."""
    found = {layout(v).magic for v in binary_versions()}
    if len(found) != 1:
        raise RuntimeError(f"binary ops versions disagree on their magic: {sorted(found)}")
    return found.pop()


def split(data: bytes | bytearray | memoryview) -> tuple[memoryview, int]:
    """(the header's bytes, where the first column block starts) of a frame."""
    size = len(data) if not isinstance(data, memoryview) else data.nbytes
    if size < _HEAD.size:
        raise InvalidMessage("malformed-frame", f"{size} bytes: shorter than the frame's head")
    _, header_len = _HEAD.unpack_from(data)
    end = _HEAD.size + header_len
    if end > size:
        raise InvalidMessage(
            "malformed-frame", f"the header claims {header_len} bytes; {size - _HEAD.size} follow"
        )
    view = memoryview(data)
    return view[_HEAD.size : end], end


def read_runs(
    data: bytes | bytearray | memoryview, start: int, records: int, how: Plan, align: int
) -> list[np.ndarray]:
    """Each run of ``how`` as a read-only (columns, records) view of ``data``; the frame
    must end exactly after the last block."""
    size = len(data) if not isinstance(data, memoryview) else data.nbytes
    at = -(-start // align) * align
    if at + records * how.record_bytes != size:
        raise InvalidMessage(
            "column-length",
            f"{records} records of {how.record_bytes} bytes after a body start at {at}"
            f" take {at + records * how.record_bytes} bytes, not {size}",
        )
    if any(bytes(memoryview(data)[start:at])):
        raise InvalidMessage("malformed-frame", f"padding bytes {start}..{at} are not zero")
    out = []
    for run in how.runs:
        k = len(run.specs)
        block = np.frombuffer(data, dtype=run.dtype, count=k * records, offset=at)
        block.flags.writeable = False  # a bytearray's view would be writable: values checked
        out.append(block.reshape(k, records))  # once must not change under the reader
        at += k * records * run.dtype.itemsize
    return out


def pack(header: bytes, blocks: Mapping[str, np.ndarray], lay: FrameLayout) -> bytes:
    """A frame of ``header`` (JSON bytes) and the column ``blocks`` (by name, already of
    their dtypes)."""
    start = _HEAD.size + len(header)
    parts = [_HEAD.pack(lay.magic, len(header)), header, bytes(-start % lay.align)]
    parts += [np.ascontiguousarray(blocks[name]).tobytes() for name in lay.order if name in blocks]
    return b"".join(parts)


def block_names(lay: FrameLayout, present: Sequence[str]) -> list[str]:
    """``present`` in block order."""
    return [name for name in lay.order if name in present]


if magic() != bundle_layout().frame_magic:  # is_frame reads the magic the bundle module read
    raise RuntimeError("schemas/bundle.py and schemas/frame.py disagree on the frame magic")
