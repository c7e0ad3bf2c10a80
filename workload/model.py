"""A small transformer-like model cut into pipeline stages.

Each block is pre-norm single-head self-attention plus an MLP, with residuals; the
first stage owns the input projection and the last one the output head. The
straggler knob (``extra_matmuls``) does real compute inside ``forward`` on the
training thread, which on a shared CPU slows the rank the way a slow GPU would (a
sleep would free the core for the other ranks instead).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

STRAGGLER_DIM = 256


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x_BSH)).chunk(3, dim=-1)
        scores_BSS = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        x_BSH = x_BSH + self.proj(scores_BSS.softmax(dim=-1) @ v)
        return x_BSH + self.mlp(self.norm2(x_BSH))


class StageModule(nn.Module):
    """One model chunk: blocks, plus the input projection (first) or head (last)."""

    def __init__(self, hidden: int, blocks: int, first: bool, last: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(hidden, hidden) if first else nn.Identity()
        self.blocks = nn.Sequential(*(Block(hidden) for _ in range(blocks)))
        self.head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden)) if last else None
        self.extra_matmuls = 0
        self.on_forward: Callable[[], None] | None = None
        """Called at the start of each forward (the GC fault of the slowdown study)."""
        # orthogonal, so that a chain of products keeps its magnitude: a matrix scaled
        # down (0.01 * randn) drove the chain into subnormal floats after ~40 products,
        # which cost 25x more per matmul on Intel CPUs (microcode assists) and made the
        # "100 matmuls" straggler 20x slower there than on AMD
        straggler, _ = torch.linalg.qr(torch.randn(STRAGGLER_DIM, STRAGGLER_DIM))
        self.register_buffer("_straggler", straggler)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        if self.on_forward is not None:
            self.on_forward()
        if self.extra_matmuls:
            self._burn(self.extra_matmuls)
        x_BSH = self.blocks(self.inp(x_BSH))
        return self.head(x_BSH) if self.head is not None else x_BSH

    @torch.no_grad()
    def _burn(self, n: int) -> None:
        m: torch.Tensor = self._straggler  # type: ignore[assignment]
        acc = m
        for _ in range(n):
            acc = acc @ m


def build_stage(hidden: int, blocks: int, stage_index: int, num_stages: int) -> StageModule:
    torch.manual_seed(1000 + stage_index)  # every DP replica starts from the same weights
    return StageModule(hidden, blocks, stage_index == 0, stage_index == num_stages - 1)
