"""The op graph of one model-parallel group (all stages of one DP rank) for one step.

It is the dependency model of ``docs/whatif.md``, built forward from a schedule instead of
inferred from a trace, so that a generated trace is exactly what the what-if engine
will read back: per worker a compute stream, four point-to-point streams and one
data-parallel stream, edges between them, and communication groups whose members end
together once all have started. Only point-to-point ops that have a peer are recorded
(none are no-ops): ``seq_id`` counts the valid ones, and the n-th forward-send of stage
p pairs with the n-th forward-recv of stage (p + 1) mod pp (backward: p with p - 1).

Every DP rank and step runs this same graph; ``timing.py`` evaluates it for all of them
at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwatch.schemas.optypes import CODE, OPTYPES
from rankwatch.sim.tracegen.schedule import Action, global_chunk, stage_actions


class ScheduleError(RuntimeError):
    """The generator built a graph the dependency model cannot run (a bug, not bad input)."""


@dataclass(frozen=True)
class GraphSizes:
    """What shapes the graph: parallel sizes, schedule, and which collectives exist."""

    pp: int
    vpp: int
    microbatches: int
    schedule: str
    dp_comm: bool  # DP collectives exist (dp > 1)
    overlap_grad_comm: bool


@dataclass(frozen=True)
class ScheduleGraph:
    """Ops of one step of one DP rank, indexed 0..N-1 (N = ``len(graph)``).

    ``deps[i]``: ops whose end precedes op i's start. ``group[i]``: index into ``groups``
    for communication ops (they end at the latest start of their group + their
    transfer), -1 for ops that end at their own start + duration. ``group_across_dp[g]``:
    the group spans every DP rank (DP collectives, the clip).
    """

    stage: np.ndarray  # int64 [N]
    optype: np.ndarray  # int8 [N], codes into OPTYPES
    seq_id: np.ndarray  # int64 [N]
    mc: np.ndarray  # int64 [N]
    gmc: np.ndarray  # int64 [N]
    mb_id: np.ndarray  # int64 [N]
    deps: tuple[tuple[int, ...], ...]
    group: np.ndarray  # int64 [N]
    groups: tuple[tuple[int, ...], ...]
    group_across_dp: np.ndarray  # bool [G]
    labels: tuple[str, ...]  # "2F0" for compute, "<optype>_<seq_id>_<stage>" otherwise

    def __len__(self) -> int:
        return int(self.stage.shape[0])


@dataclass
class _Op:
    stage: int
    optype: str
    seq_id: int
    mc: int
    gmc: int
    mb: int
    deps: list[int]
    label: str


@dataclass
class _Builder:
    ops: list[_Op] = field(default_factory=list)
    seq: dict[tuple[int, str], int] = field(default_factory=dict)

    def add(
        self,
        stage: int,
        optype: str,
        deps: list[int | None],
        *,
        mc: int = -1,
        gmc: int = -1,
        mb: int = -1,
        label: str = "",
    ) -> int:
        """Append an op; ops of one (stage, optype) must come in stream order (seq_id)."""
        seq = self.seq.get((stage, optype), 0)
        self.seq[stage, optype] = seq + 1
        clean = list(dict.fromkeys(d for d in deps if d is not None))
        label = label or f"{optype}_{seq}_{stage}"
        self.ops.append(_Op(stage, optype, seq, mc, gmc, mb, clean, label))
        return len(self.ops) - 1


_RECV = {"F": "forward-recv", "B": "backward-recv"}
_SEND = {"F": "forward-send", "B": "backward-send"}
_COMPUTE = {"F": "forward-compute", "B": "backward-compute"}


def build_graph(sizes: GraphSizes) -> ScheduleGraph:
    """The op graph of one model-parallel group; raises ScheduleError on a pairing bug."""
    b = _Builder()
    messages: dict[tuple[str, int, int], dict[str, int]] = {}
    clips: list[int] = []
    embeddings: list[int] = []
    for stage in range(sizes.pp):
        actions = stage_actions(sizes.schedule, sizes.pp, sizes.vpp, sizes.microbatches, stage)
        ends = _build_stage(b, sizes, stage, actions, messages)
        clips.append(ends["clip"])
        if "embedding" in ends:
            embeddings.append(ends["embedding"])
    groups, across = _groups(b, messages, clips, embeddings)
    graph = _freeze(b, groups, across)
    _check_pairing(graph)
    return graph


def _build_stage(
    b: _Builder,
    sizes: GraphSizes,
    stage: int,
    actions: list[Action],
    messages: dict[tuple[str, int, int], dict[str, int]],
) -> dict[str, int]:
    dp_prev, gathers = _add_param_gathers(b, sizes, stage)
    compute = _add_compute(b, sizes, stage, actions, gathers)
    _add_point_to_point(b, sizes, actions, compute, messages)
    gc = b.add(stage, "gc", [compute[-1]], mb=0)
    return _add_tail(b, sizes, stage, actions=actions, compute=compute, gc=gc, dp_prev=dp_prev)


def _add_param_gathers(b: _Builder, sizes: GraphSizes, stage: int) -> tuple[int | None, list[int]]:
    """One params-all-gather per model chunk at the step's start, on the DP stream."""
    if not sizes.dp_comm:
        return None, []
    gathers: list[int] = []
    for chunk in range(sizes.vpp):
        gathers.append(
            b.add(stage, "params-all-gather", [gathers[-1] if gathers else None], mc=chunk)
        )
    return gathers[-1], gathers


def _add_compute(
    b: _Builder, sizes: GraphSizes, stage: int, actions: list[Action], gathers: list[int]
) -> list[int]:
    """Compute ops in schedule order; a chunk's first forward waits for its all-gather."""
    compute: list[int] = []
    gathered: set[int] = set()
    for a in actions:
        deps: list[int | None] = [compute[-1] if compute else None]
        if a.kind == "F" and gathers and a.chunk not in gathered:
            gathered.add(a.chunk)
            deps.append(gathers[a.chunk])
        g = global_chunk(a, sizes.pp)
        compute.append(
            b.add(stage, _COMPUTE[a.kind], deps, mc=a.chunk, gmc=g, mb=a.mb, label=str(a))
        )
    return compute


def _peer_chunk(a: Action, pp: int, vpp: int, direction: str) -> int | None:
    """Global chunk on the other end of ``a``'s recv or send, or None at the model's ends."""
    g = global_chunk(a, pp)
    upstream = (a.kind == "F") == (direction == "recv")
    peer = g - 1 if upstream else g + 1
    return peer if 0 <= peer < pp * vpp else None


def _add_point_to_point(
    b: _Builder,
    sizes: GraphSizes,
    actions: list[Action],
    compute: list[int],
    messages: dict[tuple[str, int, int], dict[str, int]],
) -> None:
    """Recvs feed their compute, computes feed their sends (docs/whatif.md, "The dependency model").

    A recv is posted once the previous compute of its kind has finished (and its own
    stream is free); the first backward send/recv also waits for the forward compute two
    places before the stage's first backward (where Megatron posts the first backward
    recv). A message is keyed by (kind, receiving global chunk, microbatch).
    """
    first_b = next((i for i, a in enumerate(actions) if a.kind == "B"), None)
    anchor = compute[first_b - 2] if first_b is not None and first_b >= 2 else None
    previous_same_kind: list[int | None] = []
    last: dict[str, int | None] = {"F": None, "B": None}
    for pos, a in enumerate(actions):
        previous_same_kind.append(last[a.kind])
        last[a.kind] = compute[pos]
    prev: dict[str, int | None] = {}
    for pos, a in enumerate(actions):
        g = global_chunk(a, sizes.pp)
        if _peer_chunk(a, sizes.pp, sizes.vpp, "recv") is None:
            continue
        optype = _RECV[a.kind]
        deps = [prev.get(optype), previous_same_kind[pos]]
        if a.kind == "B" and optype not in prev:
            deps.append(anchor)
        recv = b.add(a.stage, optype, deps)
        b.ops[compute[pos]].deps.append(recv)
        prev[optype] = recv
        messages.setdefault((a.kind, g, a.mb), {})["recv"] = recv
    for pos, a in enumerate(actions):
        peer = _peer_chunk(a, sizes.pp, sizes.vpp, "send")
        if peer is None:
            continue
        optype = _SEND[a.kind]
        deps = [prev.get(optype), compute[pos]]
        if a.kind == "B" and optype not in prev:
            deps.append(anchor)
        send = b.add(a.stage, optype, deps)
        prev[optype] = send
        messages.setdefault((a.kind, peer, a.mb), {})["send"] = send


def _add_tail(
    b: _Builder,
    sizes: GraphSizes,
    stage: int,
    *,
    actions: list[Action],
    compute: list[int],
    gc: int,
    dp_prev: int | None,
) -> dict[str, int]:
    """gc -> layernorm -> embedding (first/last stage) -> DP grads -> clip -> optimizer."""
    ends: dict[str, int] = {}
    front: list[int | None] = [gc]
    if sizes.dp_comm and sizes.overlap_grad_comm:
        last_b = {a.chunk: pos for pos, a in enumerate(actions) if a.kind == "B"}
        for chunk in sorted(last_b, key=last_b.__getitem__):
            dp_prev = b.add(
                stage, "grads-reduce-scatter", [dp_prev, compute[last_b[chunk]]], mc=chunk
            )
        front.append(dp_prev)
    chain = b.add(stage, "layernorm-grads-all-reduce", front)
    if sizes.pp > 1 and stage in (0, sizes.pp - 1):
        chain = ends["embedding"] = b.add(stage, "embedding-grads-all-reduce", [chain])
    if sizes.dp_comm and not sizes.overlap_grad_comm:
        for chunk in reversed(range(sizes.vpp)):
            chain = dp_prev = b.add(stage, "grads-reduce-scatter", [chain, dp_prev], mc=chunk)
    elif sizes.dp_comm:
        chain = b.add(stage, "separate-grads-all-reduce", [chain])
    ends["clip"] = b.add(stage, "optimizer-clip-main-grad", [chain])
    b.add(stage, "optimizer", [ends["clip"]])
    return ends


_DP_COLLECTIVES = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")


def _groups(
    b: _Builder,
    messages: dict[tuple[str, int, int], dict[str, int]],
    clips: list[int],
    embeddings: list[int],
) -> tuple[list[tuple[int, ...]], list[bool]]:
    groups: list[tuple[int, ...]] = []
    across: list[bool] = []
    for key, pair in messages.items():
        if set(pair) != {"send", "recv"}:
            raise ScheduleError(f"message {key} lacks its {'send' if 'recv' in pair else 'recv'}")
        groups.append((pair["send"], pair["recv"]))
        across.append(False)
    for i, op in enumerate(b.ops):
        if op.optype in _DP_COLLECTIVES or op.optype == "layernorm-grads-all-reduce":
            groups.append((i,))
            across.append(op.optype != "layernorm-grads-all-reduce")
    if embeddings:
        groups.append(tuple(embeddings))
        across.append(False)
    groups.append(tuple(clips))
    across.append(True)
    return groups, across


def _freeze(b: _Builder, groups: list[tuple[int, ...]], across: list[bool]) -> ScheduleGraph:
    group = np.full(len(b.ops), -1, dtype=np.int64)
    for g, members in enumerate(groups):
        group[list(members)] = g

    def column(name: str) -> np.ndarray:
        return np.array([getattr(op, name) for op in b.ops], dtype=np.int64)

    return ScheduleGraph(
        stage=column("stage"),
        optype=np.array([CODE[op.optype] for op in b.ops], dtype=np.int8),
        seq_id=column("seq_id"),
        mc=column("mc"),
        gmc=column("gmc"),
        mb_id=column("mb"),
        deps=tuple(tuple(op.deps) for op in b.ops),
        group=group,
        groups=tuple(groups),
        group_across_dp=np.array(across, dtype=bool),
        labels=tuple(op.label for op in b.ops),
    )


def _check_pairing(graph: ScheduleGraph) -> None:
    """The engine pairs the n-th send with the n-th recv of the peer stage: make sure."""
    pp = int(graph.stage.max()) + 1
    for members in graph.groups:
        names = [OPTYPES[graph.optype[i]] for i in members]
        if len(members) != 2 or not names[0].endswith("-send"):
            continue
        send, recv = members
        step = 1 if names[0] == "forward-send" else -1
        if (graph.stage[send] + step) % pp != graph.stage[recv] or (
            graph.seq_id[send] != graph.seq_id[recv]
        ):
            raise ScheduleError(
                f"{graph.labels[send]} would pair with {graph.labels[recv]}: the "
                "schedule's send and recv orders disagree"
            )
