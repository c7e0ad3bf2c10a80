"""The embedded runner: the worker's pipeline in-process, no Kafka.

Messages still go through the codec (encoded, then decoded and validated by the
pipeline), so the embedded default exercises exactly the contract the cluster uses.
"""

from __future__ import annotations

from collections.abc import Iterable

from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.topics import TOPICS
from rankwatch.streams.pipeline import Pipeline, Source
from rankwatch.streams.replay import ReplayedBatch
from rankwatch.streams.sink import TableSink


def run_embedded(batches: Iterable[ReplayedBatch], pipeline: Pipeline, sink: TableSink) -> int:
    """Feed replayed batches through ``pipeline`` into ``sink``; return messages fed.

    The replay's own timeline is the clock, so grace periods behave as they would have
    live.
    """
    source = Source(topic=TOPICS["ops"])
    fed = 0
    now_ns = 0
    for item in batches:
        now_ns = item.sent_ns
        sink.write(pipeline.on_message(encode_ops(item.batch), source, now_ns))
        sink.write(pipeline.on_tick(now_ns))
        fed += 1
    sink.write(pipeline.flush(now_ns))
    sink.flush()
    return fed
