"""Lay simulated op times out as trace rows, in the conventions of the shipped traces.

Rows come per step, then stage, then DP rank; inside a worker sorted by op-type name
then ``seq_id`` (as ``trace-ST.parquet``). ``rank = stage * dp + dp_rank`` (pipeline
outermost). A communication op's recorded duration is its end minus its start: the
time blocked waiting for its peers plus its transfer.

Array legend: N ops of the graph, S steps, D DP ranks.
"""

from __future__ import annotations

import numpy as np

from rankwatch.schemas.optypes import OPTYPES
from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen.graph import ScheduleGraph

_NAME_RANK = np.argsort(np.argsort(np.array(OPTYPES)))
"""Alphabetical position of each op-type code: the row order inside a worker."""


def worker_row_order(graph: ScheduleGraph) -> np.ndarray:
    """Op indices sorted by stage, op-type name, seq_id."""
    return np.lexsort((graph.seq_id, _NAME_RANK[graph.optype], graph.stage))


def assemble_trace(
    graph: ScheduleGraph,
    steps: range,
    dp: int,
    *,
    start_NSD: np.ndarray,
    end_NSD: np.ndarray,
    duration_NSD: np.ndarray,
) -> Trace:
    """The Trace of all steps and DP ranks; compute-like ops keep their exact duration."""
    ordered = worker_row_order(graph)
    op_idx: list[np.ndarray] = []
    dp_idx: list[np.ndarray] = []
    for stage in range(int(graph.stage.max()) + 1):
        ops = ordered[graph.stage[ordered] == stage]
        op_idx.append(np.tile(ops, dp))
        dp_idx.append(np.repeat(np.arange(dp), ops.size))
    per_step = int(sum(a.size for a in op_idx))
    n_steps = len(steps)
    op_R = np.tile(np.concatenate(op_idx), n_steps)
    dp_R = np.tile(np.concatenate(dp_idx), n_steps)
    step_R = np.repeat(np.arange(n_steps), per_step)
    grouped_N = graph.group >= 0
    recorded_NSD = np.where(grouped_N[:, None, None], end_NSD - start_NSD, duration_NSD)
    stage_R = graph.stage[op_R]
    return Trace(
        dp_rank=dp_R.astype(np.int64),
        stage=stage_R,
        rank=stage_R * dp + dp_R,
        step=np.asarray(steps, dtype=np.int64)[step_R],
        optype=graph.optype[op_R],
        seq_id=graph.seq_id[op_R],
        mc=graph.mc[op_R],
        gmc=graph.gmc[op_R],
        mb_id=graph.mb_id[op_R],
        start_ts=start_NSD[op_R, step_R, dp_R],
        duration=recorded_NSD[op_R, step_R, dp_R],
    )
