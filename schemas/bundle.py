"""Bundles: several ops frames of one job in one message (the ops schema's ``x-bundle``).

The layout (the schema's ``x-bundle`` and its description): a magic of its own, the
member count (uint32, little-endian), each member's length (uint32 each), zero padding
to ``align`` bytes from the start, then the members, each a whole frame followed by
zero padding to ``align`` (so a member's columns stay aligned, and decode as views of
the message). This module only cuts and packs the envelope, with the standard library
alone: a host's relay (``rankwatch.agent.relay``) packs bundles without numpy. The
codec decodes the members (``codec.decode_ops_members``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import orjson

from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.registry import schema, versions

HEAD = struct.Struct("<4sI")
"""A frame's magic and header length; a bundle's magic and member count (the frame
module reads frames' heads with this too: one definition, without numpy)."""


@dataclass(frozen=True)
class BundleLayout:
    magic: bytes
    align: int
    max_members: int
    frame_magic: bytes
    """What every member starts with (a frame's magic)."""


@cache
def layout() -> BundleLayout:
    """The bundle layout, from the binary ops versions' schemas (which must agree)."""
    binary = [schema("ops", v) for v in versions("ops") if "x-binary" in schema("ops", v)]
    bundles = {
        (b["magic"], int(b["align"]), int(b["max_members"]))
        for raw in binary
        if (b := raw.get("x-bundle")) is not None
    }
    frames = {raw["x-binary"]["magic"] for raw in binary}
    if len(bundles) != 1 or len(frames) != 1:
        raise RuntimeError(f"binary ops versions disagree: x-bundle {bundles}, frames {frames}")
    (magic_text, align, most), frame_magic = bundles.pop(), frames.pop().encode("ascii")
    magic = magic_text.encode("ascii")
    if len(magic) != 4 or magic == frame_magic:
        raise RuntimeError(f"x-bundle: 4 ASCII bytes unlike a frame's magic, not {magic_text}")
    return BundleLayout(magic, align, most, frame_magic)


def is_bundle(data: bytes | bytearray | memoryview) -> bool:
    return data[:4] == _LAYOUT.magic


def is_frame(data: bytes | bytearray | memoryview) -> bool:
    return data[:4] == _LAYOUT.frame_magic


def split(data: bytes | memoryview) -> list[memoryview]:
    """The members of a bundle, as views of ``data``; a bundle whose envelope is wrong
    (count, lengths, padding, a member that is not a frame) is refused whole."""
    view = memoryview(data)
    size = view.nbytes
    lengths, lengths_end = member_lengths(view, _LAYOUT.max_members, "bundle")
    at = _padded(lengths_end)
    pads = [(lengths_end, at)]
    members = []
    for length in lengths:
        members.append(view[at : at + length])
        pads.append((at + length, _padded(at + length)))
        at = pads[-1][1]
    if at != size:
        raise InvalidMessage(
            "malformed-frame", f"the members and their padding take {at} bytes, not {size}"
        )
    if any(any(view[lo:hi]) for lo, hi in pads):
        raise InvalidMessage("malformed-frame", "a bundle's padding bytes are not zero")
    for i, member in enumerate(members):
        if not is_frame(member):
            raise InvalidMessage("malformed-frame", f"bundle member {i} is not a frame")
    return members


def member_lengths(view: memoryview, most: int, what: str) -> tuple[tuple[int, ...], int]:
    """(the lengths, where they end) of an envelope that starts with a magic, a member
    count (1 to ``most``) and a uint32 length a member (a bundle's, a joined bundle's)."""
    size = view.nbytes
    if size < HEAD.size:
        raise InvalidMessage("malformed-frame", f"{size} bytes: shorter than a {what}'s head")
    _, count = HEAD.unpack_from(view)
    if not 1 <= count <= most:
        raise InvalidMessage("malformed-frame", f"a {what} of {count} members (1 to {most})")
    end = HEAD.size + 4 * count
    if end > size:
        raise InvalidMessage("malformed-frame", f"{count} member lengths do not fit {size} bytes")
    return struct.unpack_from(f"<{count}I", view, HEAD.size), end


def pack(frames: Sequence[bytes]) -> bytes:
    """One bundle of ``frames`` (whole frames: not checked here)."""
    if not 1 <= len(frames) <= _LAYOUT.max_members:
        raise ValueError(f"a bundle holds 1 to {_LAYOUT.max_members} frames, not {len(frames)}")
    head = HEAD.pack(_LAYOUT.magic, len(frames)) + struct.pack(
        f"<{len(frames)}I", *map(len, frames)
    )
    parts = [head, bytes(_padded(len(head)) - len(head))]
    for f in frames:
        parts += [f, bytes(_padded(len(f)) - len(f))]
    return b"".join(parts)


def frame_job(data: bytes, max_chars: int = 256) -> str | None:
    """The job a frame's header names (None: not a frame, or no readable job name). A
    relay reads only this; the worker checks the rest."""
    if not is_frame(data) or len(data) < HEAD.size:
        return None
    _, header_len = HEAD.unpack_from(data)
    try:
        header = orjson.loads(data[HEAD.size : HEAD.size + header_len])
    except orjson.JSONDecodeError:
        return None
    job = header.get("job") if isinstance(header, dict) else None
    return job if isinstance(job, str) and 0 < len(job) <= max_chars else None


def _padded(at: int) -> int:
    return -(-at // _LAYOUT.align) * _LAYOUT.align


_LAYOUT = layout()
