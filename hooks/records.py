"""Op records and the messages the hooks send, written with orjson alone (no numpy).

A record is a plain tuple, cheap to build on the training thread::

    (step, optype, seq_id, mb_id, chunk, gmc, start_ns, duration_ns)

:func:`encode_ops` writes the same JSON document as ``rankwatch.schemas.codec.encode_ops``
(columns as lists), and a unit test decodes what it writes with ``decode_ops``.
:func:`encode_heartbeat` writes a ``heartbeats`` v1 message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from rankwatch.hooks.identity import Identity
from rankwatch.schemas.optypes import COMPUTE, OPTYPES

OPS_VERSION = 2
"""Written as v2 (v1 plus the optional ``rank_steps``), which v2 consumers read."""
HEARTBEATS_VERSION = 1
MAX_RECORDS_PER_BATCH = 100_000
"""The schema's maxItems per column."""
MAX_STEPS_DONE = 1024

_COLUMNS = ("step", "optype", "seq_id", "mb_id", "chunk", "gmc", "start_ns", "duration_ns")
KNOWN_OPTYPES = frozenset(OPTYPES)


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
    summaries (``rank_steps``, see ``signals.py``) of the steps it closes."""
    if not 1 <= len(records) <= MAX_RECORDS_PER_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_RECORDS_PER_BATCH} records, not {len(records)}")
    columns = dict(zip(_COLUMNS, (list(c) for c in zip(*records, strict=True)), strict=True))
    message: dict[str, Any] = {
        "schema": "ops",
        "version": OPS_VERSION,
        **identity.header(),
        "batch_seq": batch_seq,
        "sent_ns": sent_ns,
        "ops": columns,
    }
    if steps_done:
        message["steps_done"] = [{"step": s, "n_ops": n} for s, n in steps_done]
    if rank_steps:
        message["rank_steps"] = list(rank_steps)
    return orjson.dumps(message)


def encode_heartbeat(
    identity: Identity,
    *,
    sent_ns: int,
    step: int,
    pid: int,
    in_flight: InFlight | None,
    last_done: LastDone | None,
    finished: bool = False,
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
    return orjson.dumps(message)
