"""Scenario predictions against measured runs of the real gloo workload (docs/scenarios.md).

Run as root from the repo root (needs torch, ``ip netns``, ``tc`` with tbf, cgroup v1
``cpu``); each job takes 10-30 s on 2 cores:

    .venv/bin/python benchmarks/validate_scenarios.py [--cases network compute microbatches]
        [--repeats 5] [--steps 12] [--alt-steps 64] [--warmup 3]

Per case: configuration A is measured, the scenario model calibrated on A's hook trace
predicts B, and B is measured. Network and compute switch between A and B inside one
job (every 1 s / 2.5 s: ``tc qdisc change``, ``cpu.cfs_quota_us``); a step counts for
a phase when it ran wholly inside it, so load from other work on this shared machine
hits A and B alike. Microbatches need another graph: separate jobs, A B then B A.
Each job holds an exclusive ``flock`` of /work/helpers/measure.lock when it exists, and
the ranks run at nice -10 (``--nice``): at load 4-5 from other work a rank at nice 0
got about half a core, so a quota of half a core hardly bound.

- ``network``: PP 2 x DP 2, stage 0 (ranks 0, 1) in network namespace rw16a, stage 1
  (ranks 2, 3) in rw16b, joined by a veth pair rate-limited with ``tc ... tbf`` on
  both ends; A at 200 Mbit/s, B at 50 Mbit/s. Gloo binds each rank to its
  namespace's veth address (``GLOO_SOCKET_IFNAME``; ``MASTER_ADDR`` = rw16a's
  address), so pipeline sends cross the shaped link while the DP all-reduce stays on
  the namespace's own loopback (intra-host). Scenario: ``network.inter_gbps=0.05``
  from ``hardware.inter_gbps: 0.2``, with the activations' size per send.
- ``compute``: PP 2 x DP 1, each rank in its own cgroup; A without a CPU quota, B
  with ``cpu.cfs_quota_us = cpu.cfs_period_us / 2`` (half a core each, 10 ms
  period). Scenario: ``gpu.speed=0.5``.
- ``microbatches``: PP 2 x DP 2 on loopback, 4 -> 8 microbatches (same microbatch
  size). Scenario: ``microbatches=8``.

Predicted B = measured A / the scenario's speedup (the model predicts the change; the
CPU-side launch gaps the simulation leaves out are carried over from A). Prints one
JSON line per job and the report: medians with min/max over repeats, the error of
each repeat, and per op type the measured median cost at A and B beside the predicted
one (where a miss comes from). The namespaces and cgroups are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rankwatch.schemas.optypes import OPTYPES
from rankwatch.sim import JobMeta, Trace
from rankwatch.sim.scenario import Hardware, Scenario, calibrate_trace, run_scenarios
from rankwatch.sim.scenario.reshape import reshape
from rankwatch.sim.scenario.retime import scenario_costs
from rankwatch.validation import assembled_steps, concat
from rankwatch.workload.config import CONFIG_ENV, OUT_ENV, WorkloadConfig
from rankwatch.workload.launch import free_port, run_job

LOCK = Path("/work/helpers/measure.lock")
NS = ("rw16a", "rw16b")
VETH = ("rw16va", "rw16vb")
ADDR = ("10.216.0.1", "10.216.0.2")
CGROUP = Path("/sys/fs/cgroup/cpu/rw16")
PERIOD_US = [10_000]
"""The cgroups' CFS period (``--cfs-period-us``): the quota is handed out per period."""
MARGIN_NS = 20_000_000
"""A step counts for a phase only if it starts this long after the switch."""


@dataclass(frozen=True)
class Run:
    """One measured job: median step time over the kept steps, and their trace."""

    step_s: float
    trace: Trace
    meta: JobMeta
    steps: int


@dataclass(frozen=True)
class Case:
    name: str
    a: WorkloadConfig
    b: WorkloadConfig
    scenario: dict[str, object]
    hardware: Hardware
    runner: str  # "netns", "cgroup" or "plain"
    a_env: dict[str, Any]
    b_env: dict[str, Any]
    period_s: float = 1.0  # A/B phase length when they alternate inside one job


def base_config(**changes: Any) -> WorkloadConfig:
    return replace(
        WorkloadConfig(dp=2, pp=2, microbatches=4, hidden=128, seq=32, microbatch_size=4),
        blocks_per_stage=2,
        **changes,
    )


def cases(steps: int, alt_steps: int) -> dict[str, Case]:
    net = base_config(steps=alt_steps, job="scn-net")
    activation = net.microbatch_size * net.seq * net.hidden * 4  # float32 bytes per send
    p2p = ("forward-send", "forward-recv", "backward-send", "backward-recv")
    comp = base_config(steps=alt_steps, dp=1, hidden=256, seq=64, job="scn-cpu")
    mb = base_config(steps=steps, job="scn-mb")
    return {
        "network": Case(
            "network", net, net, {"network.inter_gbps": 0.05},
            Hardware(inter_gbps=0.2, gpus_per_host=2, bytes={p: activation for p in p2p},
                     collective={"grads-reduce-scatter": "all-reduce"}),
            "netns", {"rate_mbit": 200}, {"rate_mbit": 50},
        ),
        "compute": Case(
            "compute", comp, comp, {"gpu.speed": 0.5}, Hardware(gpus_per_host=1),
            "cgroup", {"quota": None}, {"quota": 0.5}, period_s=2.5,
        ),
        "microbatches": Case(
            "microbatches", mb, replace(mb, microbatches=8), {"microbatches": 8},
            Hardware(gpus_per_host=4, collective={"grads-reduce-scatter": "all-reduce"}),
            "plain", {}, {},
        ),
    }  # fmt: skip


# -- running the workload ----------------------------------------------------------------


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Exclusive use of the machine for timing (others' studies wait on the same lock)."""
    if not LOCK.exists():
        yield
        return
    with LOCK.open() as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure(case: Case, which: str, warmup: int) -> Run:
    """A job run wholly in configuration ``which`` (the microbatch case)."""
    cfg = case.a if which == "a" else case.b
    ranks, assembled = run_workload(case, cfg, None)
    kept = [s for s in range(warmup, cfg.steps) if s in assembled]
    return to_run(ranks, assembled, kept, cfg)


def measure_alternating(case: Case, warmup: int, period_s: float) -> tuple[Run, Run]:
    """One job whose link rate or CPU quota switches between A and B every ``period_s``:
    steps that ran wholly inside one phase count for it (a change of load on this shared
    machine then hits A and B alike)."""
    switches: list[tuple[int, str]] = []
    stop = threading.Event()

    def toggle() -> None:
        which = "a"
        while not stop.is_set():
            apply(case, which)
            switches.append((time.time_ns(), which))
            stop.wait(period_s)
            which = "b" if which == "a" else "a"

    ranks, assembled = run_workload(case, case.a, toggle, stop)
    phase = {"a": [], "b": []}  # type: dict[str, list[int]]
    for step in range(warmup, case.a.steps):
        t0 = min(r["steps"][step]["start_ns"] for r in ranks)
        t1 = max(r["steps"][step]["end_ns"] for r in ranks)
        which = inside_phase(switches, t0, t1)
        if which and step in assembled:
            phase[which].append(step)
    return (
        to_run(ranks, assembled, phase["a"], case.a),
        to_run(ranks, assembled, phase["b"], case.a),
    )


def inside_phase(switches: list[tuple[int, str]], t0: int, t1: int) -> str | None:
    """The phase a step [t0, t1] lies in wholly (MARGIN_NS after its switch), else None."""
    for k, (at, which) in enumerate(switches):
        until = switches[k + 1][0] if k + 1 < len(switches) else 2**63
        if at + MARGIN_NS <= t0 and t1 <= until:
            return which
    return None


def apply(case: Case, which: str) -> None:
    env = case.a_env if which == "a" else case.b_env
    if case.runner == "netns":
        shape_link(env["rate_mbit"])
    elif case.runner == "cgroup":
        set_quota(case.a.world, env["quota"])


def run_workload(
    case: Case,
    cfg: WorkloadConfig,
    toggle: Any = None,
    stop: threading.Event | None = None,
) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    with tempfile.TemporaryDirectory(prefix="scn-") as tmp:
        spool, out = Path(tmp) / "spool", Path(tmp) / "out"
        out.mkdir()
        cfg = replace(cfg, spool_dir=str(spool), seed=int(time.time()) % 1000)
        with measuring():
            thread = threading.Thread(target=toggle, daemon=True) if toggle else None
            if thread is not None:
                thread.start()
            try:
                if case.runner == "plain":
                    ranks = run_job(cfg, out).ranks
                else:
                    ranks = launch_ranks(cfg, out, netns=case.runner == "netns")
            finally:
                if thread is not None and stop is not None:
                    stop.set()
                    thread.join()
        return ranks, assembled_steps(spool)


def to_run(
    ranks: list[dict[str, Any]], assembled: dict[int, Any], kept: list[int], cfg: WorkloadConfig
) -> Run:
    if len(kept) < 2:
        raise RuntimeError(f"only {len(kept)} step(s) to use: raise --steps")
    times = [
        (
            max(r["steps"][s]["end_ns"] for r in ranks)
            - min(r["steps"][s]["start_ns"] for r in ranks)
        )
        / 1e9
        for s in kept
    ]
    trace = concat([assembled[s] for s in kept])
    return Run(statistics.median(times), trace, JobMeta(dp_size=cfg.dp, pp_size=cfg.pp), len(kept))


def launch_ranks(cfg: WorkloadConfig, out: Path, netns: bool = False) -> list[dict[str, Any]]:
    """One process per rank (so each can live in its own namespace / cgroup)."""
    port = free_port() if not netns else 29500 + int(time.time()) % 1000
    procs = []
    for rank in range(cfg.world):
        host = rank // (cfg.world // 2) if netns else 0
        env = {
            **os.environ,
            CONFIG_ENV: cfg.to_json(),
            OUT_ENV: str(out),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(cfg.world),
            "MASTER_ADDR": ADDR[0] if netns else "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": VETH[host] if netns else "lo",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "rankwatch.workload.train"]
        if netns:
            cmd = ["ip", "netns", "exec", NS[host], *cmd]
        log = (out / f"rank{rank}.log").open("wb")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        if not netns:  # the compute case: each rank in its own CPU cgroup
            (CGROUP / f"rank{rank}" / "cgroup.procs").write_text(str(proc.pid))
        procs.append(proc)
    for rank, proc in enumerate(procs):
        if proc.wait(600) != 0:
            raise RuntimeError(
                f"rank {rank} failed:\n{(out / f'rank{rank}.log').read_text()[-3000:]}"
            )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(cfg.world)]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def setup_netns() -> None:
    teardown_netns()
    for ns in NS:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    for i in range(2):
        sh("ip", "link", "set", VETH[i], "netns", NS[i])
        sh("ip", "-n", NS[i], "addr", "add", f"{ADDR[i]}/24", "dev", VETH[i])
        sh("ip", "-n", NS[i], "link", "set", VETH[i], "up")
        sh("ip", "-n", NS[i], "link", "set", "lo", "up")


def shape_link(rate_mbit: int) -> None:
    """tbf on both ends of the veth pair (never on lo or eth0). ``change`` keeps the
    queue (``replace`` would drop it: TCP loss recovery, slow steps in both phases)."""
    for i in range(2):
        verb = "change" if _shaped(VETH[i], NS[i]) else "add"
        sh("ip", "netns", "exec", NS[i], "tc", "qdisc", verb, "dev", VETH[i], "root",
           "tbf", "rate", f"{rate_mbit}mbit", "burst", "32kb", "latency", "200ms")  # fmt: skip


def _shaped(dev: str, ns: str) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return "tbf" in out


def teardown_netns() -> None:
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def setup_cgroups(world: int) -> None:
    for rank in range(world):
        group = CGROUP / f"rank{rank}"
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US[0]))


def set_quota(world: int, quota: float | None) -> None:
    for rank in range(world):
        value = -1 if quota is None else int(PERIOD_US[0] * quota)
        (CGROUP / f"rank{rank}" / "cpu.cfs_quota_us").write_text(str(value))


def teardown_cgroups() -> None:
    if CGROUP.exists():
        for group in sorted(CGROUP.glob("rank*")):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            CGROUP.rmdir()


# -- prediction and the report -------------------------------------------------------------


def predict(case: Case, a: Run) -> tuple[float, float, dict[str, float]]:
    """(predicted B step, the scenario's speedup, predicted median cost per op type at B)."""
    cal = calibrate_trace(a.trace, a.meta, case.hardware)
    _, changed = run_scenarios(cal, [Scenario.of({}), Scenario.of(case.scenario)])
    scenario = Scenario.of(case.scenario)
    g = cal.graph
    dp = int(scenario.settings.get("parallel.dp", g.dp_size))
    pp = int(scenario.settings.get("parallel.pp", g.pp_size))
    m = int(scenario.settings.get("microbatches", a.trace.mb_id.max() + 1))
    shape = reshape(g, dp, pp, m)
    cost = scenario_costs(cal, shape, scenario.settings)
    per_type = {
        OPTYPES[c]: float(np.median(cost[shape.graph.optype == c]))
        for c in np.unique(shape.graph.optype).tolist()
    }
    return a.step_s / changed.speedup, changed.speedup, per_type


def op_medians(run: Run) -> dict[str, float]:
    cal = calibrate_trace(run.trace, run.meta)
    return {f.optype: f.median_s for f in cal.optypes}


def simulated(run: Run, hardware: Hardware) -> float:
    cal = calibrate_trace(run.trace, run.meta, hardware)
    return run_scenarios(cal, [Scenario.of({})])[0].step_time_s


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_case(case: Case, repeats: int, warmup: int) -> dict[str, Any]:
    if case.runner == "cgroup":
        setup_cgroups(case.a.world)
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(repeats):
            if case.runner == "plain":  # another graph: separate jobs, order alternating
                order = ("a", "b") if rep % 2 == 0 else ("b", "a")
                got = {which: measure(case, which, warmup) for which in order}
                a, b = got["a"], got["b"]
            else:
                a, b = measure_alternating(case, warmup, case.period_s)
            runs.append(compare(case, a, b))
            print(json.dumps({case.name: runs[-1]}), flush=True)
    finally:
        if case.runner == "cgroup":
            teardown_cgroups()
    keys = ("measured_a", "measured_b", "predicted_b", "error", "measured_speedup",
            "predicted_speedup", "simulated_a", "simulated_b")  # fmt: skip
    return {**{k: spread([r[k] for r in runs]) for k in keys}, "runs": runs}


def compare(case: Case, a: Run, b: Run) -> dict[str, Any]:
    predicted, speedup, per_type = predict(case, a)
    return {
        "measured_a": a.step_s,
        "measured_b": b.step_s,
        "predicted_b": predicted,
        "error": predicted / b.step_s - 1,
        "measured_speedup": a.step_s / b.step_s,
        "predicted_speedup": speedup,
        "simulated_a": simulated(a, case.hardware),
        "simulated_b": simulated(b, case.hardware),
        "steps_a": a.steps,
        "steps_b": b.steps,
        "op_a": op_medians(a),
        "op_b": op_medians(b),
        "op_predicted_b": per_type,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["network", "compute", "microbatches"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="steps per job (microbatches)")
    parser.add_argument("--alt-steps", type=int, default=48, help="steps per alternating job")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--nice", type=int, default=-10, help="niceness increment of the ranks")
    parser.add_argument("--cfs-period-us", type=int, default=PERIOD_US[0], help="compute case")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: network namespaces, tc and cgroups")
    PERIOD_US[0] = args.cfs_period_us
    os.nice(args.nice)  # inherited by every rank: other work on the machine steals less
    chosen = cases(args.steps, args.alt_steps)
    report: dict[str, Any] = {"config": vars(args), "cases": {}}
    if "network" in args.cases:
        setup_netns()
    try:
        for name in args.cases:
            report["cases"][name] = run_case(chosen[name], args.repeats, args.warmup)
    finally:
        teardown_netns()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
