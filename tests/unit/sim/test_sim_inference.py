"""The inferred dependency model: the edges docs/whatif.md names, no-op sends/recvs skipped."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.schemas.optypes import CODE
from rankwatch.sim import Trace, analyse, infer_graph
from rankwatch.sim.tracegen import GenConfig, generate_trace

CFG = GenConfig(dp=2, pp=3, microbatches=4, steps=2, noise=0.05)


def _node(graph, optype: str, seq: int, stage: int) -> int:
    hit = np.flatnonzero(
        (graph.optype == CODE[optype]) & (graph.seq_id == seq) & (graph.stage == stage)
    )
    assert hit.size == 1, (optype, seq, stage)
    return int(hit[0])


def test_edges_of_a_1f1b_stage() -> None:
    trace, meta = generate_trace(CFG)
    g = infer_graph(trace, meta)
    recv = _node(g, "forward-recv", 2, 1)
    assert recv in g.deps(_node(g, "forward-compute", 2, 1))  # a recv feeds its compute
    assert _node(g, "forward-compute", 1, 1) in g.deps(recv)  # posted after the previous
    assert _node(g, "forward-compute", 2, 1) in g.deps(_node(g, "forward-send", 2, 1))
    send = _node(g, "forward-send", 2, 1)
    assert sorted(g.members(send).tolist()) == sorted([send, _node(g, "forward-recv", 2, 2)])
    clip = _node(g, "optimizer-clip-main-grad", 0, 1)
    assert g.dp_wide[clip] and len(g.members(clip)) == 3
    assert clip in g.deps(_node(g, "optimizer", 0, 1))
    assert g.label(_node(g, "backward-compute", 3, 2)) == "backward-compute_3_2 (2B3)"


def _with_noop_records(trace: Trace) -> Trace:
    """Add a zero-length forward-recv on stage 0 before any compute of each step and rank
    (no stage feeds stage 0), shifting the real ones' seq_id: a leading no-op."""
    cols = trace.columns()
    keys = np.unique(np.stack([trace.step, trace.dp_rank], axis=1), axis=0)
    k = len(keys)
    extra = {
        "dp_rank": keys[:, 1],
        "stage": np.zeros(k, dtype=np.int64),
        "rank": keys[:, 1],
        "step": keys[:, 0],
        "optype": np.full(k, "forward-recv", dtype=object),
        "seq_id": np.zeros(k, dtype=np.int64),
        "mc": np.full(k, -1),
        "gmc": np.full(k, -1),
        "mb_id": np.full(k, -1),
        "start_ts": np.zeros(k),
        "duration": np.zeros(k),
    }
    return Trace.from_columns({c: np.concatenate([cols[c], extra[c]]) for c in cols})


def test_leading_noop_recv_is_skipped() -> None:
    trace, meta = generate_trace(CFG)
    with_noop = _with_noop_records(trace)
    assert len(with_noop) > len(trace)
    plain, padded = analyse(trace, meta).to_json(), analyse(with_noop, meta).to_json()
    assert padded["slowdown"] == pytest.approx(plain["slowdown"], rel=1e-12)
    assert padded["attribution"] == plain["attribution"]
