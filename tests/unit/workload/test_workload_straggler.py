"""The workload's straggler knob costs the same per matmul however long the chain."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rankwatch.workload.model import build_stage  # noqa: E402


def test_a_chain_of_straggler_products_never_reaches_subnormal_floats() -> None:
    """Subnormal operands cost 25x more per matmul on Intel CPUs: a chain that decays
    into them made the heavy straggler 20x slower there than on AMD (CI saw it)."""
    m = build_stage(hidden=16, blocks=1, stage_index=0, num_stages=2)._straggler
    acc = m
    for _ in range(200):
        acc = acc @ m
    magnitude = float(acc.abs().max())
    assert 1e-2 < magnitude < 1e2
    assert float(acc[acc != 0].abs().min()) > torch.finfo(torch.float32).tiny
