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
    """Nodes whose start and end can be computed together (all inputs known).

    ``dep_rows`` (L, K) index the end-time table (row N = step start, 0), padded with N.
    ``*_members`` (C, K') index the start-time table, padded with the node itself;
    ``local`` groups sit inside one DP rank, ``dp_wide`` ones span all DP ranks.
    """

    nodes: np.ndarray
    dep_rows: np.ndarray
    compute: np.ndarray
    local: np.ndarray
    local_members: np.ndarray
    dp_wide: np.ndarray
    dp_wide_members: np.ndarray


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
    dep_rows: np.ndarray = field(repr=False)  # (N, K) deps padded with N (the step start)
    member_rows: np.ndarray = field(repr=False)  # (N, K') group members padded with self
    levels: tuple[Level, ...] = field(repr=False)
    final: np.ndarray = field(repr=False)  # nodes whose latest end is the step end

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


def padded(lists: list[np.ndarray], pad: np.ndarray | int) -> np.ndarray:
    """Ragged index lists as an (L, K) matrix, short rows padded (K >= 1)."""
    width = max(1, max((len(x) for x in lists), default=0))
    out = np.empty((len(lists), width), dtype=np.int64)
    fill = np.broadcast_to(np.asarray(pad, dtype=np.int64), (len(lists),))
    for row, values in enumerate(lists):
        out[row, : len(values)] = values
        out[row, len(values) :] = fill[row]
    return out
