"""Op records and the messages the hooks send, written without numpy.

A record is a plain tuple, cheap to build on the training thread::

    (step, optype, seq_id, mb_id, chunk, gmc, start_ns, duration_ns)

:func:`encode_ops` writes an ops v3 frame (``ops.v3.schema.json``: a JSON header, then
the columns as little-endian blocks, each one ``array.array`` conversion), the same
bytes as ``rankwatch.schemas.codec.encode_ops``; a batch a frame cannot carry (a value
beyond its column's type) goes as ops v2 JSON instead, which the worker refuses with the
reason, so a bad value is a counted dead letter, never a crash in training.
:func:`encode_ops_json` writes v2. Unit tests decode what both write with ``decode_ops``.
:func:`encode_heartbeat` writes a ``heartbeats`` v1 message.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from rankwatch.hooks.identity import Identity
from rankwatch.schemas.optypes import CODE, COMPUTE, OPTYPES
from rankwatch.schemas.registry import schema

OPS_VERSION = 3
"""Written as v3 frames (v2 as the fallback), which workers since v3 read."""
JSON_VERSION = 2
HEARTBEATS_VERSION = 1
MAX_RECORDS_PER_BATCH = 100_000
"""The schema's maxItems per column."""
MAX_STEPS_DONE = 1024

_COLUMNS = ("step", "optype", "seq_id", "mb_id", "chunk", "gmc", "start_ns", "duration_ns")
KNOWN_OPTYPES = frozenset(OPTYPES)
_TYPECODES = {"<i8": "q", "<i4": "i", "<i2": "h", "|i1": "b", "|u1": "B", "<u4": "I", "<f8": "d"}


def _frame_plan() -> tuple[bytes, int, tuple[tuple[int, str], ...]]:
    """(magic, alignment, (record field, array typecode) per block in frame order) of
    ops v3, read from its schema."""
    binary = schema("ops", OPS_VERSION)["x-binary"]
    blocks = []
    for name in binary["order"]:
        if name in _COLUMNS:
            code = _TYPECODES[binary["dtypes"][name]]
            if array(code).itemsize != int(binary["dtypes"][name][2:]):
                raise RuntimeError(f"array typecode {code!r} is not {binary['dtypes'][name]} here")
            blocks.append((_COLUMNS.index(name), code))
    return binary["magic"].encode("ascii"), int(binary["align"]), tuple(blocks)


_MAGIC, _ALIGN, _BLOCKS = _frame_plan()
_OPTYPE = _COLUMNS.index("optype")
_SWAP = sys.byteorder != "little"


class OpRecord(NamedTuple):
    step: int
    optype: str
    seq_id: int
    mb_id: int
    chunk: int
    gmc: int
    start_ns: int
    duration_ns: int


class InFlight(NamedTuple):
    optype: str
    seq_id: int
    mb_id: int
    since_ns: int


class Phase(NamedTuple):
    """A long phase outside training steps (heartbeats schema, ``phase``)."""

    name: str
    since_ns: int
    bound_s: float


class LastDone(NamedTuple):
    optype: str
    seq_id: int
    step: int
    end_ns: int


def check_optype(optype: str, mb_id: int) -> None:
    """Refuse an unknown op type, or a microbatch on a non-compute op, at the call site."""
    if optype not in KNOWN_OPTYPES:
        raise ValueError(f"unknown op type {optype!r}; known: {', '.join(OPTYPES)}")
    if mb_id != -1 and optype not in COMPUTE:
        raise ValueError(f"{optype} is not a compute op: mb_id/chunk must be -1")


def encode_ops(
    identity: Identity,
    records: Sequence[tuple[int, str, int, int, int, int, int, int]],
    *,
    batch_seq: int,
    sent_ns: int,
    steps_done: Sequence[tuple[int, int]] = (),
    rank_steps: Sequence[dict[str, Any]] = (),
) -> bytes:
    """One ``ops`` message of ``records`` (1 to 100,000 of them), with the step
    summaries (``rank_steps``, see ``signals.py``) of the steps it closes: a v3 frame, or
    v2 JSON when a value does not fit its column's type in the frame."""
    if not 1 <= len(records) <= MAX_RECORDS_PER_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_RECORDS_PER_BATCH} records, not {len(records)}")
    columns = list(zip(*records, strict=True))
    try:
        blocks = [_block(columns, field, code) for field, code in _BLOCKS]
    except (OverflowError, TypeError, KeyError):
        return _json(identity, columns, batch_seq, sent_ns, steps_done, rank_steps)
    header = _header(identity, batch_seq, sent_ns, steps_done, rank_steps, len(records))
    head = orjson.dumps(header)
    pad = bytes(-(8 + len(head)) % _ALIGN)
    return b"".join([struct.pack("<4sI", _MAGIC, len(head)), head, pad, *blocks])


def _block(columns: list[tuple[Any, ...]], field: int, code: str) -> bytes | array[Any]:
    values = columns[field]
    if field == _OPTYPE:
        return bytes(map(CODE.__getitem__, values))  # one byte per code, as the schema says
    block = array(code, values)
    if _SWAP:
        block.byteswap()
    return block


def encode_ops_json(
    identity: Identity,
    records: Sequence[tuple[int, str, int, int, int, int, int, int]],
    *,
    batch_seq: int,
    sent_ns: int,
    steps_done: Sequence[tuple[int, int]] = (),
    rank_steps: Sequence[dict[str, Any]] = (),
) -> bytes:
    """The same batch as ops v2 JSON (columns as lists)."""
    if not 1 <= len(records) <= MAX_RECORDS_PER_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_RECORDS_PER_BATCH} records, not {len(records)}")
    columns = list(zip(*records, strict=True))
    return _json(identity, columns, batch_seq, sent_ns, steps_done, rank_steps)


def _json(
    identity: Identity,
    columns: list[tuple[Any, ...]],
    batch_seq: int,
    sent_ns: int,
    steps_done: Sequence[tuple[int, int]],
    rank_steps: Sequence[dict[str, Any]],
) -> bytes:
    message = _header(identity, batch_seq, sent_ns, steps_done, rank_steps)
    message["ops"] = dict(zip(_COLUMNS, (list(c) for c in columns), strict=True))
    return orjson.dumps(message)


def _header(
    identity: Identity,
    batch_seq: int,
    sent_ns: int,
    steps_done: Sequence[tuple[int, int]],
    rank_steps: Sequence[dict[str, Any]],
    records: int | None = None,
) -> dict[str, Any]:
    """The header of a v3 frame (with ``records``) or of a v2 document (without)."""
    message: dict[str, Any] = {
        "schema": "ops",
        "version": JSON_VERSION if records is None else OPS_VERSION,
        **identity.header(),
        "batch_seq": batch_seq,
        "sent_ns": sent_ns,
    }
    if records is not None:
        message["records"] = records
    if steps_done:
        message["steps_done"] = [{"step": s, "n_ops": n} for s, n in steps_done]
    if rank_steps:
        message["rank_steps"] = list(rank_steps)
    return message


def encode_heartbeat(
    identity: Identity,
    *,
    sent_ns: int,
    step: int,
    pid: int,
    in_flight: InFlight | None,
    last_done: LastDone | None,
    finished: bool = False,
    phase: Phase | None = None,
) -> bytes:
    """One ``heartbeats`` message: where this rank is now; ``finished`` on a clean exit
    (the hang detector then expects no more heartbeats)."""
    message: dict[str, Any] = {
        "schema": "heartbeats",
        "version": HEARTBEATS_VERSION,
        "job": identity.job,
        "host": identity.host,
        "rank": identity.rank,
        "dp_rank": identity.dp_rank,
        "pp_rank": identity.pp_rank,
        "tp_rank": identity.tp_rank,
        "cp_rank": identity.cp_rank,
        "sent_ns": sent_ns,
        "step": step,
        "pid": pid,
        "in_flight": None if in_flight is None else in_flight._asdict(),
        "last_done": None if last_done is None else last_done._asdict(),
    }
    if finished:
        message["state"] = "finished"
    if phase is not None:
        message["phase"] = phase._asdict()
    return orjson.dumps(message)
