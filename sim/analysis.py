"""The figures of docs/whatif.md over any set of steps: offline (all) or online (one).

Every figure is a step time from one simulation pass over lanes (scenario, step,
dp rank): the recorded costs (T), the ideal costs (T_ideal), the ideal with one
group's real costs back (attribution S_g), the real costs with one group fixed
(M_W, M_S), and the recorded costs with launch delays (replay check).

Legend: N ops, S steps, D DP ranks, P stages, X scenarios, G groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rankwatch.schemas.optypes import ATTRIBUTION_GROUP, OPTYPES
from rankwatch.sim.align import align
from rankwatch.sim.durations import Measured, measure
from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import OpGraph
from rankwatch.sim.ideal import IdealCosts, ideal_costs
from rankwatch.sim.inference import infer_graph
from rankwatch.sim.scenarios import Costs, masked_costs, one_rank_real, recorded_costs
from rankwatch.sim.simulate import simulate
from rankwatch.sim.trace import JobMeta, Trace
from rankwatch.sim.workspace import Workspace

TOP_WORKER_SHARE = 0.03
"""M_W fixes this share of the workers (rounded up, at least one)."""

WORTH_ATTRIBUTING = 1.03
"""Below this slowdown the attributions are mostly noise (docs/whatif.md, "The figures")."""

_MAX_CHUNK_BYTES = 1 << 24
"""A simulation pass runs a chunk of scenarios and steps at a time: the chunk's time
table, and its share of the costs per (op, step, rank), take at most this many bytes
(16 MiB), so an analysis's scratch memory does not grow with the trace (one step of a
job too large for it is one chunk). Larger chunks save little time: a pass costs about
1.7 ms per chunk plus 1.3-3.5 ns per (op, lane) cell (benchmarks/README.md, "Offline
analysis of a 1,024-worker job")."""

DIMENSIONS = ("optype", "dp_rank", "stage")


def slowdown_of(t_sim: np.ndarray, t_ideal: np.ndarray) -> float:
    """Slowdown S = T / T_ideal of a set of steps (one or many): their summed simulated
    time over their summed ideal time (docs/whatif.md), NaN when the ideal is 0. The one
    place S is computed in Python: the offline analysis, the live worker's per-step
    figure and the live figures use it (the boards' SQL says the same,
    ``sum(t_sim) / sum(t_ideal)``)."""
    return _ratio(float(np.sum(t_sim)), float(np.sum(t_ideal)))


def waste_of(slowdown: float) -> float:
    """Waste W = 1 - 1/S: the share of the time (a step's or a job's) spent waiting on
    stragglers, from its slowdown S = T / T_ideal (docs/whatif.md). The one place W is
    computed in Python: the offline analysis, the live figures and the ops worker's
    step rows and messages use it (the boards' SQL says the same,
    ``1 - sum(t_ideal) / sum(t_sim)``)."""
    return 1.0 - 1.0 / slowdown


@dataclass(frozen=True, eq=False)
class Analysis:
    """Results for the steps of ``steps``; arrays are indexed like ``steps``."""

    steps: np.ndarray  # (S,)
    dp_size: int
    pp_size: int
    base_S: np.ndarray  # recorded step times
    simulated_S: np.ndarray  # T: simulated, launch delays 0
    ideal_S: np.ndarray  # T_ideal
    attribution_S: Mapping[str, Mapping[str, np.ndarray]]  # dim -> group -> T with g real
    worker_DP: np.ndarray  # S_w
    top_workers: tuple[tuple[int, int], ...]  # (dp_rank, stage) fixed for M_W
    m_w: float
    m_s: float
    replay_error: float  # max |replayed - recorded| step time, seconds
    ideal: IdealCosts

    @property
    def slowdown(self) -> float:
        return slowdown_of(self.simulated_S, self.ideal_S)

    @property
    def launch_slowdown(self) -> float:
        return _ratio(self.base_S.mean(), self.simulated_S.mean())

    @property
    def waste(self) -> float:
        return waste_of(self.slowdown)

    @property
    def step_slowdown(self) -> np.ndarray:
        return self.simulated_S / self.ideal_S

    def attribution(self, dim: str) -> dict[str, float]:
        """Group -> S_g over all steps, largest first."""
        ideal = self.ideal_S.mean()
        groups = self.attribution_S[dim]
        out = {g: _ratio(t, ideal) for g, t in zip(groups, _means(groups.values()), strict=True)}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def attribution_per_step(self, dim: str) -> dict[str, np.ndarray]:
        return {g: t / self.ideal_S for g, t in self.attribution_S[dim].items()}

    def workers(self) -> dict[str, float]:
        """``"dp,stage"`` -> S_w, largest first."""
        d, p = np.unravel_index(
            np.argsort(-self.worker_DP, axis=None, kind="stable"), self.worker_DP.shape
        )
        return {f"{i},{j}": float(self.worker_DP[i, j]) for i, j in zip(d, p, strict=True)}

    def to_json(self) -> dict[str, object]:
        """The CLI's JSON object (steps as string keys, NaN as null)."""
        steps = [str(s) for s in self.steps.tolist()]

        def by_step(values: np.ndarray) -> dict[str, float | None]:
            return {s: _num(v) for s, v in zip(steps, values.tolist(), strict=True)}

        attribution: dict[str, object] = {d: _nums(self.attribution(d)) for d in DIMENSIONS}
        attribution["worker"] = _nums(self.workers())
        return {
            "slowdown": _num(self.slowdown),
            "launch_slowdown": _num(self.launch_slowdown),
            "waste": _num(self.waste),
            "step_time": {
                "base": by_step(self.base_S),
                "simulated": by_step(self.simulated_S),
                "ideal": by_step(self.ideal_S),
            },
            "step_slowdown": by_step(self.step_slowdown),
            "attribution": attribution,
            "attribution_per_step": {
                d: {g: by_step(v) for g, v in self.attribution_per_step(d).items()}
                for d in DIMENSIONS
            },
            "M_W": _num(self.m_w),
            "M_S": _num(self.m_s),
            "top_workers": [f"{d},{p}" for d, p in self.top_workers],
            "replay_error": _num(self.replay_error),
            "ideal_cost": self.ideal.as_dict(),
            "layout": {"dp": self.dp_size, "pp": self.pp_size, "steps": len(steps)},
        }


def analyse(trace: Trace, meta: JobMeta) -> Analysis:
    """Offline: infer the model from the trace and analyse all its steps."""
    graph = infer_graph(trace, meta)
    measured = measure_trace(graph, trace)
    return analyse_measured(graph, measured, ideal_costs(graph, measured))


def analyse_step(
    graph: OpGraph, step_trace: Trace, ideal: IdealCosts, workspace: Workspace | None = None
) -> Analysis:
    """Online: one complete step against ideal costs (e.g. ``RollingIdeal.ideal()``).

    Pass the same ``workspace`` for every step of a job to reuse scratch memory.
    """
    measured = measure_trace(graph, step_trace)
    if measured.steps.size != 1:
        raise ModelError(f"analyse_step takes one step, got {measured.steps.size}")
    return analyse_measured(graph, measured, ideal, workspace)


def measure_trace(graph: OpGraph, trace: Trace) -> Measured:
    """Costs and launch delays of the trace's ops under ``graph``."""
    return measure(graph, align(graph, trace), in_place=True)


def analyse_measured(
    graph: OpGraph,
    measured: Measured,
    ideal: IdealCosts,
    workspace: Workspace | None = None,
) -> Analysis:
    """The shared core of :func:`analyse` and :func:`analyse_step`: all the steps of
    ``measured`` as one set (one ideal, the top workers over all of them).

    ``workspace``: scratch memory reused between calls (results do not depend on it).
    """
    return _analyse(
        graph, measured, ideal_per_node(graph, ideal), [(slice(None), ideal)], workspace
    )[0]


def analyse_each(
    graph: OpGraph,
    measured: Measured,
    ideals: Sequence[IdealCosts],
    workspace: Workspace | None = None,
) -> list[Analysis]:
    """Each step of ``measured`` against its own ideal costs (``ideals[s]`` for step s):
    the analyses :func:`analyse_measured` gives one step at a time, number for number,
    from one simulation pass over all of them. A live worker that closed several steps
    of a job since it last stored pays numpy's cost per call once for all of them
    (docs/whatif.md, "Offline and live figures")."""
    if len(ideals) != measured.steps.size:
        raise ValueError(f"{len(ideals)} ideals for {measured.steps.size} steps")
    ideal_NS = np.stack([ideal_per_node(graph, ideal) for ideal in ideals], axis=1)
    parts = [(slice(s, s + 1), ideal) for s, ideal in enumerate(ideals)]
    return _analyse(graph, measured, ideal_NS, parts, workspace)


def ideal_per_node(graph: OpGraph, ideal: IdealCosts) -> np.ndarray:
    """The ideal cost of each op of ``graph``; a :class:`ModelError` names the op types
    that have none (no step in the window had them)."""
    ideal_N = ideal.per_node(graph)
    if np.isnan(ideal_N).any():
        missing = sorted({OPTYPES[c] for c in graph.optype[np.isnan(ideal_N)].tolist()})
        raise ModelError(f"no ideal cost for op type(s): {', '.join(missing)}")
    return ideal_N


def _analyse(
    graph: OpGraph,
    measured: Measured,
    ideal: np.ndarray,
    parts: Sequence[tuple[slice, IdealCosts]],
    workspace: Workspace | None,
) -> list[Analysis]:
    """One analysis per part (a slice of the steps, analysed as a set): ``ideal`` per op
    ``(N,)`` or per op and step ``(N, S)``; the top workers are each part's own."""
    exact = measured.exact_cost_NSD
    groups = _groups(graph)
    masks = np.concatenate([np.zeros((graph.size, 1), bool), *groups.values()], axis=1)
    t_XS = _simulate_chunked(  # ideal, then each group real
        graph,
        (masks.shape[1], exact.shape[1], exact.shape[2]),
        lambda steps: masked_costs(graph, _clamped(exact, steps), _of(ideal, steps), masks),
        workspace,
        "groups.",
    )
    t_dp = _simulate_chunked(  # DP rank x real, the others ideal
        graph,
        (graph.dp_size, exact.shape[1], 1 if graph.dp_size == 1 else 2),
        lambda steps: one_rank_real(graph, _clamped(exact, steps), _of(ideal, steps)),
        workspace,
        "rank.",
    )
    scored = []
    fixed_SPD = np.zeros((exact.shape[1], graph.pp_size, graph.dp_size), bool)
    for which, _ in parts:
        attribution = _attribution(graph, groups, t_XS[1:, which], t_dp[:, which])
        ideal_S = t_XS[0, which].astype(np.float64)
        worker = _worker_scores(attribution, ideal_S, graph)
        top = _top_workers(worker)
        for d, p in top:
            fixed_SPD[which, p, d] = True
        scored.append((attribution, ideal_S, worker, top))
    replay, simulated, *fixed = _recorded(graph, measured, ideal, fixed_SPD, workspace)
    out = []
    for (which, ideal_costs_), (attribution, ideal_S, worker, top) in zip(
        parts, scored, strict=True
    ):
        t = simulated[which]
        out.append(
            Analysis(
                steps=measured.steps[which],
                dp_size=graph.dp_size,
                pp_size=graph.pp_size,
                base_S=measured.base_S[which],
                simulated_S=t,
                ideal_S=ideal_S,
                attribution_S=attribution,
                worker_DP=worker,
                top_workers=top,
                m_w=_share_fixed(t, fixed[0][which], ideal_S),
                m_s=_share_fixed(t, fixed[1][which], ideal_S),
                replay_error=float(np.abs(replay[which] - measured.base_S[which]).max()),
                ideal=ideal_costs_,
            )
        )
    return out


def _recorded(
    graph: OpGraph,
    measured: Measured,
    ideal: np.ndarray,
    fixed_SPD: np.ndarray,
    workspace: Workspace | None,
) -> np.ndarray:
    """Float64 step times ``(4, S)``: the replay (recorded costs and launch delays, not
    clamped), T (launch delays 0), T with the workers of ``fixed_SPD`` fixed (per step),
    with the last stage fixed."""
    exact = measured.exact_cost_NSD

    def costs(steps: slice) -> Costs:
        chunk = exact[:, steps]
        fix = fixed_SPD[steps]
        return recorded_costs(graph, chunk, _clamped(exact, steps), _of(ideal, steps), fix)

    def delay(steps: slice) -> np.ndarray:
        return measured.exact_delay_NSD[:, steps][graph.plan_nodes]

    return _simulate_chunked(  # arrays: exact, clamped, with workers fixed, 4 blocks, delay
        graph,
        (4, exact.shape[1], graph.dp_size),
        costs,
        workspace,
        "recorded.",
        delay,
        np.float64,
        arrays=8,
    )


def _of(ideal: np.ndarray, steps: slice) -> np.ndarray:
    """The ideal costs of a chunk of the steps (all of them when one per op)."""
    return ideal if ideal.ndim == 1 else ideal[:, steps]


def _clamped(cost_NSD: np.ndarray, steps: slice) -> np.ndarray:
    """Costs of some steps clamped at 0 (``Measured.cost_NSD``, a chunk at a time)."""
    return np.maximum(cost_NSD[:, steps], 0.0)


def _groups(graph: OpGraph) -> dict[tuple[str, str], np.ndarray]:
    """(dimension, group) -> (N, 1) mask of the ops given back their real cost."""
    names = np.array([ATTRIBUTION_GROUP[OPTYPES[c]] for c in graph.optype.tolist()])
    out: dict[tuple[str, str], np.ndarray] = {}
    for name in dict.fromkeys(ATTRIBUTION_GROUP[n] for n in OPTYPES):
        if (names == name).any():
            out[("optype", name)] = (names == name)[:, None]
    for stage in range(graph.pp_size):
        out[("stage", str(stage))] = (graph.stage == stage)[:, None]
    return out


def _simulate_chunked(
    graph: OpGraph,
    lanes: tuple[int, int, int],
    costs: Callable[[slice], Costs],
    workspace: Workspace | None,
    tag: str,
    delay: Callable[[slice], np.ndarray] | None = None,
    dtype: type = np.float32,
    arrays: int = 3,
) -> np.ndarray:
    """Step times ``(X, S)`` of X scenarios, a memory-bounded chunk at a time.

    ``lanes``: (X, S, D'); ``costs(steps)``: the costs of all scenarios on a slice of
    the steps, which take about ``arrays`` float64 arrays ``(N, steps, D)`` to make and
    hold; ``delay(steps)``: their launch delays in plan order, added on scenario 0, or
    None. Without a ``workspace``, the pass's tables are freed when it ends.
    """
    count, steps, width = lanes
    itemsize = np.dtype(dtype).itemsize
    table_bytes = graph.size * width * itemsize  # one scenario on one step
    cost_bytes = graph.size * graph.dp_size * 8 * arrays  # the costs of one step
    per_chunk = _even(steps, _MAX_CHUNK_BYTES // max(table_bytes, cost_bytes))
    scenarios = _even(count, _MAX_CHUNK_BYTES // (per_chunk * table_bytes))
    work = workspace or Workspace()
    out: np.ndarray = np.empty((count, steps), dtype=dtype)
    for first_step in range(0, steps, per_chunk):
        some = slice(first_step, min(steps, first_step + per_chunk))
        table = costs(some)
        late = None if delay is None else delay(some)
        for first in range(0, count, scenarios):
            which = slice(first, min(count, first + scenarios))
            out[which, some] = simulate(
                graph,
                table.scenarios(which),
                late if first == 0 else None,
                workspace=work,
                tag=tag,
            )
    return out


def _even(total: int, most: int) -> int:
    """Chunk size for ``total`` items, at most ``most`` (at least 1), chunks near equal."""
    chunks = -(-total // max(1, most))
    return max(1, -(-total // max(1, chunks)))


def _attribution(
    graph: OpGraph,
    groups: Mapping[tuple[str, str], np.ndarray],
    t_GS: np.ndarray,
    t_DS: np.ndarray,
) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {d: {} for d in DIMENSIONS}
    for (dim, name), t in zip(groups, t_GS, strict=True):
        out[dim][name] = t
    for rank in range(graph.dp_size):
        out["dp_rank"][str(rank)] = t_DS[rank]
    return out


def _worker_scores(
    attribution: Mapping[str, Mapping[str, np.ndarray]], ideal_S: np.ndarray, graph: OpGraph
) -> np.ndarray:
    """S_w = min(S_dp_rank(w), S_stage(w)) on the (dp_rank, stage) grid."""
    ideal = ideal_S.mean()
    dp = _means(attribution["dp_rank"][str(d)] for d in range(graph.dp_size)) / ideal
    st = _means(attribution["stage"][str(p)] for p in range(graph.pp_size)) / ideal
    return np.minimum(dp[:, None], st[None, :])


def _means(times: Iterable[np.ndarray]) -> np.ndarray:
    """Each step-time array's mean, in one reduction: the same numbers as ``t.mean()``
    one by one (each row is summed alone), without a numpy call per group (a live step
    of a DP-32 job made a hundred of them)."""
    rows = list(times)
    return np.stack(rows).mean(axis=1) if rows else np.zeros(0)


def _top_workers(worker_DP: np.ndarray) -> tuple[tuple[int, int], ...]:
    count = max(1, math.ceil(TOP_WORKER_SHARE * worker_DP.size))
    order = np.argsort(-worker_DP, axis=None, kind="stable")[:count]
    d, p = np.unravel_index(order, worker_DP.shape)
    return tuple((int(i), int(j)) for i, j in zip(d, p, strict=True))


def _share_fixed(t: np.ndarray, t_fix: np.ndarray, t_ideal: np.ndarray) -> float:
    """(mean T - mean T_fix) / (mean T - mean T_ideal): the share of the slowdown fixed."""
    return _ratio(t.mean() - t_fix.mean(), t.mean() - t_ideal.mean())


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b != 0 else math.nan


def _num(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def _nums(values: Mapping[str, float]) -> dict[str, float | None]:
    return {k: _num(v) for k, v in values.items()}
