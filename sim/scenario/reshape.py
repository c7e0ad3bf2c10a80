"""Re-shaping: the job's dependency graph at other DP / PP sizes or microbatch counts.

The new graph comes from the trace generator's schedule builder (``sim.tracegen``),
keeping only the op types the job records, and is read back by the same inference
as a measured trace, so it follows the same dependency rules. Before using it, the
builder must reproduce the job's *own* graph at its own sizes (same ops, same
dependencies, same groups): that is how the job's schedule is recognised, and a job
whose schedule the builder does not know is refused rather than guessed.

Each new op takes the measured costs of an op of the job (docs/scenarios.md,
"Re-shaping"): the same op type on the matching stage, the k-th such op mapped to
the (k mod count)-th, and DP rank d to rank d mod D. With fewer or more pipeline
stages each stage holds P/P' times the layers: its compute, optimizer and
gradient-collective sizes scale by P/P'.

Legend: N ops, D DP ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from rankwatch.schemas.optypes import CODE, COMPUTE, DP_COLLECTIVES, OPTYPES
from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import OpGraph
from rankwatch.sim.inference import infer_graph
from rankwatch.sim.scenario.settings import ScenarioError
from rankwatch.sim.trace import JobMeta
from rankwatch.sim.tracegen.graph import GraphSizes, build_graph
from rankwatch.sim.tracegen.records import assemble_trace
from rankwatch.sim.tracegen.timing import simulate as event_times

_SIZED = frozenset({*COMPUTE, "optimizer", *DP_COLLECTIVES})
"""Op types whose work is proportional to the layers a stage holds."""


@dataclass(frozen=True)
class Shape:
    """A target graph and where its ops' costs come from in the job's graph."""

    graph: OpGraph
    source_N: np.ndarray  # op of the job's graph each op takes its costs from
    scale_N: np.ndarray  # work multiplier (layers per stage)
    source_D: np.ndarray  # DP rank of the job each DP rank takes its costs from
    microbatches: int


def microbatches(graph: OpGraph) -> int:
    """Microbatches per step: forward ops of stage 0 per model chunk."""
    fwd = (graph.optype == CODE["forward-compute"]) & (graph.stage == 0)
    return int(fwd.sum()) // graph.vpp_size


def same_shape(graph: OpGraph) -> Shape:
    n = graph.size
    return Shape(graph, np.arange(n), np.ones(n), np.arange(graph.dp_size), microbatches(graph))


def reshape(
    graph: OpGraph, dp: int, pp: int, m: int, schedule: Callable[[], str] | None = None
) -> Shape:
    """The job at DP ``dp``, PP ``pp`` with ``m`` microbatches; ScenarioError if impossible.

    ``schedule``: the job's schedule, asked only when the graph must be rebuilt (a
    caller re-shaping one job several times recognises it once); default: recognised.
    """
    own_m = microbatches(graph)
    if (dp, pp, m) == (graph.dp_size, graph.pp_size, own_m):
        return same_shape(graph)
    if dp > 1 and graph.dp_size == 1:
        raise ScenarioError(
            "the job ran with DP 1: it has no data-parallel collectives to calibrate a larger DP on"
        )
    if (pp, m) == (graph.pp_size, own_m):
        new = replace(graph, dp_size=dp)
    else:
        name = schedule() if schedule is not None else recognise_schedule(graph)
        new = _generated(graph, name, pp, m, dp)
    return Shape(
        graph=new,
        source_N=_sources(graph, new),
        scale_N=_scales(new, graph.pp_size, pp),
        source_D=np.arange(dp) % graph.dp_size,
        microbatches=m,
    )


def recognise_schedule(graph: OpGraph) -> str:
    """The generator schedule whose graph at the job's sizes is the job's graph."""
    m = microbatches(graph)
    candidates = ("interleaved",) if graph.vpp_size > 1 else ("1f1b", "gpipe")
    for schedule in candidates:
        try:
            rebuilt = _generated(graph, schedule, graph.pp_size, m, graph.dp_size)
        except (ModelError, ValueError):
            continue
        if _signature(rebuilt) == _signature(graph):
            return schedule
    raise ScenarioError(
        "cannot re-shape this job: its dependency graph is not the one the schedule "
        f"builder makes for {' or '.join(candidates)} at its own sizes (DP {graph.dp_size}, "
        f"PP {graph.pp_size}, {m} microbatches)"
    )


def _generated(graph: OpGraph, schedule: str, pp: int, m: int, dp: int) -> OpGraph:
    present = set(np.unique(graph.optype).tolist())
    sizes = GraphSizes(
        pp=pp,
        vpp=graph.vpp_size,
        microbatches=m,
        schedule=schedule,
        dp_comm=bool(present & {CODE[n] for n in DP_COLLECTIVES}),
        overlap_grad_comm=CODE["separate-grads-all-reduce"] in present,
    )
    sched = build_graph(sizes)
    compute = np.isin(sched.optype, [CODE[n] for n in COMPUTE])
    duration = np.where(compute, 1.0, 0.01)[:, None, None]
    start, end = event_times(sched, duration)
    trace = assemble_trace(sched, range(1), 1, start_NSD=start, end_NSD=end, duration_NSD=duration)
    trace = trace.select(np.isin(trace.optype, sorted(present)))
    return infer_graph(trace, JobMeta(dp_size=dp, pp_size=pp, vpp_size=graph.vpp_size))


def _signature(graph: OpGraph) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
    """Op key -> (dependency keys, group member keys): the graph up to node order."""
    keys = graph.keys
    return {
        int(keys[i]): (
            frozenset(keys[graph.deps(i)].tolist()),
            frozenset(keys[graph.members(i)].tolist()),
        )
        for i in range(graph.size)
    }


def _stage_map(old_pp: int, new_pp: int) -> np.ndarray:
    """Job stage each new stage takes its costs from (first to first, last to last)."""
    if new_pp == 1:
        return np.zeros(1, dtype=np.int64)
    return np.rint(np.arange(new_pp) * (old_pp - 1) / (new_pp - 1)).astype(np.int64)


def _sources(old: OpGraph, new: OpGraph) -> np.ndarray:
    stage_of = _stage_map(old.pp_size, new.pp_size)
    index: dict[tuple[int, int], np.ndarray] = {}
    for code in np.unique(old.optype).tolist():
        for stage in range(old.pp_size):
            nodes = np.flatnonzero((old.optype == code) & (old.stage == stage))
            index[(code, stage)] = nodes[np.argsort(old.seq_id[nodes], kind="stable")]
    out = np.empty(new.size, dtype=np.int64)
    for i in range(new.size):
        code, stage = int(new.optype[i]), int(stage_of[new.stage[i]])
        found = index.get((code, stage))
        if found is None or found.size == 0:
            found = next(v for (c, _), v in index.items() if c == code and v.size)
        out[i] = found[int(new.seq_id[i]) % found.size]
    return out


def _scales(new: OpGraph, old_pp: int, new_pp: int) -> np.ndarray:
    sized = np.isin(new.optype, [CODE[n] for n in _SIZED])
    return np.where(sized, old_pp / new_pp, 1.0)


def describe_sizes(graph: OpGraph) -> str:
    types = ", ".join(OPTYPES[c] for c in np.unique(graph.optype).tolist())
    return f"DP {graph.dp_size} x PP {graph.pp_size}, {microbatches(graph)} microbatches ({types})"
