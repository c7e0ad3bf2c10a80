"""Step assembly: completeness, partial steps, duplicates, late and peer batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.optypes import CODE
from rankwatch.streams.ops.assembly import AssemblyConfig, StepAssembler

S = 1_000_000_000  # ns per second


def make_batch(
    ops: list[tuple[int, str, int, float, float]],
    *,
    dp: int = 0,
    pp: int = 0,
    seq: int = 0,
    tp: int = 0,
    layout: tuple[int, int] = (1, 2),
    steps_done: list[tuple[int, int]] | None = None,
    job: str = "j",
) -> OpBatch:
    """ops: (step, optype, seq_id, start_s, duration_s)."""
    rank = (dp * layout[1] + pp) * 2 + tp
    return OpBatch(
        job=job,
        host="h0",
        rank=rank,
        dp_rank=dp,
        pp_rank=pp,
        tp_rank=tp,
        cp_rank=0,
        batch_seq=seq,
        sent_ns=0,
        dp_size=layout[0],
        pp_size=layout[1],
        step=np.array([o[0] for o in ops], dtype=np.int64),
        optype=np.array([CODE[o[1]] for o in ops], dtype=np.int8),
        seq_id=np.array([o[2] for o in ops], dtype=np.int64),
        mb_id=np.full(len(ops), -1, dtype=np.int64),
        chunk=np.full(len(ops), -1, dtype=np.int64),
        gmc=np.full(len(ops), -1, dtype=np.int64),
        start_ns=np.array([round(o[3] * S) for o in ops], dtype=np.int64),
        duration_ns=np.array([round(o[4] * S) for o in ops], dtype=np.int64),
        steps_done=tuple(steps_done or ()),
    )


def worker_step(step: int, pp: int, t0: float) -> list[tuple[int, str, int, float, float]]:
    return [
        (step, "forward-compute", 0, t0 + 0.0, 1.0),
        (step, "backward-compute", 0, t0 + 2.0, 2.0),
        (step, "optimizer", 0, t0 + 5.0 + pp, 0.5),
    ]


def test_step_completes_when_every_worker_ended_it() -> None:
    asm = StepAssembler()
    assert asm.add(make_batch(worker_step(7, 0, 100.0), pp=0), now_ns=0) == []
    closed = asm.add(make_batch(worker_step(7, 1, 100.0), pp=1), now_ns=1)
    assert len(closed) == 1
    step = closed[0]
    assert (step.job, step.step, step.partial, step.missing_workers) == ("j", 7, False, ())
    assert step.n_ops == 6
    assert step.start_ns == 100 * S
    assert step.t_base == pytest.approx(6.5)  # stage 1's optimizer ends at 100 + 6 + 0.5
    assert asm.counters.steps_complete == 1


def test_arrival_order_does_not_change_the_step() -> None:
    batches = [
        make_batch(worker_step(3, p, 10.0), pp=p, dp=d, layout=(2, 2))
        for d in (0, 1)
        for p in (0, 1)
    ]
    results = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        asm = StepAssembler()
        closed = [s for i in order for s in asm.add(batches[i], now_ns=0)]
        assert len(closed) == 1
        t = closed[0].trace
        key = np.lexsort((t.seq_id, t.optype, t.rank))
        results.append((closed[0].t_base, t.rank[key], t.start_ts[key], t.duration[key]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1:], results[1][1:], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shuffled", [False, True])
def test_several_steps_in_one_batch_give_the_steps_one_batch_each_gives(shuffled: bool) -> None:
    """The hooks put short steps in one message, in step order (their records are then
    views of the message); any order of records gives the same steps."""

    def ops_of(step: int, pp: int) -> list[tuple[int, str, int, float, float]]:
        return [(s, o, q, t, d * step) for s, o, q, t, d in worker_step(step, pp, 10.0 * step)]

    one = StepAssembler()
    expected = []
    for s in (1, 2, 3):
        for p in (0, 1):
            expected += one.add(make_batch(ops_of(s, p), pp=p, seq=s, steps_done=[(s, 3)]), 0)
    together = StepAssembler()
    closed = []
    for p in (0, 1):
        ops = [op for s in (1, 2, 3) for op in ops_of(s, p)]
        if shuffled:
            ops = ops[::-1]
        done = [(s, 3) for s in (1, 2, 3)]
        closed += together.add(make_batch(ops, pp=p, steps_done=done), now_ns=0)
    assert [st.step for st in closed] == [st.step for st in expected] == [1, 2, 3]
    assert len({st.t_base for st in closed}) == 3  # the steps differ
    for got, want in zip(closed, expected, strict=True):
        assert (got.start_ns, got.t_base, got.n_ops) == (want.start_ns, want.t_base, want.n_ops)
        for name in ("step", "rank", "optype", "seq_id", "start_ts", "duration"):
            np.testing.assert_array_equal(getattr(got.trace, name), getattr(want.trace, name))


def test_grace_period_closes_an_incomplete_step_as_partial_naming_the_missing() -> None:
    """Stage 1 never sends step 1 while stage 0 goes on: once the job has gone on for
    the grace (30 s of its own messages) after the step's first batch, the step closes
    partial, naming the missing worker."""
    asm = StepAssembler(AssemblyConfig(grace_s=30))
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    asm.add(make_batch(worker_step(2, 0, 9.0), pp=0, seq=1), now_ns=29 * S)
    assert asm.expire(now_ns=31 * S) == []
    asm.add(make_batch(worker_step(3, 0, 18.0), pp=0, seq=2), now_ns=30 * S)
    (closed,) = asm.expire(now_ns=31 * S)
    assert closed.step == 1 and closed.partial
    assert closed.missing_workers == ((0, 1),)
    assert asm.counters.steps_partial == 1


def test_a_silent_jobs_steps_wait_for_the_quiet_grace_not_the_grace() -> None:
    """The whole job falls silent (its records held in spools by a broker outage, or its
    ranks gone): its open step waits ``quiet_grace_s``, not ``grace_s``, counted from
    the job's last message."""
    asm = StepAssembler(AssemblyConfig(grace_s=30, quiet_grace_s=600))
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    asm.add(make_batch(worker_step(2, 0, 9.0), pp=0, seq=1), now_ns=10 * S)
    assert asm.expire(now_ns=609 * S) == []
    closed = asm.expire(now_ns=610 * S)
    assert [c.step for c in closed] == [1, 2] and all(c.partial for c in closed)


def test_time_the_worker_could_not_read_does_not_count_against_a_step() -> None:
    """A broker outage (or a paused worker) of 50 s: the grace of the open step starts
    again when the worker reads again, so the stage whose records waited in a spool
    completes it; a step with a worker really gone still closes a grace later."""
    asm = StepAssembler(AssemblyConfig(grace_s=30))
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    asm.add(make_batch(worker_step(2, 0, 9.0), pp=0, seq=1), now_ns=40 * S)  # drained
    assert asm.restart_grace(now_ns=50 * S) == 2
    assert asm.expire(now_ns=51 * S) == []
    (closed,) = asm.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=52 * S)
    assert not closed.partial and asm.counters.late_batches == 0
    asm.add(make_batch(worker_step(3, 0, 18.0), pp=0, seq=2), now_ns=79 * S)
    assert asm.expire(now_ns=80 * S) == []
    asm.add(make_batch(worker_step(4, 0, 27.0), pp=0, seq=3), now_ns=81 * S)
    (gone,) = asm.expire(now_ns=81 * S)
    assert gone.step == 2 and gone.partial and gone.missing_workers == ((0, 1),)


def test_late_batch_for_a_closed_step_is_counted_and_dropped() -> None:
    asm = StepAssembler(AssemblyConfig(grace_s=1, quiet_grace_s=1))
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    asm.expire(now_ns=2 * S)
    assert asm.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=3 * S) == []
    assert asm.counters.late_batches == 1
    assert asm.counters.late_records == 3
    assert list(asm.open_steps()) == []


def test_a_repeated_batch_is_skipped_and_repeated_records_collapse() -> None:
    asm = StepAssembler()
    first = make_batch(worker_step(1, 0, 0.0)[:2], pp=0, seq=0)
    asm.add(first, now_ns=0)
    asm.add(first, now_ns=0)  # a hook retried the same batch
    assert asm.counters.duplicate_batches == 1
    # a different batch that repeats one record (same rank, optype, seq_id)
    asm.add(make_batch(worker_step(1, 0, 0.0)[1:], pp=0, seq=1), now_ns=0)
    closed = asm.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=0)
    assert len(closed) == 1
    assert closed[0].n_ops == 6
    assert asm.counters.duplicate_records == 2 + 1


def test_a_restarted_rank_counting_batches_from_zero_again_is_not_a_duplicate() -> None:
    """A training process restarted under the same job id numbers its batches from 0
    again: its new steps must be analysed, not dropped as repeats of old batches."""
    asm = StepAssembler()
    for step in (1, 2):
        for pp in (0, 1):
            asm.add(make_batch(worker_step(step, pp, 10.0 * step), pp=pp, seq=step - 1), now_ns=0)
    closed = [
        s
        for pp in (0, 1)
        for s in asm.add(make_batch(worker_step(3, pp, 30.0), pp=pp, seq=0), now_ns=0)
    ]
    assert [s.step for s in closed] == [3]
    assert closed[0].n_ops == 6
    assert asm.counters.duplicate_batches == 0
    asm.add(make_batch(worker_step(3, 0, 30.0), pp=0, seq=0), now_ns=0)  # a real repeat
    assert asm.counters.duplicate_batches == 1


def test_declared_op_count_holds_the_step_open_until_all_records_arrived() -> None:
    asm = StepAssembler()
    ops0 = worker_step(1, 0, 0.0)
    # the end-of-step batch overtakes the batch with the earlier records
    asm.add(make_batch(ops0[2:], pp=0, seq=1, steps_done=[(1, 3)]), now_ns=0)
    assert asm.add(make_batch(worker_step(1, 1, 0.0), pp=1, steps_done=[(1, 3)]), now_ns=0) == []
    closed = asm.add(make_batch(ops0[:2], pp=0, seq=0), now_ns=0)
    assert len(closed) == 1 and not closed[0].partial and closed[0].n_ops == 6


def test_tensor_parallel_peers_are_counted_not_merged_twice() -> None:
    asm = StepAssembler()
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0, tp=1), now_ns=0)
    assert asm.counters.peer_records == 3
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    closed = asm.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=0)
    assert closed[0].n_ops == 6


def test_open_steps_are_bounded_per_job() -> None:
    asm = StepAssembler(AssemblyConfig(max_open_steps=2))
    closed = []
    for step in range(4):
        closed += asm.add(make_batch(worker_step(step, 0, step * 10.0), pp=0, seq=step), now_ns=0)
    assert [s.step for s in closed] == [0, 1]
    assert all(s.partial for s in closed)


def test_open_steps_are_bounded_by_their_records_too() -> None:
    """Three records a step, at most seven held: the third step evicts the first, and
    the count follows steps that complete."""
    asm = StepAssembler(AssemblyConfig(max_open_records=7))
    closed = []
    for step in range(3):
        closed += asm.add(make_batch(worker_step(step, 0, step * 10.0), pp=0, seq=step), now_ns=0)
    assert [s.step for s in closed] == [0] and closed[0].partial
    (done,) = asm.add(make_batch(worker_step(1, 1, 10.0), pp=1, seq=9), now_ns=0)
    assert done.step == 1 and not done.partial
    assert asm.add(make_batch(worker_step(3, 0, 30.0), pp=0, seq=3), now_ns=0) == []


def test_dedup_key_order_is_the_tuple_order() -> None:
    """The packed (rank, optype, seq_id) key picks the records np.unique over the stacked
    columns picks, in the same order, also when the fields are too wide to pack."""
    from rankwatch.streams.ops.assembly import _first_of_each_key

    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(1, 2000))
        rank = rng.integers(0, int(rng.choice([3, 64, 2**31])), n)
        optype = rng.integers(0, 14, n).astype(np.int8)
        seq_id = rng.integers(0, int(rng.choice([5, 1000, 2**40, 2**62])), n)
        stacked = np.stack([rank, optype, seq_id], axis=1)
        _, want = np.unique(stacked, axis=0, return_index=True)
        np.testing.assert_array_equal(_first_of_each_key(rank, optype, seq_id), want)


REANALYSE = AssemblyConfig(grace_s=1, quiet_grace_s=1, late="reanalyse")
"""Quiet grace 1 s: the tests' jobs send one batch, then nothing, for a second."""


def test_reanalyse_a_late_batch_completes_the_partial_step_it_was_missing_from() -> None:
    on_time = StepAssembler()
    on_time.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    (expected,) = on_time.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=0)

    asm = StepAssembler(REANALYSE)
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0), now_ns=0)
    (partial,) = asm.expire(now_ns=2 * S)
    assert partial.partial and partial.missing_workers == ((0, 1),)
    (again,) = asm.add(make_batch(worker_step(1, 1, 0.0), pp=1), now_ns=3 * S)
    assert (again.step, again.partial, again.missing_workers) == (1, False, ())
    for name in ("rank", "optype", "seq_id", "start_ts", "duration"):
        np.testing.assert_array_equal(getattr(again.trace, name), getattr(expected.trace, name))
    assert again.t_base == expected.t_base
    c = asm.counters
    assert (c.steps_partial, c.steps_reanalysed, c.late_kept_batches, c.late_batches) == (
        1,
        1,
        1,
        0,
    )
    # once complete, the step is closed for good: a further late batch is dropped
    assert asm.add(make_batch(worker_step(1, 1, 0.0), pp=1, seq=9), now_ns=4 * S) == []
    assert asm.counters.late_batches == 1


def test_reanalyse_waits_until_every_missing_worker_is_in() -> None:
    asm = StepAssembler(REANALYSE)
    layout = (2, 2)
    asm.add(make_batch(worker_step(1, 0, 0.0), layout=layout), now_ns=0)
    (partial,) = asm.expire(now_ns=2 * S)
    assert len(partial.missing_workers) == 3
    for dp, pp in ((0, 1), (1, 0)):
        assert (
            asm.add(make_batch(worker_step(1, pp, 0.0), dp=dp, pp=pp, layout=layout), 3 * S) == []
        )
    (again,) = asm.add(make_batch(worker_step(1, 1, 0.0), dp=1, pp=1, layout=layout), 3 * S)
    assert not again.partial and again.n_ops == 12
    assert list(asm.open_steps()) == []


def test_reanalyse_keeps_only_the_latest_partial_steps() -> None:
    asm = StepAssembler(dataclasses.replace(REANALYSE, reopen_memory=2))
    for step in (1, 2, 3):
        asm.add(make_batch(worker_step(step, 0, step * 10.0), pp=0, seq=step), now_ns=0)
    assert len(asm.expire(now_ns=2 * S)) == 3
    assert asm.add(make_batch(worker_step(1, 1, 10.0), pp=1, seq=1), 3 * S) == []  # evicted
    assert asm.counters.late_batches == 1
    (again,) = asm.add(make_batch(worker_step(3, 1, 30.0), pp=1, seq=3), 3 * S)
    assert again.step == 3 and not again.partial


def test_an_unknown_late_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="late must be one of drop, reanalyse"):
        AssemblyConfig(late="retry")


def test_reanalyse_counts_a_late_batch_that_declares_its_step_end_once() -> None:
    asm = StepAssembler(REANALYSE)
    asm.add(make_batch(worker_step(1, 0, 0.0), pp=0, steps_done=[(1, 3)]), now_ns=0)
    asm.expire(now_ns=2 * S)
    (again,) = asm.add(make_batch(worker_step(1, 1, 0.0), pp=1, steps_done=[(1, 3)]), 3 * S)
    assert not again.partial
    assert asm.counters.late_kept_batches == 1
