"""Clock offsets to rank 0 over the default process group (ping-pong with gloo).

Rank 0 answers each other rank in turn with its clock reading; a rank keeps the
sample with the shortest round trip (:func:`rankwatch.hooks.clock.estimate_offset`).
Returns every rank's residual error bound, gathered, so the job can report it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rankwatch.hooks.clock import Clock, OffsetEstimate, estimate_offset

ROUNDS = 8


def align_clocks(clock: Clock, rounds: int = ROUNDS) -> tuple[OffsetEstimate, list[int]]:
    """Estimate this rank's offset to rank 0 and apply it; returns (estimate, all errors)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(1, dtype=torch.int64)
    samples: list[tuple[int, int, int]] = []
    for peer in range(1, world):
        for _ in range(rounds):
            if rank == 0:
                dist.recv(buf, src=peer)
                buf[0] = clock.local_ns()
                dist.send(buf, dst=peer)
            elif rank == peer:
                t0 = clock.local_ns()
                dist.send(buf, dst=0)
                dist.recv(buf, src=0)
                samples.append((t0, int(buf[0]), clock.local_ns()))
    estimate = estimate_offset(samples) if samples else OffsetEstimate(0, 0, 0)
    clock.align(estimate)
    errors = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(errors, torch.tensor([estimate.error_ns], dtype=torch.int64))
    return estimate, [int(e[0]) for e in errors]
