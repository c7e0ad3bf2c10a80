"""The dependency model of one (step, dp_rank): ops, the edges between them, their groups.

One :class:`OpGraph` serves every step and DP rank of a job (they all run the same
op names). Node ``i`` is one op name ``<optype>_<seq_id>_<stage>``; its inputs are

- ``deps(i)``: ops whose end it waits for (its stream predecessor, the recv that feeds
  a compute, the compute that feeds a send, the end-of-step chain);
- ``members(i)``: for a communication op, the ops of its communication group (itself
  included); it moves data only once every member has started. ``dp_wide[i]`` says
  the group spans all DP ranks too (DP collectives, the gradient-norm clip).

The graph is built by :func:`rankwatch.sim.inference.infer_graph` and checked there;
this module only holds it and the simulation plan derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwatch.schemas.optypes import CODE
from rankwatch.sim.naming import op_label, op_name

Buckets = tuple[tuple[np.ndarray, np.ndarray], ...]
"""Ragged index lists grouped by length: (rows (B,), values (B, K)) per length K."""

_SEQ_BITS = 20
_STAGE_BITS = 20


def op_keys(optype: np.ndarray, seq_id: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """One int64 per op name, for matching records to nodes without Python loops."""
    return (
        (optype.astype(np.int64) << (_SEQ_BITS + _STAGE_BITS))
        | (seq_id.astype(np.int64) << _STAGE_BITS)
        | stage.astype(np.int64)
    )


@dataclass(frozen=True)
class Level:
    """Ops whose start and end can be computed together (all their inputs are known).

    The simulator keeps its time tables in *plan order*: each level's ops occupy the
    consecutive rows ``begin:end`` (compute ops, then groups inside one DP rank, then
    groups spanning DP ranks), so results are written into slices, not scattered.
    ``compute_deps`` / ``comm_deps`` (L, K): plan rows of the dependencies' end times
    for the level's compute / communication ops, padded with N (the step start, 0).
    The members of a communication group sit on consecutive rows; ``*_runs`` list
    ``(first row, last row + 1, group size)`` for runs of equally sized groups, so a
    group's latest start is a reshape and a max, no gather. ``nodes``: the graph's op
    ids of rows ``begin:end``.
    """

    begin: int
    compute_end: int
    local_end: int
    end: int
    nodes: np.ndarray
    compute_deps: np.ndarray
    comm_deps: np.ndarray
    local_runs: tuple[tuple[int, int, int], ...]
    wide_runs: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class OpGraph:
    """Ops of one (step, dp_rank), their dependencies and communication groups."""

    dp_size: int
    pp_size: int
    vpp_size: int
    optype: np.ndarray  # (N,) int8 codes into OPTYPES
    seq_id: np.ndarray  # (N,) int64
    stage: np.ndarray  # (N,) int64
    mb_id: np.ndarray  # (N,) int64, -1 where none (labels only)
    dep_ptr: np.ndarray  # (N+1,) CSR offsets into dep_idx
    dep_idx: np.ndarray
    member_ptr: np.ndarray  # (N+1,) CSR offsets into member_idx; empty for compute ops
    member_idx: np.ndarray
    dp_wide: np.ndarray  # (N,) bool
    is_comm: np.ndarray  # (N,) bool
    skipped_keys: np.ndarray  # op keys recorded but modelled as no-ops (ignored)
    dep_buckets: Buckets = field(repr=False)  # deps, by count
    member_buckets: Buckets = field(repr=False)  # members of groups of 2 or more, by size
    lookup: np.ndarray = field(repr=False)  # (optype, seq_id, stage) -> node, -1 none, -2 no-op
    levels: tuple[Level, ...] = field(repr=False)
    final: np.ndarray = field(repr=False)  # nodes whose latest end is the step end
    final_rows: np.ndarray = field(repr=False)  # the same, as plan rows
    plan_nodes: np.ndarray = field(repr=False)  # (N,) the op at each plan row

    @property
    def size(self) -> int:
        return int(self.optype.shape[0])

    @property
    def keys(self) -> np.ndarray:
        return op_keys(self.optype, self.seq_id, self.stage)

    def deps(self, node: int) -> np.ndarray:
        return self.dep_idx[self.dep_ptr[node] : self.dep_ptr[node + 1]]

    def members(self, node: int) -> np.ndarray:
        return self.member_idx[self.member_ptr[node] : self.member_ptr[node + 1]]

    def name(self, node: int) -> str:
        return op_name(int(self.optype[node]), int(self.seq_id[node]), int(self.stage[node]))

    def label(self, node: int) -> str:
        """``backward-compute_3_2 (2B3)``: the name and, for compute ops, the shorthand."""
        return op_label(
            int(self.optype[node]),
            int(self.seq_id[node]),
            int(self.stage[node]),
            int(self.mb_id[node]),
        )

    def nodes_of(self, optype: str) -> np.ndarray:
        return np.flatnonzero(self.optype == CODE[optype])


def csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ints as (offsets, values)."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    flat = [v for x in lists for v in x]
    return ptr, np.asarray(flat, dtype=np.int64)


def buckets(lists: list[list[int]], min_len: int = 1) -> Buckets:
    """Ragged lists as :data:`Buckets` (lists shorter than ``min_len`` left out)."""
    by_len: dict[int, list[int]] = {}
    for i, values in enumerate(lists):
        if len(values) >= min_len:
            by_len.setdefault(len(values), []).append(i)
    return tuple(
        (np.asarray(rows, dtype=np.int64), np.asarray([lists[i] for i in rows], dtype=np.int64))
        for _, rows in sorted(by_len.items())
    )


def padded(lists: list[np.ndarray], pad: np.ndarray | int) -> np.ndarray:
    """Ragged index lists as an (L, K) matrix, short rows padded (K >= 1)."""
    width = max(1, max((len(x) for x in lists), default=0))
    out = np.empty((len(lists), width), dtype=np.int64)
    fill = np.broadcast_to(np.asarray(pad, dtype=np.int64), (len(lists),))
    for row, values in enumerate(lists):
        out[row, : len(values)] = values
        out[row, len(values) :] = fill[row]
    return out
