"""The embedded runner: the worker's pipeline in-process, no Kafka.

Messages still go through the codec (encoded, then decoded and validated by the
pipeline), so the embedded default exercises exactly the contract the cluster uses.
"""

from __future__ import annotations

from collections.abc import Iterable

from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.topics import TOPICS
from rankwatch.streams.kit.output import Source
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.ops.assembly import AssembledStep
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import ReplayedBatch


def feed(
    messages: Iterable[tuple[bytes, int]],
    pipeline: Pipeline,
    sink: TableSink,
    steps: list[AssembledStep] | None = None,
) -> int:
    """Feed ``(message, sent_ns)`` pairs (send order) through ``pipeline`` into ``sink``
    and flush both at the end; return the messages fed. The assembled steps are appended
    to ``steps`` when given.

    The messages' own send times are the clock, so grace periods behave as they would
    have live.
    """
    source = Source(topic=TOPICS["ops"])
    fed = 0
    now_ns = 0
    for value, now_ns in messages:
        out = pipeline.on_message(value, source, now_ns)
        out.extend(pipeline.on_tick(now_ns))
        sink.write(out)
        if steps is not None:
            steps += out.steps
        fed += 1
    out = pipeline.flush(now_ns)
    sink.write(out)
    sink.flush()
    if steps is not None:
        steps += out.steps
    return fed


def run_embedded(batches: Iterable[ReplayedBatch], pipeline: Pipeline, sink: TableSink) -> int:
    """Feed replayed batches, encoded as the hooks send them, through ``pipeline`` into
    ``sink``; return messages fed."""
    return feed(((encode_ops(b.batch), b.sent_ns) for b in batches), pipeline, sink)
