"""Generated traces follow the conventions of the shipped real traces (ST, SE)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rankwatch.schemas.optypes import CODE, OPTYPES
from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen import GenConfig, generate_trace

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "stragglers"

ST_LIKE = GenConfig(dp=2, pp=4, microbatches=4, steps=3, first_step=23)
SE_LIKE = GenConfig(dp=32, pp=2, microbatches=8, steps=2, first_step=16)


def _real(name: str) -> Trace:
    if not SHARED.is_dir():
        pytest.skip("shared straggler traces not present")
    from rankwatch.traceio import read_trace

    return read_trace(SHARED / f"trace-{name}.parquet")


def _worker_ops(trace: Trace) -> dict[tuple[int, int], Counter]:
    """Per (dp_rank, stage): the op names of the first step (optype, seq_id)."""
    first = trace.step == trace.step[0]
    out: dict[tuple[int, int], Counter] = {}
    names = trace.optype_names
    for r in np.flatnonzero(first):
        key = (int(trace.dp_rank[r]), int(trace.stage[r]))
        out.setdefault(key, Counter())[(names[r], int(trace.seq_id[r]))] += 1
    return out


def _field_conventions(trace: Trace) -> set[tuple[str, bool, bool, bool]]:
    """Per optype: whether mc, gmc, mb_id are set (-1 = not set)."""
    names = trace.optype_names
    return {
        (str(names[r]), trace.mc[r] >= 0, trace.gmc[r] >= 0, trace.mb_id[r] >= 0)
        for r in range(len(trace))
    }


@pytest.mark.parametrize(("name", "cfg"), [("ST", ST_LIKE), ("SE", SE_LIKE)])
def test_same_layout_records_the_same_ops_per_worker(name: str, cfg: GenConfig) -> None:
    real = _real(name)
    generated, _ = generate_trace(cfg)
    assert _worker_ops(generated) == _worker_ops(real)


@pytest.mark.parametrize(("name", "cfg"), [("ST", ST_LIKE), ("SE", SE_LIKE)])
def test_same_field_conventions_per_op_type(name: str, cfg: GenConfig) -> None:
    assert _field_conventions(generate_trace(cfg)[0]) == _field_conventions(_real(name))


def test_same_row_order_and_ranks_as_st() -> None:
    real = _real("ST")
    generated, _ = generate_trace(ST_LIKE)
    n = int(np.sum(real.step == real.step[0]))
    assert n == int(np.sum(generated.step == generated.step[0]))
    for column in ("dp_rank", "stage", "rank", "optype", "seq_id", "mc", "gmc", "mb_id"):
        np.testing.assert_array_equal(getattr(generated, column)[:n], getattr(real, column)[:n])


def test_op_types_per_stage_follow_the_pipeline_ends() -> None:
    trace, _ = generate_trace(GenConfig(dp=2, pp=4, microbatches=4, steps=1))
    kinds = {s: set(trace.optype_names[trace.stage == s]) for s in range(4)}
    assert "forward-recv" not in kinds[0] and "backward-send" not in kinds[0]
    assert "forward-send" not in kinds[3] and "backward-recv" not in kinds[3]
    assert {s for s in kinds if "embedding-grads-all-reduce" in kinds[s]} == {0, 3}
    assert all("separate-grads-all-reduce" not in k for k in kinds.values())


def test_seq_id_counts_ops_of_a_type_in_start_order() -> None:
    trace, _ = generate_trace(GenConfig(dp=2, pp=3, microbatches=6, vpp=1, steps=2, seed=3))
    key = np.stack([trace.step, trace.dp_rank, trace.stage, trace.optype])
    order = np.lexsort((trace.start_ts, *key[::-1]))
    k, seq = key[:, order], trace.seq_id[order]
    new = np.r_[True, np.any(k[:, 1:] != k[:, :-1], axis=0)]
    expected = np.arange(len(seq)) - np.maximum.accumulate(np.where(new, np.arange(len(seq)), 0))
    np.testing.assert_array_equal(seq, expected)


def test_each_step_starts_at_zero() -> None:
    trace, _ = generate_trace(GenConfig(launch_delay_s=0.001, steps=4))
    for s in np.unique(trace.step):
        assert trace.start_ts[trace.step == s].min() == 0.0


def test_a_recv_blocks_until_its_sender_posts_then_transfers() -> None:
    cfg = GenConfig(dp=1, pp=2, microbatches=2, noise=0.0, p2p_s=0.001, steps=1)
    trace, _ = generate_trace(cfg)

    def op(stage: int, optype: str, seq: int) -> tuple[float, float]:
        r = np.flatnonzero(
            (trace.stage == stage) & (trace.optype == CODE[optype]) & (trace.seq_id == seq)
        )[0]
        return float(trace.start_ts[r]), float(trace.duration[r])

    send_start, _ = op(0, "forward-send", 0)
    recv_start, recv_duration = op(1, "forward-recv", 0)
    assert recv_start < send_start  # posted early, then blocked
    assert recv_start + recv_duration == pytest.approx(send_start + 0.001, abs=1e-12)


def test_vpp_sets_global_model_chunks() -> None:
    cfg = GenConfig(dp=2, pp=4, microbatches=8, vpp=2, schedule="interleaved", steps=1)
    trace, meta = generate_trace(cfg)
    compute = np.isin(trace.optype, [CODE["forward-compute"], CODE["backward-compute"]])
    np.testing.assert_array_equal(trace.gmc[compute], trace.mc[compute] * 4 + trace.stage[compute])
    assert set(trace.mc[compute].tolist()) == {0, 1}
    gathers = trace.optype == CODE["params-all-gather"]
    assert sorted(trace.mc[gathers & (trace.stage == 0) & (trace.dp_rank == 0)]) == [0, 1]
    # with VPP the last stage sends forward to stage 0 (the next model chunk)
    assert np.any((trace.stage == 3) & (trace.optype == CODE["forward-send"]))
    assert np.any((trace.stage == 0) & (trace.optype == CODE["forward-recv"]))
    assert meta.vpp_size == 2


def test_overlapped_grad_comm_adds_separate_all_reduce() -> None:
    trace, _ = generate_trace(GenConfig(overlap_grad_comm=True, steps=1))
    names = set(trace.optype_names.tolist())
    assert {"separate-grads-all-reduce", "grads-reduce-scatter"} <= names


def test_without_dp_there_are_no_dp_collectives() -> None:
    trace, meta = generate_trace(GenConfig(dp=1, pp=2, steps=1))
    dp_types = {"params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"}
    assert not dp_types & set(trace.optype_names.tolist())
    assert (meta.dp_size, meta.pp_size, meta.world_size) == (1, 2, 2)


def test_single_stage_has_no_point_to_point_or_embedding_ops() -> None:
    trace, _ = generate_trace(GenConfig(dp=3, pp=1, microbatches=4, steps=2))
    names = set(trace.optype_names.tolist())
    assert names == set(OPTYPES) - {
        "forward-send",
        "forward-recv",
        "backward-send",
        "backward-recv",
        "embedding-grads-all-reduce",
        "separate-grads-all-reduce",
    }
