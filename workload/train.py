"""The workload's ranks: ``python -m rankwatch.workload.train`` (see launch.py).

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
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
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
from rankwatch.hooks.integrations import (
    LocalTimings,
    count_linear_flops,
    timed_batches,
    watch_gc_pauses,
    watch_pipeline,
)
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.session import HooksConfig, init
from rankwatch.hooks.tracker import RankWatch
from rankwatch.workload.clocksync import align_clocks
from rankwatch.workload.config import CONFIG_ENV, OUT_ENV, WorkloadConfig
from rankwatch.workload.model import StageModule, build_stage


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
    _network(cfg, rank)
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world, timeout=timeout)
    try:
        result = Rank(cfg, rank).train()
    finally:
        dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    return 0


def _network(cfg: WorkloadConfig, rank: int) -> None:
    """Put this rank's gloo traffic where the config says (before the process group)."""
    if cfg.master_addr:
        os.environ["MASTER_ADDR"] = cfg.master_addr
    if cfg.in_netns(rank):
        _enter_netns(cfg.netns)
        os.environ["GLOO_SOCKET_IFNAME"] = cfg.netns_ifname or "lo"
    elif cfg.gloo_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = cfg.gloo_ifname


def _enter_netns(name: str) -> None:
    """setns(2) into ``ip netns`` namespace ``name`` (needs root; this process only)."""
    import ctypes

    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
    finally:
        os.close(fd)


def _busy(seconds: float) -> None:
    """Untimed CPU work (a logging or checkpointing burst would look the same)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += sum(range(1000))


def _cyclic_graph(n: int) -> list[Any]:
    """``n`` objects in reference cycles: what a full collection must traverse."""
    nodes: list[Any] = []
    for i in range(0, n, 2):
        a: dict[str, Any] = {"i": i}
        b: dict[str, Any] = {"peer": a}
        a["peer"] = b
        nodes.append(a)
    return nodes


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
        self.fwd_flops, self.dtype = self._flops()
        self.live = _cyclic_graph(cfg.gc_live) if cfg.gc_rank == rank else []
        if self.rw is not None:
            watch_gc_pauses(self.rw)

    def _flops(self) -> tuple[int, str]:
        """Forward FLOPs of one microbatch through this rank's chunks, from shapes."""
        cfg = self.cfg
        x = torch.zeros(cfg.microbatch_size, cfg.seq, cfg.hidden)
        total, dtype = 0, ""
        with torch.no_grad():
            for m in self.modules:
                flops, dtype = count_linear_flops(m, partial(m, x))
                total += flops
        return total, dtype

    def _gc_in_forward(self) -> None:
        """Cyclic garbage, then the collection an allocation-heavy forward would trigger."""
        _cyclic_graph(2000)
        gc.collect()

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
        # the environment's hooks settings hold (RANKWATCH_HOOKS_SPOOL, RANKWATCH_RELAY,
        # RANKWATCH_OPS_FROM, ...) unless the workload's own config sets them
        hooks = HooksConfig.from_env(
            kafka=cfg.kafka,
            topic_prefix=cfg.topic_prefix,
            spool_dir=cfg.spool_dir or None,
            relay=cfg.relay or None,
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
        for step in range(cfg.steps):
            if cfg.data_wait_s and step >= cfg.fault_from:
                time.sleep(cfg.data_wait_s)
            yield torch.randn(shape, generator=self.gen), torch.randn(shape, generator=self.gen)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        gc.disable()  # collected once per step, timed, as Megatron's manual GC does
        estimate, errors = align_clocks(self.clock)
        steps = []
        data_waits = LocalTimings()
        batches = timed_batches(self.batches(), data_waits, rw=self.rw)
        for step, batch in enumerate(batches):
            if cfg.align_every and step and step % cfg.align_every == 0:
                estimate, errors = align_clocks(self.clock)
            if cfg.shape_cmd and self.rank == 0 and step == cfg.fault_from:
                subprocess.run(cfg.shape_cmd, shell=True, check=True)  # the study's own command
            slow = cfg.is_slow(self.rank, step)
            gc_fault = cfg.gc_rank >= 0 and cfg.faulty(self.rank, cfg.gc_rank, step)
            for m in self.modules:
                m.extra_matmuls = cfg.slow_matmuls if slow else 0
                m.on_forward = self._gc_in_forward if gc_fault else None
            if self.rw is not None:
                self.rw.enabled = cfg.hooks_on(step)
            start = self.clock.now_ns()
            self._step(step, *batch)
            steps.append({"step": step, "start_ns": start, "end_ns": self.clock.now_ns()})
            if cfg.inter_s and cfg.faulty(self.rank, cfg.inter_rank, step):
                _busy(cfg.inter_s)
            if cfg.pauses(self.rank, step):
                self._pause()
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
        if rw is not None:
            forward = self.fwd_flops * cfg.microbatches
            rw.work("forward-compute", forward)
            rw.work("backward-compute", 2 * forward)  # two matmuls per weight
            rw.samples(cfg.microbatch_size * cfg.microbatches, self.dtype)
        with _op(rw, "gc"):
            gc.collect(0)
        if self.rank == cfg.mismatch_rank and step == cfg.fault_from:
            with _op(rw, "separate-grads-all-reduce"):
                self._all_reduce_grads(group=None)  # the whole job, which never joins
        elif cfg.dp > 1:
            with _op(rw, "grads-reduce-scatter"):
                self._all_reduce_grads(group=self.dp_group)
        with _op(rw, "optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
        if rw is not None:
            rw.step_end()

    def _pause(self) -> None:
        """A checkpoint-like stop outside the steps, announced as a phase if so set."""
        cfg, rw = self.cfg, self.rw
        bound = cfg.pause_bound_s or None
        phase = rw.phase(cfg.pause_phase, bound) if rw is not None and cfg.pause_phase else None
        with phase or _Null():
            time.sleep(cfg.pause_s)

    def _all_reduce_grads(self, group: Any) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.rw is not None:
            size = flat.numel() * flat.element_size()
            ranks = self.cfg.dp if group is not None else self.cfg.world
            optype = "grads-reduce-scatter" if group is not None else "separate-grads-all-reduce"
            self.rw.comm(optype, size, group=ranks, algo="all-reduce")
        dist.all_reduce(flat, group=group)
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
