"""A small generated job as op-batch messages, for tests of the worker's state."""

from __future__ import annotations

import time

from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.streams.ops.replay import replay_batches


def small_job(job: str = "j") -> list[OpBatch]:
    """DP 2 x PP 2, 6 steps: one batch per rank and step, in step order (4 per step)."""
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=6, seed=1))
    one_per_step = BatchingRule(window_s=0.0)
    return [b.batch for b in replay_batches(trace, meta, job, time.time_ns(), rule=one_per_step)]
