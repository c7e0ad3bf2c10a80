"""Ground truth for the slowdowns the what-if cannot see (docs/detection.md, section 3).

Runs the real gloo workload (DP 2 x PP 2, 4 ranks on CPU) healthy and with one injected
cause from step ``--fault-from`` on, stores each run through the ops pipeline into a
chDB store, asks ``diagnose`` what kind of slowdown it has, and checks the cause and the
ranks it names against what was injected; healthy runs must raise no signal alert.
Runs are interleaved (healthy, compute, network, ... then again) so that the box's load
spreads over every cause alike.

Causes:

- ``compute``: rank 1 does extra matmuls inside every forward (a throttled device):
  expected ``straggler compute`` on rank 1.
- ``network``: ranks 1 and 3 (DP rank 1) live in a network namespace joined by a veth
  pair, so the DP gradient all-reduce of both stages crosses it; from the fault step the
  veth is rate-limited with ``tc tbf`` both ways (netem is not available here; loopback
  and eth0 are never shaped): expected ``everyone-slow network`` on every rank.
- ``link``: only rank 3 behind the veth: stage 1's DP all-reduce (ranks 2 and 3) and
  the 1 <-> 3 pipeline link cross it: expected ``straggler network`` on ranks 2 and 3
  (stage 0's all-reduce stays on loopback).
- ``gc``: rank 2 triggers a full collection of a 30k-object cyclic graph inside each
  forward: expected ``GC`` on rank 2.
- ``cpu``: every rank does 30 ms of untimed CPU work between steps: ``hidden CPU work``.
- ``data``: every step waits 30 ms for its batch: ``input pipeline``.

Needs root for the namespace (the network cause is skipped otherwise, and says so).
Run it under the measurement lock::

    flock /work/helpers/measure.lock .venv/bin/python benchmarks/study_slowdowns.py --runs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch.commands.diagnose import diagnose_stored
from rankwatch.ingest import run_embedded_workload
from rankwatch.streams.kit.store import Store
from rankwatch.streams.slowdown.detector import DetectorConfig, SlowdownDetector
from rankwatch.streams.slowdown.diagnosis import diagnose
from rankwatch.streams.slowdown.signals import Signals
from rankwatch.workload.config import WorkloadConfig

NETNS, VETH, PEER = "rwstudy", "rwv0", "rwv1"
ADDR, PEER_ADDR = "10.231.0.1", "10.231.0.2"
RATE = "32mbit"
ALL = [0, 1, 2, 3]


@dataclass(frozen=True)
class Cause:
    name: str
    overrides: dict[str, Any]
    expected: str
    ranks: list[int] = field(default_factory=list)


def causes(fault_from: int) -> list[Cause]:
    shape = " && ".join(
        f"{prefix}tc qdisc replace dev {dev} root tbf rate {RATE} burst 8kb latency 200ms"
        for prefix, dev in (("", VETH), (f"ip netns exec {NETNS} ", PEER))
    )
    network = {
        "netns": NETNS,
        "netns_ranks": "1,3",
        "gloo_ifname": VETH,
        "netns_ifname": PEER,
        "master_addr": ADDR,
        "shape_cmd": shape,
    }
    link = {**network, "netns_ranks": "3"}
    return [
        Cause("healthy", {}, "healthy"),
        Cause("compute", {"slow_rank": 1, "slow_matmuls": 4}, "straggler compute", [1]),
        Cause("network", network, "everyone-slow network", ALL),
        Cause("link", link, "straggler network", [2, 3]),
        Cause("gc", {"gc_rank": 2, "gc_live": 30_000}, "GC", [2]),
        Cause("cpu", {"inter_s": 0.03}, "hidden CPU work", ALL),
        Cause("data", {"data_wait_s": 0.03}, "input pipeline", ALL),
    ]


def sh(cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, shell=True, check=check, capture_output=True)


def net_up() -> None:
    net_down()
    for cmd in (
        f"ip netns add {NETNS}",
        f"ip link add {VETH} type veth peer name {PEER}",
        f"ip link set {PEER} netns {NETNS}",
        f"ip addr add {ADDR}/24 dev {VETH}",
        f"ip link set {VETH} up",
        f"ip netns exec {NETNS} ip addr add {PEER_ADDR}/24 dev {PEER}",
        f"ip netns exec {NETNS} ip link set {PEER} up",
        f"ip netns exec {NETNS} ip link set lo up",
    ):
        sh(cmd)


def net_unshape() -> None:
    sh(f"tc qdisc del dev {VETH} root", check=False)
    sh(f"ip netns exec {NETNS} tc qdisc del dev {PEER} root", check=False)


def net_down() -> None:
    sh(f"ip link del {VETH}", check=False)  # removes its peer too
    sh(f"ip netns del {NETNS}", check=False)


def one_run(cause: Cause, i: int, args: argparse.Namespace, store_dsn: str) -> dict[str, Any]:
    job = f"study-{cause.name}-{i}"
    cfg = WorkloadConfig(
        steps=args.steps, job=job, fault_from=args.fault_from, seed=i, **cause.overrides
    )
    started = time.perf_counter()
    try:
        run_embedded_workload(cfg, args.dir / job, skip_steps=2, dsn=store_dsn)
    finally:
        if cause.name in ("network", "link"):
            net_unshape()
        shutil.rmtree(args.dir / job, ignore_errors=True)
    with Store.connect(store_dsn) as store:
        found = diagnose_stored(store, job)
        alerts = store.query(
            "SELECT kind, arrayStringConcat(JSONExtract(evidence, 'ranks', 'Array(Int64)'), ',')"
            " AS ranks FROM alerts FINAL WHERE job = {job:String} AND state = 'firing'"
            " AND kind != 'straggler' ORDER BY time",
            {"job": job},
        )
    assert found is not None, f"{job}: no signals stored"
    if cause.name == "healthy":  # no signal may fire; the what-if may still blame
        right = not alerts and found.kind in ("none", "straggler")
    else:
        right = found.cause == cause.expected and found.ranks == cause.ranks
    return {
        "cause": cause.name,
        "run": i,
        "job": job,
        "diagnosis": found.cause,
        "ranks": found.ranks,
        "right": right,
        "alerts": [f"{a['kind']}[{a['ranks']}]" for a in alerts],
        "text": found.text(),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def rediagnose(directory: Path) -> list[dict[str, Any]]:
    """The runs stored under ``directory`` diagnosed again with the current rule (the
    stored signals and alerts are kept: only the diagnosis changes)."""
    runs = json.loads((directory / "results.json").read_text())
    store_dsn = f"chdb://{(directory / 'chdb').resolve()}"
    by_name = {c.name: c for c in causes(0)}
    out = []
    with Store.connect(store_dsn) as store:
        for run in runs:
            cause = by_name[run["cause"]]
            found = diagnose_stored(store, run["job"])
            assert found is not None
            if cause.name == "healthy":
                right = not run["alerts"] and found.kind in ("none", "straggler")
            else:
                right = found.cause == cause.expected and found.ranks == cause.ranks
            out.append({**run, "diagnosis": found.cause, "ranks": found.ranks, "right": right})
    return out


def replay(directory: Path, config: DetectorConfig) -> list[dict[str, Any]]:
    """The runs stored under ``directory`` judged again from their stored signals by a
    detector with ``config`` (to compare rules on runs already made, without new ones)."""
    runs = json.loads((directory / "results.json").read_text())
    store_dsn = f"chdb://{(directory / 'chdb').resolve()}"
    by_name = {c.name: c for c in causes(0)}
    fields = [f.name for f in dataclasses.fields(Signals) if f.name != "start_ns"]
    out = []
    with Store.connect(store_dsn) as store:
        for run in runs:
            cause = by_name[run["cause"]]
            rows = store.query(
                f"SELECT {', '.join(fields)}, toUnixTimestamp64Nano(time) AS start_ns"
                " FROM rank_signals FINAL WHERE job = {job:String} ORDER BY step, rank",
                {"job": run["job"]},
            )
            detector, judged, alerts = SlowdownDetector(config), [], []
            for step in sorted({r["step"] for r in rows}):
                signals = [Signals(**r) for r in rows if r["step"] == step]
                open_now, fired = detector.observe(signals)
                alerts += [
                    f"{a.kind}[{','.join(map(str, a.ranks))}]" for a in fired if a.state == "firing"
                ]
                judged += [{**vars(s), "anomalies": open_now.get(s.rank, [])} for s in signals]
            found = diagnose(run["job"], judged)
            if cause.name == "healthy":
                right = not alerts
            else:
                right = found.cause == cause.expected and found.ranks == cause.ranks
            out.append(
                {
                    **run,
                    "diagnosis": found.cause,
                    "ranks": found.ranks,
                    "right": right,
                    "alerts": alerts,
                }
            )
    return out


def table(results: list[dict[str, Any]], names: list[str]) -> str:
    lines = [
        "| cause | runs | named right | precision | recall | alerts in its runs |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        mine = [r for r in results if r["cause"] == name]
        expected = next(r for r in mine)["expected"] if mine else ""
        right = sum(r["right"] for r in mine)
        said = [r for r in results if r["diagnosis"] == expected]
        precision = "-"  # healthy: its column is "alerts" (must be none)
        if name != "healthy" and said:
            precision = f"{sum(r['right'] and r['cause'] == name for r in said) / len(said):.2f}"
        kinds: dict[str, int] = {}
        for r in mine:
            for a in r["alerts"]:
                kinds[a] = kinds.get(a, 0) + 1
        shown = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"
        lines.append(
            f"| {name} | {len(mine)} | {right} | {precision} | {right / len(mine):.2f} | {shown} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--fault-from", type=int, default=15)
    parser.add_argument("--only", nargs="*", help="cause names to run (default: all)")
    parser.add_argument("--first-run", type=int, default=0, help="index (and seed) of run 1")
    parser.add_argument("--dir", type=Path, default=Path("var/study"))
    parser.add_argument("--out", type=Path, default=Path("var/study/results.json"))
    parser.add_argument(
        "--rediagnose", type=Path, metavar="DIR", help="diagnose a finished study's runs again"
    )
    parser.add_argument(
        "--replay",
        type=Path,
        nargs="*",
        metavar="DIR",
        help="judge finished studies' stored signals again with --config",
    )
    parser.add_argument("--config", default="{}", help="DetectorConfig fields as JSON")
    args = parser.parse_args()
    if args.replay:
        config = DetectorConfig(**json.loads(args.config))
        again = [r for d in args.replay for r in replay(d, config)]
        print(table(again, list(dict.fromkeys(r["cause"] for r in again))))
        for r in again:
            if not r["right"]:
                print(f"wrong: {r['job']}: {r['diagnosis']} {r['ranks']} {r['alerts']}")
        return 0
    if args.rediagnose:
        again = rediagnose(args.rediagnose)
        print(table(again, list(dict.fromkeys(r["cause"] for r in again))))
        for r in again:
            if not r["right"]:
                print(f"wrong: {r['job']}: {r['diagnosis']} {r['ranks']}")
        return 0
    selected = [c for c in causes(args.fault_from) if not args.only or c.name in args.only]
    if os.geteuid() != 0 and any(c.name in ("network", "link") for c in selected):
        print("not root: the network causes need a network namespace; skipped")
        selected = [c for c in selected if c.name not in ("network", "link")]
    args.dir.mkdir(parents=True, exist_ok=True)
    store_dsn = f"chdb://{(args.dir / 'chdb').resolve()}"
    with Store.connect(store_dsn) as store:
        store.migrate()
    results = []
    if any(c.name in ("network", "link") for c in selected):
        net_up()
    try:
        for i in range(args.first_run, args.first_run + args.runs):
            for cause in selected:
                result = {**one_run(cause, i, args, store_dsn), "expected": cause.expected}
                results.append(result)
                print(
                    f"{result['job']}: {result['diagnosis']} {result['ranks']} "
                    f"{'ok' if result['right'] else 'WRONG'} alerts={result['alerts']} "
                    f"({result['wall_s']} s)",
                    flush=True,
                )
    finally:
        net_down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print()
    print(table(results, [c.name for c in selected]))
    healthy = [r for r in results if r["cause"] == "healthy"]
    false_alarms = sum(bool(r["alerts"]) for r in healthy)
    print(f"\nhealthy runs with a signal alert: {false_alarms} of {len(healthy)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
