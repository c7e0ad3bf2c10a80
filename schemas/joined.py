"""Joined bundles: a host's frames of one job as one message with one set of column
blocks (the ops schema's ``x-joined``).

A bundle (``bundle.py``) keeps each member a whole frame, so a consumer reads and
checks every column once per member: about 40 µs of Python and numpy calls a member,
whatever its size (docs/contracts.md, "Bundles"). Joined, the members keep their own
headers but share the blocks, so the columns are read and checked once for all of
them and each member's are slices of those.

The layout (the schema's ``x-joined`` and its description): a magic of its own, the
member count (uint32, little-endian), each member's header length (uint32 each), the
headers back to back, zero padding to ``align`` bytes from the start, then one block
per column sent in ``x-binary.order``, the members' items in member order. This module
cuts and joins the envelope with the standard library alone (a host's relay joins
without numpy); the codec checks the members (``codec.decode_ops_members``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from rankwatch.schemas import bundle
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.registry import schema, versions


@dataclass(frozen=True)
class JoinedLayout:
    magic: bytes
    align: int
    max_members: int
    version: int
    """The one frame version whose members may be joined."""
    order: tuple[str, ...]
    """Every column, in block order."""
    itemsize: Mapping[str, int]
    required: frozenset[str]
    """The columns every frame carries (the others only when ``extra_columns`` names them)."""
    optional: tuple[str, ...]
    """The columns ``extra_columns`` may name, in the order it must name them."""
    max_records: int


@cache
def layout() -> JoinedLayout:
    """The joined layout, from the one binary ops version whose schema has ``x-joined``."""
    found = [v for v in versions("ops") if "x-joined" in schema("ops", v)]
    if len(found) != 1:
        raise RuntimeError(f"x-joined must be in exactly one ops version, not {found}")
    raw = schema("ops", found[0])
    joined, binary = raw["x-joined"], raw["x-binary"]
    magic = joined["magic"].encode("ascii")
    if len(magic) != 4 or magic in (bundle.layout().magic, bundle.layout().frame_magic):
        raise RuntimeError(f"x-joined: 4 ASCII bytes unlike a frame's or a bundle's, not {magic!r}")
    if int(joined["align"]) != int(binary["align"]):
        raise RuntimeError("x-joined must align as x-binary does: its blocks are the frame's")
    props = raw["properties"]
    return JoinedLayout(
        magic=magic,
        align=int(joined["align"]),
        max_members=int(joined["max_members"]),
        version=found[0],
        order=tuple(binary["order"]),
        itemsize={name: int(code[2:]) for name, code in binary["dtypes"].items()},
        required=frozenset(props["ops"]["properties"]),
        optional=tuple(props["extra"]["properties"]),
        max_records=int(props["records"]["maximum"]),
    )


def is_joined(data: bytes | bytearray | memoryview) -> bool:
    return data[:4] == _LAYOUT.magic


def split(data: bytes | memoryview) -> tuple[list[memoryview], int]:
    """(each member's header bytes, where the first block starts) of a joined bundle; an
    envelope that is wrong (count, lengths, padding) is refused whole. The blocks are
    the codec's to read: it needs the headers' record counts."""
    view = memoryview(data)
    size = view.nbytes
    lengths, at = bundle.member_lengths(view, _LAYOUT.max_members, "joined bundle")
    heads = []
    for length in lengths:
        heads.append(view[at : at + length])
        at += length
    start = _padded(at)
    if start > size:
        raise InvalidMessage("malformed-frame", f"the headers take {at} bytes of {size}")
    if any(view[at:start]):
        raise InvalidMessage("malformed-frame", "a joined bundle's padding bytes are not zero")
    return heads, start


def join(frames: Sequence[bytes]) -> bytes | None:
    """One joined bundle of ``frames``, or None when they cannot be joined whole: fewer
    than two, one whose header or size is not a frame's that the envelope could carry,
    members of another version or with other ``extra_columns``. A relay then sends a
    bundle, and the worker refuses the faulty member alone, as it would have."""
    if not 2 <= len(frames) <= _LAYOUT.max_members:
        return None
    cuts: list[_Cut] = []
    for data in frames:
        cut = _cut(data)
        if cut is None or cut[1] != (cuts[0][1] if cuts else cut[1]):
            return None  # not a frame the envelope can carry, or unlike the first
        cuts.append(cut)
    heads = [head for head, _, _ in cuts]
    parts: list[bytes | memoryview] = [
        bundle.HEAD.pack(_LAYOUT.magic, len(frames)),
        struct.pack(f"<{len(heads)}I", *map(len, heads)),
        *heads,
    ]
    size = sum(map(len, parts))
    parts.append(bytes(_padded(size) - size))
    for blocks in zip(*(blocks for _, _, blocks in cuts), strict=True):
        parts += blocks  # column by column, each member's items in member order
    return b"".join(parts)


def message(frames: Sequence[bytes], join_them: bool = True) -> bytes:
    """What a relay sends for ``frames`` of one job: one frame as it is; several joined
    when ``join_them`` and they can be, else a bundle."""
    if len(frames) == 1:
        return frames[0]
    return (join(frames) if join_them else None) or bundle.pack(frames)


_Cut = tuple[memoryview, tuple[str, ...], list[memoryview]]


def _cut(data: bytes) -> _Cut | None:
    """(header bytes, extra_columns, the blocks in order) of a frame the envelope can carry."""
    if not bundle.is_frame(data) or len(data) < bundle.HEAD.size:
        return None
    view = memoryview(data)
    _, header_len = bundle.HEAD.unpack_from(view)
    end = bundle.HEAD.size + header_len
    try:
        header = orjson.loads(view[bundle.HEAD.size : end])
    except orjson.JSONDecodeError:
        return None
    shape = _shape(header)
    start = _padded(end)
    if shape is None or any(view[end:start]):
        return None
    extras, records = shape
    blocks, at = [], start
    for name in _LAYOUT.order:
        if name in _LAYOUT.required or name in extras:
            blocks.append(view[at : at + records * _LAYOUT.itemsize[name]])
            at += records * _LAYOUT.itemsize[name]
    if at != len(data):
        return None
    return view[bundle.HEAD.size : end], extras, blocks


def _shape(header: Any) -> tuple[tuple[str, ...], int] | None:
    """(extra_columns, records) of a member header the envelope can carry, else None."""
    if not isinstance(header, dict) or header.get("version") != _LAYOUT.version:
        return None
    records, extras = header.get("records"), header.get("extra_columns", [])
    if type(records) is not int or not 1 <= records <= _LAYOUT.max_records:
        return None
    if not isinstance(extras, list) or extras != [n for n in _LAYOUT.optional if n in extras]:
        return None  # not names of optional columns, each once, in their order
    return tuple(extras), records


def shape(header: Any, i: int) -> tuple[tuple[str, ...], int]:
    """(extra_columns, records) of member ``i``'s parsed header; raises
    :class:`InvalidMessage` when the envelope cannot be cut by it."""
    got = _shape(header)
    if got is None:
        raise InvalidMessage(
            "malformed-frame",
            f"joined member {i}: its header needs version {_LAYOUT.version}, records"
            f" (1 to {_LAYOUT.max_records}) and extra_columns (in schema order)",
        )
    return got


def _padded(at: int) -> int:
    return -(-at // _LAYOUT.align) * _LAYOUT.align


_LAYOUT = layout()
