"""The replay's timeline: a replay started at ``now - span_ns(trace)`` ends now, so a
replayed job's rows never lie in the future (``rankwatch replay``, the demo); and its
cut: the messages a real publisher makes of the same records on the same timeline."""

from __future__ import annotations

import pytest

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.codec import decode_ops
from rankwatch.schemas.optypes import OPTYPES
from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.streams.ops.replay import replay_batches, span_ns


def test_a_replay_started_span_before_now_ends_now() -> None:
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=5, seed=3))
    now = 1_800_000_000_000_000_000
    batches = list(replay_batches(trace, meta, "j", origin_ns=now - span_ns(trace)))
    assert abs(max(b.sent_ns for b in batches) - now) <= 1  # start and duration rounded apart
    assert min(b.sent_ns for b in batches) > now - span_ns(trace)


# -- the cut: what the hooks would send --------------------------------------------------


def _hooks_cut(trace: Trace, rank: int, time_scale: float, rule: BatchingRule) -> list:
    """The ``steps_done`` of each message a real publisher sends for ``rank``'s records,
    its rounds run at every step end and whenever held steps fall due (the thread's
    wake-ups), with the replay's timeline as its clock."""
    batches = list(replay_batches(trace, META, "j", 0, rule=BatchingRule(window_s=0.0),
                                  time_scale=time_scale))  # fmt: skip
    sent: list[bytes] = []
    rw = RankWatch(
        Identity(job="j", host="h", rank=rank, dp_rank=0, pp_rank=0),
        SinkTransport(lambda kind, value: sent.append(value) if kind == "ops" else None),
        clock=Clock(read=lambda: 0, wall=lambda: 0),
        publisher=PublisherConfig(
            batch_window_s=rule.window_s, partial_flush_s=rule.partial_s, heartbeat_s=1e9
        ),
        start=False,
    )
    mine = [b.batch for b in batches if b.batch.rank == rank]
    for batch in mine:
        ((step, _),) = batch.steps_done
        end_s = int((batch.start_ns + batch.duration_ns).max()) / 1e9
        deadline = rw.publisher.hold.deadline
        if deadline is not None and deadline <= end_s:
            rw.publisher.step_once(now=deadline)
        rw.step_begin(step)
        rest = ("seq_id", "mb_id", "chunk", "gmc", "start_ns", "duration_ns")
        for i in range(len(batch)):
            values = (int(getattr(batch, c)[i]) for c in rest)
            rw.buffer.put((step, OPTYPES[batch.optype[i]], *values))
        rw.step_end()
        rw.publisher.step_once(now=end_s)
    rw.close()
    return [decode_ops(v).steps_done for v in sent]


TRACE, META = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=9, seed=4))


@pytest.mark.parametrize("time_scale", [0.2, 1.0, 10.0])
def test_the_replay_cuts_as_the_hooks_send(time_scale: float) -> None:
    """Steps of 0.02, 0.1 or 1 s (+ gaps): several, some or one per message, as a real
    publisher cuts them."""
    rule = BatchingRule()
    batches = list(replay_batches(TRACE, META, "j", 0, rule=rule, time_scale=time_scale))
    for rank in range(4):
        replayed = [b.batch.steps_done for b in batches if b.batch.rank == rank]
        assert replayed == _hooks_cut(TRACE, rank, time_scale, rule), rank
    per_message = len(batches) / (4 * 9)
    assert per_message == 1.0 if time_scale == 10.0 else per_message < 1.0


@pytest.mark.parametrize("rule", [BatchingRule(), BatchingRule(window_s=1.0, max_records=7),
                                  BatchingRule(partial_s=0.01)])  # fmt: skip
def test_every_record_is_sent_once_and_every_step_end_counts_its_records(
    rule: BatchingRule,
) -> None:
    batches = list(replay_batches(TRACE, META, "j", 0, rule=rule, time_scale=0.2))
    assert sum(len(b.batch) for b in batches) == len(TRACE)
    assert all(len(b.batch) <= rule.max_records for b in batches)
    for rank in range(4):
        mine = [b for b in batches if b.batch.rank == rank]
        assert [b.batch.batch_seq for b in mine] == list(range(len(mine)))
        assert [b.sent_ns for b in mine] == sorted(b.sent_ns for b in mine)
        records: dict[int, int] = {}
        for b in mine:
            for step in b.batch.step.tolist():
                records[step] = records.get(step, 0) + 1
        ends = {s: n for b in mine for s, n in b.batch.steps_done}
        assert ends == records
        # a step's closing message carries at least one of its records
        for b in mine:
            assert {s for s, _ in b.batch.steps_done} <= set(b.batch.step.tolist())
    if rule.partial_s < 0.1:  # 0.02-s steps flushed in parts before they end
        assert any(not b.batch.steps_done for b in batches)
