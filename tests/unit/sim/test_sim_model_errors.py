"""Traces the model cannot represent fail with a ModelError that names the ops."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.schemas.optypes import CODE
from rankwatch.sim import ModelError, Trace, analyse, infer_graph, measure_trace
from rankwatch.sim.plan import build_levels, check_connected
from rankwatch.sim.tracegen import GenConfig, generate_trace

CFG = GenConfig(dp=2, pp=3, microbatches=4, steps=3, noise=0.05)


@pytest.fixture(scope="module")
def job() -> tuple[Trace, object]:
    return generate_trace(CFG)


def _where(trace: Trace, optype: str, seq: int, stage: int, step: int, dp: int) -> np.ndarray:
    return (
        (trace.optype == CODE[optype])
        & (trace.seq_id == seq)
        & (trace.stage == stage)
        & (trace.step == step)
        & (trace.dp_rank == dp)
    )


def test_model_error_is_a_value_error() -> None:
    assert issubclass(ModelError, ValueError)


def test_a_missing_op_in_a_later_step_is_named(job) -> None:
    trace, meta = job
    gone = _where(trace, "backward-compute", 2, 1, step=1, dp=1)
    with pytest.raises(ModelError, match=r"backward-compute_2_1 \(1B2\) in step 1 of dp_rank 1"):
        analyse(trace.select(~gone), meta)


def test_an_extra_op_is_named(job) -> None:
    trace, meta = job
    row = np.flatnonzero(_where(trace, "optimizer", 0, 2, step=2, dp=0))
    extra = trace.select(np.concatenate([np.arange(len(trace)), row]))
    cols = extra.columns()
    seq = cols["seq_id"].copy()
    seq[-1] = 7
    extra = Trace.from_columns({**cols, "seq_id": seq})
    with pytest.raises(ModelError, match=r"optimizer_7_2 in step 2 of dp_rank 0"):
        analyse(extra, meta)


def test_a_duplicated_record_is_refused(job) -> None:
    trace, meta = job
    row = np.flatnonzero(_where(trace, "gc", 0, 0, step=1, dp=1))
    twice = trace.select(np.concatenate([np.arange(len(trace)), row]))
    with pytest.raises(ModelError, match=r"recorded twice: gc_0_0 in step 1 of dp_rank 1"):
        analyse(twice, meta)


def test_unpaired_point_to_point_ops_are_named(job) -> None:
    trace, meta = job
    first = trace.select((trace.step == 0) & (trace.dp_rank == 0))
    gone = _where(first, "forward-recv", 3, 2, step=0, dp=0)
    with pytest.raises(ModelError, match=r"stage 2 records 3 forward-recv ops where"):
        infer_graph(first.select(~gone), meta)


def test_a_missing_stage_is_named(job) -> None:
    trace, meta = job
    with pytest.raises(ModelError, match="pp_size 3 but dp_rank 0 records stages 0, 2"):
        infer_graph(trace.select(trace.stage != 1), meta)


def test_ranks_outside_the_job_are_refused(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    cols = trace.columns()
    dp = cols["dp_rank"].copy()
    dp[0] = 5
    with pytest.raises(ModelError, match="dp_rank 5 is outside"):
        measure_trace(graph, Trace.from_columns({**cols, "dp_rank": dp}))


def test_no_dp_rank_0_is_refused(job) -> None:
    trace, meta = job
    with pytest.raises(ModelError, match="no ops of dp_rank 0"):
        infer_graph(trace.select(trace.dp_rank != 0), meta)


def test_a_split_model_names_the_loose_ops() -> None:
    deps: list[list[int]] = [[], [0], []]
    with pytest.raises(ModelError, match=r"2 pieces; not connected to the rest: gc_0_1"):
        check_connected(3, deps, [[], [], []], ["1F0", "1B0", "gc_0_1"])


def test_a_cycle_names_the_ops_on_it() -> None:
    deps = [[], [2], [1]]
    is_comm = np.zeros(3, bool)
    with pytest.raises(ModelError, match=r"cycle through: .*0F1.*0F2|cycle through: .*0F2.*0F1"):
        build_levels(deps, [[], [], []], is_comm, is_comm, ["0F0", "0F1", "0F2"])
