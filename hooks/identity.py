"""Who a rank is: job, host, global rank and its (dp, pp, tp, cp) coordinates.

Either from the process groups the job built (:func:`identity_from_groups`), or read
from the usual ``torch.distributed`` launcher variables (``RANK``, ``WORLD_SIZE``)
plus rankwatch's own (``RANKWATCH_JOB``, ``RANKWATCH_DP_RANK`` ...); whatever the user
passes explicitly wins. When only the sizes are known, the coordinates follow the
Megatron order (tp fastest, then cp, then dp, then pp), which is how the workload in
``workload/`` builds its groups too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Identity:
    job: str
    host: str
    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int = 0
    cp_rank: int = 0
    dp_size: int = 1
    pp_size: int = 1

    def header(self) -> dict[str, object]:
        """The identity fields of an ops message (heartbeats take the first seven)."""
        return {
            "job": self.job,
            "host": self.host,
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "pp_rank": self.pp_rank,
            "tp_rank": self.tp_rank,
            "cp_rank": self.cp_rank,
            "dp_size": self.dp_size,
            "pp_size": self.pp_size,
        }


def coordinates(
    rank: int, *, dp_size: int, pp_size: int, tp_size: int = 1, cp_size: int = 1
) -> tuple[int, int, int, int]:
    """(dp_rank, pp_rank, tp_rank, cp_rank) of ``rank`` in Megatron order: tp, cp, dp, pp."""
    if rank < 0 or rank >= dp_size * pp_size * tp_size * cp_size:
        raise ValueError(
            f"rank {rank} outside a job of dp {dp_size} x pp {pp_size} x tp {tp_size} "
            f"x cp {cp_size}"
        )
    tp = rank % tp_size
    cp = rank // tp_size % cp_size
    dp = rank // (tp_size * cp_size) % dp_size
    pp = rank // (tp_size * cp_size * dp_size)
    return dp, pp, tp, cp


def identity_from_groups(
    dist: Any,
    *,
    job: str,
    dp_group: Any = None,
    pp_group: Any = None,
    tp_group: Any = None,
    cp_group: Any = None,
    host: str = "",
) -> Identity:
    """An :class:`Identity` read from ``torch.distributed`` process groups.

    ``dist`` is the ``torch.distributed`` module (passed in: the hooks never import
    torch). A rank's coordinate along a dimension is its rank inside that dimension's
    group; a missing group means size 1. The pipeline group's ranks are in stage order.
    """

    def coord(group: Any) -> tuple[int, int]:
        if group is None:
            return 0, 1
        return int(dist.get_rank(group=group)), int(dist.get_world_size(group=group))

    dp, dp_size = coord(dp_group)
    pp, pp_size = coord(pp_group)
    return Identity(
        job=job,
        host=host or socket.gethostname() or "host",
        rank=int(dist.get_rank()),
        dp_rank=dp,
        pp_rank=pp,
        tp_rank=coord(tp_group)[0],
        cp_rank=coord(cp_group)[0],
        dp_size=dp_size,
        pp_size=pp_size,
    )


def identity_from_env(env: Mapping[str, str] | None = None, **given: object) -> Identity:
    """An :class:`Identity` from the environment, ``given`` values taking precedence.

    Needs at least the pipeline size (``pp_size`` or ``RANKWATCH_PP_SIZE``, default 1)
    and the world size to derive the data-parallel coordinates.
    """
    env = os.environ if env is None else env

    def pick(name: str, var: str, default: int) -> int:
        value = given.get(name)
        return int(value) if value is not None else int(env.get(var, default))  # type: ignore[call-overload]

    rank = pick("rank", "RANK", 0)
    world = int(env.get("WORLD_SIZE", 1))
    tp_size = pick("tp_size", "RANKWATCH_TP_SIZE", 1)
    cp_size = pick("cp_size", "RANKWATCH_CP_SIZE", 1)
    pp_size = pick("pp_size", "RANKWATCH_PP_SIZE", 1)
    default_dp = max(world // (tp_size * cp_size * pp_size), 1)
    dp_size = pick("dp_size", "RANKWATCH_DP_SIZE", default_dp)
    dp, pp, tp, cp = coordinates(
        rank, dp_size=dp_size, pp_size=pp_size, tp_size=tp_size, cp_size=cp_size
    )
    job = str(
        given.get("job") or env.get("RANKWATCH_JOB") or env.get("TORCHELASTIC_RUN_ID") or "job"
    )
    host = str(given.get("host") or env.get("RANKWATCH_HOST") or socket.gethostname() or "host")
    return Identity(
        job=job,
        host=host,
        rank=rank,
        dp_rank=pick("dp_rank", "RANKWATCH_DP_RANK", dp),
        pp_rank=pick("pp_rank", "RANKWATCH_PP_RANK", pp),
        tp_rank=pick("tp_rank", "RANKWATCH_TP_RANK", tp),
        cp_rank=pick("cp_rank", "RANKWATCH_CP_RANK", cp),
        dp_size=dp_size,
        pp_size=pp_size,
    )
