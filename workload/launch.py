"""Start the workload's ranks on this machine and collect what they report.

One ``python -m rankwatch.workload.train`` process imports torch and forks the
ranks, with the torch launcher variables set (``MASTER_ADDR``/``PORT``,
``WORLD_SIZE``), one compute thread per rank and gloo on loopback. A rank that fails,
or a job that overruns, fails the job with the failing ranks' logs. This module does
not import torch (the test process need not pay for it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch.workload.config import CONFIG_ENV, OUT_ENV, WorkloadConfig


class WorkloadError(RuntimeError):
    """A rank of the workload failed or ran past its time limit."""


@dataclass(frozen=True)
class JobResult:
    config: WorkloadConfig
    ranks: list[dict[str, Any]]
    """What each rank reported (rank order)."""
    wall_s: float

    def step_times_s(self) -> list[float]:
        """Per step: last rank's end minus first rank's start, aligned clocks, seconds."""
        out = []
        for i in range(self.config.steps):
            starts = [r["steps"][i]["start_ns"] for r in self.ranks]
            ends = [r["steps"][i]["end_ns"] for r in self.ranks]
            out.append((max(ends) - min(starts)) / 1e9)
        return out

    def hook_stats(self) -> list[dict[str, int]]:
        return [r["hooks"] for r in self.ranks]

    def clock_error_ns(self) -> int:
        return max(max(r["clock_errors_ns"]) for r in self.ranks)

    def median_step_s(self, steps: list[int]) -> float:
        times = self.step_times_s()
        return statistics.median(times[s] for s in steps)


def torch_available() -> bool:
    """Whether the workload can run here (torch importable), without importing it."""
    return importlib.util.find_spec("torch") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(
    cfg: WorkloadConfig, out_dir: Path | None = None, timeout_s: float = 300.0
) -> JobResult:
    """Run every rank to completion; raise :class:`WorkloadError` if one fails."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="rankwatch-workload-"))
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    started = time.perf_counter()
    proc = _spawn(cfg, port, out)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    missing = [r for r in range(cfg.world) if not (out / f"rank{r}.json").exists()]
    if proc.returncode != 0 or missing:
        logs = "\n".join(f"--- rank {r}:\n{_tail(out / f'rank{r}.log')}" for r in missing)
        raise WorkloadError(
            f"workload failed (exit {proc.returncode}); ranks without a result: {missing}\n"
            f"{_tail(out / 'launcher.log')}\n{logs}"
        )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(cfg.world)]
    return JobResult(cfg, ranks, time.perf_counter() - started)


def _spawn(cfg: WorkloadConfig, port: int, out: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        CONFIG_ENV: cfg.to_json(),
        OUT_ENV: str(out),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(cfg.world),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RANK", None)
    log = (out / "launcher.log").open("wb")
    cmd = [sys.executable, "-m", "rankwatch.workload.train"]
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
