from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rankwatch.hooks.clock import Clock, estimate_offset
from rankwatch.hooks.identity import coordinates, identity_from_env, identity_from_groups


def test_offset_from_the_shortest_round_trip() -> None:
    # peer clock = ours + 1000; the second sample has the tightest round trip
    samples = [(0, 1_400, 600), (2_000, 3_050, 2_100), (5_000, 6_500, 5_900)]
    est = estimate_offset(samples)
    assert est.offset_ns == 3_050 - 2_050 == 1_000
    assert est.error_ns == 50
    assert est.samples == 3


def test_offset_refuses_bad_samples() -> None:
    with pytest.raises(ValueError):
        estimate_offset([])
    with pytest.raises(ValueError):
        estimate_offset([(10, 5, 0)])


def test_clock_anchors_the_monotonic_source_to_wall_time_and_applies_the_offset() -> None:
    ticks = iter([100, 150, 400])
    clock = Clock(read=lambda: next(ticks), wall=lambda: 1_000_000)
    assert clock.now_ns() == 1_000_000 + 50  # base = wall - first read
    clock.align(estimate_offset([(0, 7, 0)]))
    assert clock.to_wall(400) == 1_000_000 + 300 + 7
    assert clock.error_ns == 0


def test_megatron_order_coordinates() -> None:
    # tp fastest, then cp, then dp, then pp
    assert coordinates(0, dp_size=2, pp_size=2) == (0, 0, 0, 0)
    assert coordinates(1, dp_size=2, pp_size=2) == (1, 0, 0, 0)
    assert coordinates(2, dp_size=2, pp_size=2) == (0, 1, 0, 0)
    assert coordinates(5, dp_size=2, pp_size=2, tp_size=2) == (0, 1, 1, 0)
    with pytest.raises(ValueError):
        coordinates(4, dp_size=2, pp_size=2)


def test_identity_from_env_with_overrides() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "RANKWATCH_PP_SIZE": "2", "RANKWATCH_JOB": "jj"}
    ident = identity_from_env(env, host="h9")
    assert (ident.job, ident.host, ident.rank) == ("jj", "h9", 3)
    assert (ident.dp_rank, ident.pp_rank, ident.dp_size, ident.pp_size) == (1, 1, 2, 2)
    assert identity_from_env(env, dp_rank=0, job="x").dp_rank == 0


def test_identity_from_process_groups() -> None:
    ranks = {"dp": (1, 2), "pp": (3, 4), None: (7, 8)}

    def rank_in(group: Any = None) -> int:
        return ranks[group][0]

    def size_of(group: Any = None) -> int:
        return ranks[group][1]

    dist = SimpleNamespace(get_rank=rank_in, get_world_size=size_of)
    ident = identity_from_groups(dist, job="j", dp_group="dp", pp_group="pp", host="h")
    assert (ident.rank, ident.dp_rank, ident.pp_rank, ident.tp_rank) == (7, 1, 3, 0)
    assert (ident.dp_size, ident.pp_size) == (2, 4)
