"""A small generated job as op-batch messages, for tests of the worker's state; frames
with chosen faults, for tests of the decoder."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson

from rankwatch.schemas import frame
from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.codec import decode_ops, encode_ops
from rankwatch.schemas.examples import example_batch
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.streams.ops.replay import replay_batches


def small_job(job: str = "j") -> list[OpBatch]:
    """DP 2 x PP 2, 6 steps: one batch per rank and step, in step order (4 per step)."""
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=6, seed=1))
    one_per_step = BatchingRule(window_s=0.0)
    return [b.batch for b in replay_batches(trace, meta, job, time.time_ns(), rule=one_per_step)]


def frame_with(rank: int, header: dict[str, Any] | None = None, **column: list[int]) -> bytes:
    """A frame of ``example_batch(3, rank=rank)`` with header fields or columns replaced,
    unchecked (what a faulty producer could send)."""
    good = encode_ops(example_batch(3, rank=rank))
    head, _ = frame.split(good)
    fields = {**orjson.loads(head), **(header or {})}
    lay = frame.layout(3)
    batch = decode_ops(good)
    blocks = {
        name: np.asarray(column.get(name, getattr(batch, name))).astype(lay.dtypes[name])
        for name in batch.columns()
    }
    return frame.pack(orjson.dumps(fields), blocks, lay)
