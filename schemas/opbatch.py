"""``OpBatch``: one rank's op records as numpy columns, the typed form of an ops message."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

from rankwatch.schemas.optypes import OPTYPES

HEADER_FIELDS: tuple[str, ...] = (
    "job",
    "host",
    "rank",
    "dp_rank",
    "pp_rank",
    "tp_rank",
    "cp_rank",
    "dp_size",
    "pp_size",
    "batch_seq",
    "sent_ns",
)
"""Scalar fields of the message (a unit test checks them against the schema)."""


@dataclass(frozen=True, eq=False)
class OpBatch:
    """Header fields, then equal-length columns; ``optype`` holds int8 codes into OPTYPES.

    Times are ns on the aligned wall clock. ``mb_id``, ``chunk`` and ``gmc`` are -1 for
    ops that are not compute ops. The optional columns are None when not sent.
    Build one with the codec (``decode_ops``) or directly; ``encode_ops`` checks it.
    """

    job: str
    host: str
    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    cp_rank: int
    dp_size: int
    pp_size: int
    batch_seq: int
    sent_ns: int
    step: np.ndarray  # int64
    optype: np.ndarray  # int8 codes into OPTYPES
    seq_id: np.ndarray  # int64
    mb_id: np.ndarray  # int64
    chunk: np.ndarray  # int64
    gmc: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    duration_ns: np.ndarray  # int64
    bytes: np.ndarray | None = field(default=None)  # int64
    flops: np.ndarray | None = field(default=None)  # float64
    stream: np.ndarray | None = field(default=None)  # object (str)
    steps_done: tuple[tuple[int, int], ...] = ()
    """(step, n_ops) of the steps this rank finished in this batch (see the schema)."""
    rank_steps: tuple[dict[str, Any], ...] = ()
    """Per-step summaries of ops v2 (``rank_steps``): the slowdown signals' inputs."""

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @cached_property
    def step_span(self) -> tuple[int, int]:
        """Lowest and highest step of the records: worked out once per batch (the
        identity check, the late-step test and the assembly's grouping all ask, and a
        bundle's small members paid two numpy reductions for each)."""
        return int(self.step.min()), int(self.step.max())

    @property
    def delivery_key(self) -> tuple[int, int, int]:
        """(rank, batch_seq, first step): the same key means the same batch delivered
        again. ``batch_seq`` alone is not enough: a training process restarted under the
        same job id counts its batches from 0 again, but for steps it had not reached."""
        return (self.rank, self.batch_seq, int(self.step[0]))

    @property
    def optype_names(self) -> np.ndarray:
        """Op types as strings."""
        return np.asarray(OPTYPES, dtype=object)[self.optype]

    def columns(self) -> dict[str, np.ndarray]:
        """The columns that are present, by name (header fields left out)."""
        out = {}
        for name in COLUMN_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


COLUMN_NAMES: tuple[str, ...] = tuple(
    f.name
    for f in fields(OpBatch)
    if f.name not in HEADER_FIELDS and f.name not in ("steps_done", "rank_steps")
)
"""Column fields in declaration order (``dataclasses.fields`` per call was most of the
cost of :meth:`OpBatch.columns`, which the raw-ops insert calls once per batch)."""
