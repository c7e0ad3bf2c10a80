"""Infer the dependency model (docs/whatif.md, "The dependency model") from one step of DP rank 0.

Rules, per stage (a worker's ops in start order):

- streams: compute (forward and backward), the four point-to-point types, and the
  DP stream (params-all-gather, grads-reduce-scatter) each run one op after another;
- the k-th valid recv feeds the k-th compute that needs one, and is not posted before
  the previous compute of that direction ended; the first backward send/recv waits
  for the compute two places before the stage's first backward compute;
- a compute feeds its send; the last all-gather of a chunk feeds its first forward;
- after the last compute: gc, layernorm all-reduce, embedding all-reduce, the
  reduce-scatters (or, with overlapped DP communication, separate-grads-all-reduce,
  the reduce-scatters then starting after their chunk's last backward and the last
  one joining gc), the gradient clip, the optimizer.

Groups: point-to-point pairs (stage p with p+1 forward, p-1 backward, modulo pp),
the embedding all-reduce of the first and last stage, the clip of all stages; DP
collectives and the clip also span all DP ranks.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from rankwatch.schemas.optypes import CODE, COMMUNICATING, DP_COLLECTIVES, OPTYPES
from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import OpGraph, buckets, csr, op_keys
from rankwatch.sim.naming import list_names, op_label
from rankwatch.sim.plan import build_levels, check_connected, final_nodes
from rankwatch.sim.trace import JobMeta, Trace

FWD, BWD = CODE["forward-compute"], CODE["backward-compute"]
_CHAIN = ("layernorm-grads-all-reduce", "embedding-grads-all-reduce")
_TAIL = ("optimizer-clip-main-grad", "optimizer")
_DP_STREAM = (CODE["params-all-gather"], CODE["grads-reduce-scatter"])
_DP_WIDE = {CODE[n] for n in DP_COLLECTIVES} | {CODE["optimizer-clip-main-grad"]}
_COMM = np.array([name in COMMUNICATING for name in OPTYPES])


def infer_graph(trace: Trace, meta: JobMeta) -> OpGraph:
    """The dependency model from the earliest step of DP rank 0 in ``trace``.

    Raises :class:`ModelError` naming the ops when the trace cannot be modelled.
    """
    rows = np.flatnonzero(trace.dp_rank == 0)
    if rows.size == 0:
        raise ModelError("the trace has no ops of dp_rank 0 to infer the model from")
    step = int(trace.step[rows].min())
    one = trace.select(rows[trace.step[rows] == step])
    _check_layout(trace, one, meta)
    builder = _Builder(one, meta, step)
    for stage in range(meta.pp_size):
        builder.add_stage(stage)
    builder.link_pipeline()
    builder.link_collectives()
    return builder.finish()


def _check_layout(trace: Trace, one: Trace, meta: JobMeta) -> None:
    """The trace's ranks and stages must be those of the job metadata."""
    stages = np.unique(one.stage)
    if stages.min() < 0 or stages.max() >= meta.pp_size or stages.size != meta.pp_size:
        raise ModelError(
            f"the job metadata says pp_size {meta.pp_size} but dp_rank 0 records stages "
            f"{', '.join(map(str, stages.tolist()))}: is it the metadata of this trace?"
        )
    if trace.dp_rank.min() < 0 or trace.dp_rank.max() >= meta.dp_size:
        raise ModelError(
            f"the job metadata says dp_size {meta.dp_size} but the trace has dp_rank "
            f"{int(trace.dp_rank.max())}: is it the metadata of this trace?"
        )


class _Builder:
    """Collects nodes, edges and groups; one instance per inference."""

    def __init__(self, one: Trace, meta: JobMeta, step: int) -> None:
        self.one, self.meta, self.step = one, meta, step
        self.last_chunk = meta.pp_size * meta.vpp_size - 1
        self.rows: list[int] = []  # trace row of each node
        self.deps: list[list[int]] = []
        self.groups: list[list[int]] = []
        self.skipped: list[int] = []  # trace rows modelled as no-ops
        self.p2p: dict[tuple[int, str], list[int]] = {}  # (stage, optype) -> valid nodes
        self.by_type: dict[tuple[int, str], list[int]] = {}
        self.overlap = bool((one.optype == CODE["separate-grads-all-reduce"]).any())

    # -- nodes and edges --------------------------------------------------------------

    def _label(self, row: int) -> str:
        t = self.one
        return op_label(
            int(t.optype[row]), int(t.seq_id[row]), int(t.stage[row]), int(t.mb_id[row])
        )

    def _add(self, row: int) -> int:
        self.rows.append(row)
        self.deps.append([])
        return len(self.rows) - 1

    def _edge(self, src: int, dst: int) -> None:
        if src not in self.deps[dst]:
            self.deps[dst].append(src)

    def _chunk(self, node: int) -> int:
        t, row = self.one, self.rows[node]
        if t.gmc[row] >= 0:
            return int(t.gmc[row])
        return max(int(t.mc[row]), 0) * self.meta.pp_size + int(t.stage[row])

    def add_stage(self, stage: int) -> None:
        t = self.one
        rows = np.flatnonzero(t.stage == stage)
        if rows.size == 0:
            raise ModelError(f"stage {stage} has no ops in step {self.step} of dp_rank 0")
        rows = rows[np.lexsort((t.seq_id[rows], t.optype[rows], t.start_ts[rows]))]
        names = op_keys(t.optype[rows], t.seq_id[rows], t.stage[rows])
        uniq, counts = np.unique(names, return_counts=True)
        if (counts > 1).any():
            twice = set(uniq[counts > 1].tolist())
            dup = [
                self._label(r)
                for r, k in zip(rows.tolist(), names.tolist(), strict=False)
                if k in twice
            ]
            raise ModelError(f"ops recorded twice in step {self.step}: {list_names(dup)}")
        by_type: dict[str, list[int]] = defaultdict(list)
        for row in rows.tolist():
            by_type[OPTYPES[t.optype[row]]].append(row)
        compute = [r for r in rows.tolist() if t.optype[r] in (FWD, BWD)]
        nodes = {r: self._add(r) for r in rows.tolist() if not self._is_p2p(r)}
        for name, rs in by_type.items():
            if name not in ("forward-send", "forward-recv", "backward-send", "backward-recv"):
                self.by_type[(stage, name)] = [nodes[r] for r in rs]
        comp = [nodes[r] for r in compute]
        for prev, nxt in itertools.pairwise(comp):
            self._edge(prev, nxt)
        self._link_p2p(stage, comp, by_type)
        self._link_dp_stream(stage, comp)
        self._link_chain(stage, comp)

    def _is_p2p(self, row: int) -> bool:
        return OPTYPES[self.one.optype[row]] in (
            "forward-send",
            "forward-recv",
            "backward-send",
            "backward-recv",
        )

    # -- point-to-point ---------------------------------------------------------------

    def _link_p2p(self, stage: int, comp: list[int], by_type: dict[str, list[int]]) -> None:
        t = self.one
        fwd = [n for n in comp if t.optype[self.rows[n]] == FWD]
        bwd = [n for n in comp if t.optype[self.rows[n]] == BWD]
        first_b = comp.index(bwd[0]) if bwd else -1
        early = comp[first_b - 2] if first_b >= 2 else None
        wants = {
            "forward-recv": (fwd, [n for n in fwd if self._chunk(n) != 0]),
            "forward-send": (fwd, [n for n in fwd if self._chunk(n) != self.last_chunk]),
            "backward-recv": (bwd, [n for n in bwd if self._chunk(n) != self.last_chunk]),
            "backward-send": (bwd, [n for n in bwd if self._chunk(n) != 0]),
        }
        window = self._window(comp)
        for name, (direction, partners) in wants.items():
            rows = self._valid(stage, name, by_type.get(name, []), len(partners), window)
            ops = [self._add(r) for r in rows]
            self.p2p[(stage, name)] = ops
            for prev, nxt in itertools.pairwise(ops):
                self._edge(prev, nxt)
            for k, (op, partner) in enumerate(zip(ops, partners, strict=True)):
                if name.endswith("send"):
                    self._edge(partner, op)
                else:
                    self._edge(op, partner)
                    i = direction.index(partner)
                    if i > 0:
                        self._edge(direction[i - 1], op)
                if k == 0 and name.startswith("backward") and early is not None:
                    self._edge(early, op)

    def _window(self, comp: list[int]) -> tuple[float, float]:
        if not comp:
            return (0.0, 0.0)
        t = self.one
        first, last = self.rows[comp[0]], self.rows[comp[-1]]
        return float(t.start_ts[first]), float(t.start_ts[last] + t.duration[last])

    def _valid(
        self, stage: int, name: str, rows: list[int], wanted: int, window: tuple[float, float]
    ) -> list[int]:
        """Drop leading/trailing no-op sends/recvs outside the compute window."""
        t, rows = self.one, list(rows)
        while len(rows) > wanted and t.start_ts[rows[0]] < window[0]:
            self.skipped.append(rows.pop(0))
        while len(rows) > wanted and t.start_ts[rows[-1]] >= window[1]:
            self.skipped.append(rows.pop())
        if len(rows) != wanted:
            raise ModelError(
                f"stage {stage} records {len(rows)} {name} ops where its compute ops need "
                f"{wanted} (step {self.step}, dp_rank 0): "
                f"{list_names(self._label(r) for r in rows) or 'none recorded'}"
            )
        return rows

    # -- data-parallel stream and end-of-step chain -----------------------------------

    def _mc(self, node: int) -> int:
        return int(self.one.mc[self.rows[node]])

    def _link_dp_stream(self, stage: int, comp: list[int]) -> None:
        t = self.one
        dp_ops = self.by_type.get((stage, "params-all-gather"), []) + self.by_type.get(
            (stage, "grads-reduce-scatter"), []
        )
        dp_ops.sort(key=lambda n: (t.start_ts[self.rows[n]], t.optype[self.rows[n]]))
        for prev, nxt in itertools.pairwise(dp_ops):
            self._edge(prev, nxt)
        forwards = [n for n in comp if t.optype[self.rows[n]] == FWD]
        backwards = [n for n in comp if t.optype[self.rows[n]] == BWD]
        for gather in _last_per_chunk(self.by_type.get((stage, "params-all-gather"), []), self):
            first = next((n for n in forwards if self._mc(n) == self._mc(gather)), None)
            if first is not None:
                self._edge(gather, first)
        if self.overlap:
            scatters = self.by_type.get((stage, "grads-reduce-scatter"), [])
            for chunk in sorted({self._mc(n) for n in scatters}):
                first = next(n for n in scatters if self._mc(n) == chunk)
                last_b = [n for n in backwards if self._mc(n) == chunk]
                if last_b:
                    self._edge(last_b[-1], first)

    def _link_chain(self, stage: int, comp: list[int]) -> None:
        heads = comp[-1:]
        for node in self.by_type.get((stage, "gc"), []):
            heads = self._follow(heads, node)
        scatters = self.by_type.get((stage, "grads-reduce-scatter"), [])
        if self.overlap and scatters:
            heads = [*heads, scatters[-1]]
        for name in _CHAIN:
            for node in self.by_type.get((stage, name), []):
                heads = self._follow(heads, node)
        if not self.overlap and scatters:
            self._follow(heads, scatters[0])
            heads = scatters[-1:]
        for node in self.by_type.get((stage, "separate-grads-all-reduce"), []):
            heads = self._follow(heads, node)
        for name in _TAIL:
            for node in self.by_type.get((stage, name), []):
                heads = self._follow(heads, node)

    def _follow(self, heads: list[int], node: int) -> list[int]:
        for head in heads:
            self._edge(head, node)
        return [node]

    # -- groups -----------------------------------------------------------------------

    def link_pipeline(self) -> None:
        pp = self.meta.pp_size
        for stage in range(pp):
            self._pair(stage, "forward-send", (stage + 1) % pp, "forward-recv")
            self._pair(stage, "backward-send", (stage - 1) % pp, "backward-recv")

    def _pair(self, stage: int, send: str, peer: int, recv: str) -> None:
        sends, recvs = self.p2p.get((stage, send), []), self.p2p.get((peer, recv), [])
        if len(sends) != len(recvs):
            extra = sends[len(recvs) :] or recvs[len(sends) :]
            raise ModelError(
                f"{send} ops of stage {stage} and {recv} ops of stage {peer} do not pair up "
                f"({len(sends)} vs {len(recvs)}): unmatched "
                f"{list_names(self._label(self.rows[n]) for n in extra)}"
            )
        for a, b in zip(sends, recvs, strict=True):
            self._group([a, b])

    def link_collectives(self) -> None:
        pp = self.meta.pp_size
        ends = sorted({0, pp - 1})
        emb = [self.by_type.get((s, "embedding-grads-all-reduce"), []) for s in ends]
        for ops in _zip_longest(emb):
            self._group(ops)
        clips = [self.by_type.get((s, "optimizer-clip-main-grad"), []) for s in range(pp)]
        for ops in _zip_longest(clips):
            self._group(ops)

    def _group(self, nodes: list[int]) -> None:
        while len(self.groups) < len(self.rows):
            self.groups.append([])
        for node in nodes:
            self.groups[node] = list(nodes)

    def _lookup(self, rows: np.ndarray, skipped: np.ndarray) -> np.ndarray:
        return _lookup_table(self.one, rows, skipped, self.meta.pp_size)

    # -- result -----------------------------------------------------------------------

    def finish(self) -> OpGraph:
        t, n = self.one, len(self.rows)
        rows = np.asarray(self.rows, dtype=np.int64)
        optype = t.optype[rows]
        is_comm = _COMM[optype]
        while len(self.groups) < n:
            self.groups.append([])
        groups = [g if g or not is_comm[i] else [i] for i, g in enumerate(self.groups)]
        dep_ptr, dep_idx = csr(self.deps)
        member_ptr, member_idx = csr(groups)
        dp_wide = np.isin(optype, list(_DP_WIDE))
        labels = [self._label(int(r)) for r in rows]
        check_connected(n, self.deps, groups, labels)
        levels, plan_row = build_levels(self.deps, groups, dp_wide, is_comm, labels)
        final = final_nodes(optype, self.deps, n)
        skipped = np.asarray(self.skipped, dtype=np.int64)
        return OpGraph(
            dp_size=self.meta.dp_size,
            pp_size=self.meta.pp_size,
            vpp_size=self.meta.vpp_size,
            optype=optype.copy(),
            seq_id=t.seq_id[rows].astype(np.int64),  # int64 whatever the trace holds
            stage=t.stage[rows].astype(np.int64),
            mb_id=t.mb_id[rows].astype(np.int64),
            dep_ptr=dep_ptr,
            dep_idx=dep_idx,
            member_ptr=member_ptr,
            member_idx=member_idx,
            dp_wide=dp_wide,
            is_comm=is_comm,
            skipped_keys=op_keys(t.optype[skipped], t.seq_id[skipped], t.stage[skipped]),
            dep_buckets=buckets(self.deps),
            member_buckets=buckets(groups, min_len=2),
            lookup=self._lookup(rows, skipped),
            levels=levels,
            final=final,
            final_rows=plan_row[final],
            plan_nodes=np.argsort(plan_row),
        )


def _lookup_table(t: Trace, rows: np.ndarray, skipped: np.ndarray, pp: int) -> np.ndarray:
    """Dense (optype, seq_id, stage) -> node table: -1 unknown, -2 a no-op record."""
    seq = int(t.seq_id[np.concatenate([rows, skipped])].max(initial=0)) + 1
    table = np.full((len(OPTYPES), seq, pp), -1, dtype=np.int64)
    table[t.optype[skipped], t.seq_id[skipped], t.stage[skipped]] = -2
    table[t.optype[rows], t.seq_id[rows], t.stage[rows]] = np.arange(rows.size)
    return table


def _last_per_chunk(gathers: list[int], builder: _Builder) -> list[int]:
    last: dict[int, int] = {}
    for node in gathers:
        last[builder._mc(node)] = node
    return list(last.values())


def _zip_longest(lists: list[list[int]]) -> list[list[int]]:
    width = max((len(x) for x in lists), default=0)
    return [[x[k] for x in lists if k < len(x)] for k in range(width)]
