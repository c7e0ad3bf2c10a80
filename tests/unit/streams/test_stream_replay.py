"""The replay's timeline: a replay started at ``now - span_ns(trace)`` ends now, so a
replayed job's rows never lie in the future (``rankwatch replay``, the demo)."""

from __future__ import annotations

from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.streams.ops.replay import replay_batches, span_ns


def test_a_replay_started_span_before_now_ends_now() -> None:
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=5, seed=3))
    now = 1_800_000_000_000_000_000
    batches = list(replay_batches(trace, meta, "j", origin_ns=now - span_ns(trace)))
    assert abs(max(b.sent_ns for b in batches) - now) <= 1  # start and duration rounded apart
    assert min(b.sent_ns for b in batches) > now - span_ns(trace)
