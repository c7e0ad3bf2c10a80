"""The workload's ranks: ``python -m rankwatch.hooks.workload.train`` (see launch.py).

Reads its settings from ``RANKWATCH_WORKLOAD`` (JSON of :class:`WorkloadConfig`) and
``WORLD_SIZE``/``MASTER_*``; each rank writes ``rank<r>.json`` (step times, hook
counters, clock error) and ``rank<r>.log`` into ``RANKWATCH_WORKLOAD_OUT``. Without
``RANK`` the process imports torch once and forks every rank (importing torch costs
seconds per process on a busy 2-core machine); with ``RANK`` it is that one rank.

Per step: the pipeline schedule (forward/backward compute and p2p timed by
:func:`rankwatch.hooks.integrations.watch_pipeline`), a manual collection (``gc``, as
Megatron does), the data-parallel gradient all-reduce (recorded as
``grads-reduce-scatter``, the non-overlapped DP gradient collective of the model), the
optimizer step.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining import schedules as pipelining_schedules

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import coordinates, identity_from_groups
from rankwatch.hooks.integrations import LocalTimings, timed_batches, watch_pipeline
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.session import HooksConfig, init
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.workload.clocksync import align_clocks
from rankwatch.hooks.workload.config import CONFIG_ENV, OUT_ENV, WorkloadConfig
from rankwatch.hooks.workload.model import StageModule, build_stage


def main() -> int:
    torch.set_num_threads(1)
    if "RANK" not in os.environ:
        return fork_ranks()
    return run_rank(int(os.environ["RANK"]))


def fork_ranks() -> int:
    """Fork one child per rank; when one fails, kill the others (they would only wait
    for the process group timeout). Exit status 0 when every rank succeeded."""
    cfg = WorkloadConfig.from_json(os.environ[CONFIG_ENV])
    out = Path(os.environ[OUT_ENV])
    children: dict[int, int] = {}
    for rank in range(cfg.world):
        pid = os.fork()
        if pid == 0:  # the child: its own log, then the rank's work
            log = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
            code = 1
            try:
                code = run_rank(rank)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    status = 0
    while children:
        pid, code = os.wait()
        children.pop(pid, None)
        if code != 0 and status == 0:
            status = 1
            for other in children:
                os.kill(other, signal.SIGKILL)
    return status


def run_rank(rank: int) -> int:
    cfg = WorkloadConfig.from_json(os.environ[CONFIG_ENV])
    out = Path(os.environ[OUT_ENV])
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world, timeout=timeout)
    try:
        result = Rank(cfg, rank).train()
    finally:
        dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    return 0


class Rank:
    def __init__(self, cfg: WorkloadConfig, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.dp_rank, self.pp_rank, _, _ = coordinates(rank, dp_size=cfg.dp, pp_size=cfg.pp)
        self.pp_group, self.dp_group = self._groups()
        self.clock = Clock()
        self.rw = self._hooks()
        self.modules = self._modules()
        self.schedule = self._schedule()
        params = [p for m in self.modules for p in m.parameters()]
        self.params = params
        self.optimizer = torch.optim.SGD(params, lr=0.01)
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + self.dp_rank)

    # -- setup -------------------------------------------------------------------------

    def _groups(self) -> tuple[Any, Any]:
        """Every rank creates every group (new_group is collective), keeps its own."""
        cfg, timeout = self.cfg, timedelta(seconds=self.cfg.timeout_s)
        pp_group = dp_group = None
        for d in range(cfg.dp):
            g = dist.new_group([p * cfg.dp + d for p in range(cfg.pp)], timeout=timeout)
            pp_group = g if d == self.dp_rank else pp_group
        for p in range(cfg.pp):
            g = dist.new_group([p * cfg.dp + d for d in range(cfg.dp)], timeout=timeout)
            dp_group = g if p == self.pp_rank else dp_group
        return pp_group, dp_group

    def _hooks(self) -> RankWatch | None:
        cfg = self.cfg
        if not cfg.hooks:
            return None
        identity = identity_from_groups(
            dist, job=cfg.job, dp_group=self.dp_group, pp_group=self.pp_group
        )
        hooks = HooksConfig(
            kafka=cfg.kafka,
            topic_prefix=cfg.topic_prefix,
            spool_dir=cfg.spool_dir,
            publisher=PublisherConfig(flush_interval_s=0.25, heartbeat_s=2.0),
        )
        return init(hooks, identity=identity, clock=self.clock)

    def _modules(self) -> list[StageModule]:
        cfg = self.cfg
        n = cfg.pp * cfg.chunks
        return [
            build_stage(cfg.hidden, cfg.blocks_per_stage, c * cfg.pp + self.pp_rank, n)
            for c in range(cfg.chunks)
        ]

    def _schedule(self) -> Any:
        cfg = self.cfg
        n = cfg.pp * cfg.chunks
        stages: list[Any] = [
            PipelineStage(m, c * cfg.pp + self.pp_rank, n, torch.device("cpu"), group=self.pp_group)
            for c, m in enumerate(self.modules)
        ]
        if self.rw is not None:
            watch_pipeline(self.rw, stages, pipelining_schedules)
        loss = torch.nn.functional.mse_loss
        if cfg.schedule == "interleaved":
            return ScheduleInterleaved1F1B(stages, cfg.microbatches, loss_fn=loss)
        kind = Schedule1F1B if cfg.schedule == "1f1b" else ScheduleGPipe
        return kind(stages[0], cfg.microbatches, loss_fn=loss)

    # -- training ----------------------------------------------------------------------

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        shape = (cfg.microbatch_size * cfg.microbatches, cfg.seq, cfg.hidden)
        for _ in range(cfg.steps):
            if cfg.data_wait_s:
                time.sleep(cfg.data_wait_s)
            yield torch.randn(shape, generator=self.gen), torch.randn(shape, generator=self.gen)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        gc.disable()  # collected once per step, timed, as Megatron's manual GC does
        estimate, errors = align_clocks(self.clock)
        steps = []
        data_waits = LocalTimings()
        batches = timed_batches(self.batches(), data_waits)
        for step, batch in enumerate(batches):
            if cfg.align_every and step and step % cfg.align_every == 0:
                estimate, errors = align_clocks(self.clock)
            slow = cfg.is_slow(self.rank, step)
            for m in self.modules:
                m.extra_matmuls = cfg.slow_matmuls if slow else 0
            if self.rw is not None:
                self.rw.enabled = cfg.hooks_on(step)
            start = self.clock.now_ns()
            self._step(step, *batch)
            steps.append({"step": step, "start_ns": start, "end_ns": self.clock.now_ns()})
        stats = self.rw.close().as_dict() if self.rw is not None else {}
        gc.enable()
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "pp_rank": self.pp_rank,
            "steps": steps,
            "slow_steps": [s for s in range(cfg.steps) if cfg.is_slow(cfg.slow_rank, s)],
            "hooks": stats,
            "clock": {"offset_ns": estimate.offset_ns, "error_ns": estimate.error_ns},
            "clock_errors_ns": errors,
            "data_wait_s": data_waits.total_ns / 1e9,
        }

    def _step(self, step: int, x: torch.Tensor, target: torch.Tensor) -> None:
        cfg, rw = self.cfg, self.rw
        if rw is not None:
            rw.step_begin(step)
        first = self.pp_rank == 0
        last = self.pp_rank == cfg.pp - 1
        args = (x,) if first else ()
        self.schedule.step(*args, target=target if last else None)
        with _op(rw, "gc"):
            gc.collect(0)
        if cfg.dp > 1:
            with _op(rw, "grads-reduce-scatter"):
                self._all_reduce_grads()
        with _op(rw, "optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
        if rw is not None:
            rw.step_end()

    def _all_reduce_grads(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.cfg.dp
        offset = 0
        for p, g in zip(self.params, grads, strict=True):
            n = g.numel()
            if p.grad is not None:
                p.grad.copy_(flat[offset : offset + n].view_as(g))
            offset += n


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _op(rw: RankWatch | None, optype: str) -> Any:
    return _Null() if rw is None else rw.op(optype)


if __name__ == "__main__":
    raise SystemExit(main())
