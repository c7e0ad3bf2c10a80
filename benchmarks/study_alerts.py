"""Alerts an on-call engineer can trust: healthy runs raise none, faults are named right.

Runs the real gloo workload (DP 2 x PP 2, 4 ranks on CPU, the hooks on) healthy and with
one injected fault, keeps every op message its hooks made, and judges each run by
feeding those messages through the ops worker's own pipeline (the same one ``rankwatch
worker`` and the embedded commands build: straggler alerts and the slowdown signals'
alerts). Collecting and judging are apart, so that rules can be judged again on runs
already made: tune on one set, freeze the rules, judge the other.

Faults (ranks: rank = stage x DP + DP rank, so rank 1 is worker (1,0), rank 2 (0,1),
rank 3 (1,1)):

- ``slow-worker-0``: rank 1 does extra matmuls in every forward from step 0 (its own
  history is slow from the start): a straggler alert on worker 1,0, cause compute;
- ``slow-worker-n``: rank 2 from step ``--fault-from``: worker 0,1, compute;
- ``slow-stage``: both ranks of stage 1 from ``--fault-from``: stage 1, compute;
- ``slow-link``: rank 3 alone behind a rate-limited veth from ``--fault-from`` (stage 1's
  DP all-reduce and the 1 <-> 3 pipeline link cross it): a network cause on ranks 2, 3;
- ``slow-data``: every rank waits 30 ms for each batch from ``--fault-from``: the input
  pipeline (``dataloader-bound``) on every rank;
- ``gc``: rank 2 collects a 5k-object cyclic graph inside each forward from
  ``--fault-from``: ``gc-pauses`` on rank 2.

A fault is named right when an alert fires within ``--within`` steps of its start (the
run's first analysed step for ``slow-worker-0``) naming the expected group and cause,
and no alert of the run names anything else. A healthy run is right with no alert of
any kind. ``--busy`` keeps one core busy (a process spinning) while the runs train.

    flock /work/measure.lock .venv/bin/python benchmarks/study_alerts.py collect --set tune --runs 5
    .venv/bin/python benchmarks/study_alerts.py judge --set tune

Needs root for the network namespace of ``slow-link`` (skipped otherwise, and said).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_slowdowns import ADDR, NETNS, PEER, RATE, VETH, net_down, net_unshape, net_up

from rankwatch.ingest import spooled_ops
from rankwatch.workload.config import WorkloadConfig
from rankwatch.workload.launch import run_job

ROOT = Path("var/study-alerts")
SKIP_STEPS = 2
"""Process-group warm-up steps left out, as the embedded workload leaves them."""


@dataclass(frozen=True)
class Fault:
    name: str
    overrides: dict[str, Any]
    blame: tuple[str, str] | None
    """(dimension, group) a straggler alert must name, if the fault is a straggler."""
    kind: str | None
    """The slowdown-signal alert kind that names the fault instead (or as well)."""
    ranks: tuple[int, ...] = ()
    cause: str = ""
    from_start: bool = False
    steps: int | None = None


def faults(fault_from: int, matmuls: int = 12) -> list[Fault]:
    shape = " && ".join(
        f"{prefix}tc qdisc replace dev {dev} root tbf rate {RATE} burst 8kb latency 200ms"
        for prefix, dev in (("", VETH), (f"ip netns exec {NETNS} ", PEER))
    )
    link = {
        "netns": NETNS, "netns_ranks": "3", "gloo_ifname": VETH, "netns_ifname": PEER,
        "master_addr": ADDR, "shape_cmd": shape,
    }  # fmt: skip
    slow = {"slow_matmuls": matmuls}
    return [
        Fault("healthy", {}, None, None, steps=200),
        Fault("slow-worker-0", {**slow, "slow_rank": 1, "fault_from": 0}, ("worker", "1,0"),
              None, (1,), "compute", from_start=True),
        Fault("slow-worker-n", {**slow, "slow_rank": 2}, ("worker", "0,1"), None, (2,), "compute"),
        Fault("slow-stage", {**slow, "slow_stage": 1}, ("stage", "1"), None, (2, 3), "compute"),
        Fault("slow-link", link, None, "bandwidth-drop", (1, 2, 3), "network"),
        Fault("slow-data", {"data_wait_s": 0.03}, None, "dataloader-bound", (0, 1, 2, 3),
              "input pipeline"),
        Fault("gc", {"gc_rank": 2, "gc_live": 5_000}, None, "gc-pauses", (2,), "GC"),
    ]  # fmt: skip


# -- collecting ---------------------------------------------------------------------


def collect(args: argparse.Namespace) -> None:
    chosen = faults(args.fault_from, args.matmuls)
    selected = [f for f in chosen if not args.only or f.name in args.only]
    if os.geteuid() != 0 and any(f.name == "slow-link" for f in selected):
        print("not root: slow-link needs a network namespace; skipped")
        selected = [f for f in selected if f.name != "slow-link"]
    where = ROOT / args.set / ("busy" if args.busy else "quiet")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    if any(f.name == "slow-link" for f in selected):
        net_up()
    try:
        for i in range(args.first_run, args.first_run + args.runs):
            for fault in selected:  # interleaved: the box's load spreads over every fault
                one_run(fault, i, args, where / f"{fault.name}-{i}")
    finally:
        net_down()
        if spinner is not None:
            spinner.kill()


def one_run(fault: Fault, i: int, args: argparse.Namespace, directory: Path) -> None:
    steps = fault.steps or args.steps
    fault_from = 0 if fault.from_start else args.fault_from
    cfg = WorkloadConfig(
        steps=steps,
        job=f"{fault.name}-{i}",
        seed=i,
        **{"fault_from": fault_from, **fault.overrides},
    )
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    started = time.perf_counter()
    try:
        run_job(replace(cfg, spool_dir=str(directory / "spool"), kafka=""), directory / "out")
    finally:
        if fault.name == "slow-link":
            net_unshape()
    messages = spooled_ops(directory / "spool", SKIP_STEPS)
    with (directory / "messages.bin").open("wb") as f:
        for value, sent_ns in messages:
            f.write(struct.pack(">qI", sent_ns, len(value)) + value)
    shutil.rmtree(directory / "spool")
    meta = {"fault": fault.name, "run": i, "steps": steps, "fault_from": fault_from,
            "busy": args.busy, "wall_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    (directory / "run.json").write_text(json.dumps(meta))
    print(f"{directory}: {len(messages)} messages in {meta['wall_s']} s", flush=True)


def messages_of(directory: Path) -> Iterator[tuple[bytes, int]]:
    data = (directory / "messages.bin").read_bytes()
    pos = 0
    while pos < len(data):
        sent_ns, length = struct.unpack_from(">qI", data, pos)
        pos += 12
        yield data[pos : pos + length], sent_ns
        pos += length


# -- judging ------------------------------------------------------------------------


@dataclass
class Verdict:
    run: str
    fault: str
    right: bool
    first_step: int | None
    """Steps from the fault's start to the first alert naming it (None: none did)."""
    alerts: list[str] = field(default_factory=list)
    pages: int = 0
    """Distinct alerts (ids) the run raised: what would page someone."""
    why: str = ""


def judge_run(
    directory: Path, by_name: dict[str, Fault], within: int, slowdown: dict[str, Any] | None = None
) -> Verdict:
    """``slowdown``: DetectorConfig fields to judge with instead of the defaults."""
    from rankwatch.streams.kit.output import Source
    from rankwatch.streams.ops.analysing import analysing_pipeline
    from rankwatch.streams.slowdown.detector import DetectorConfig

    meta = json.loads((directory / "run.json").read_text())
    fault = by_name[meta["fault"]]
    pipeline = analysing_pipeline(slowdown=DetectorConfig(**(slowdown or {})))
    fired: list[dict[str, Any]] = []
    now = 0
    for value, now in messages_of(directory):
        for out in (pipeline.on_message(value, Source("ops"), now), pipeline.on_tick(now)):
            fired += [
                m for kind, _, m in out.messages if kind == "alerts" and m["state"] == "firing"
            ]
    for kind, _, m in pipeline.flush(now).messages:
        if kind == "alerts" and m["state"] == "firing":
            fired.append(m)
    shown = [_label(m) for m in fired]
    pages = len({m["alert_id"] for m in fired})
    if fault.name == "healthy":
        return Verdict(directory.name, fault.name, not fired, None, shown, pages,
                       "" if not fired else "alerts")  # fmt: skip
    start = SKIP_STEPS if fault.from_start else meta["fault_from"]
    naming = [m for m in fired if _names(m, fault)]
    others = [m for m in fired if not _names(m, fault) and not _consistent(m, fault)]
    first = min((_step(m) - start for m in naming), default=None)
    in_time = first is not None and first <= within
    why = "" if naming else "nothing named it"
    if others:
        why = f"also: {[_label(m) for m in others]}"
    return Verdict(directory.name, fault.name, bool(naming) and not others and in_time,
                   first, shown, pages, why)  # fmt: skip


def _step(alert: dict[str, Any]) -> int:
    """The step an alert fired at (straggler alerts: the step that fired it)."""
    evidence = alert["evidence"]
    return int(evidence["step"] if alert["kind"] == "straggler" else evidence["fired_at_step"])


def _within(alert: dict[str, Any], fault: Fault) -> bool:
    ranks = set(alert["evidence"].get("ranks") or [])
    return bool(ranks) and ranks <= set(fault.ranks)


def _names(alert: dict[str, Any], fault: Fault) -> bool:
    """Whether the alert names the fault: its group (or ranks) and its cause."""
    evidence = alert["evidence"]
    if alert["kind"] == "straggler":
        if evidence.get("cause") != fault.cause:
            return False
        blame = evidence.get("blame", {})
        if fault.blame is not None:
            return (blame.get("dimension"), blame.get("group")) == fault.blame
        return _within(alert, fault)
    return alert["kind"] == fault.kind and _within(alert, fault)


SYMPTOMS = {"compute": "flops-drop", "network": "bandwidth-drop"}
"""The signal alert a straggler of each cause may raise beside its straggler alert."""


def _consistent(alert: dict[str, Any], fault: Fault) -> bool:
    """An alert that is not the one naming the fault but points at it alone: the job's
    throughput dropping, or the slowed ranks' own FLOP/s or bandwidth."""
    if alert["kind"] == "throughput-drop":
        return True
    return alert["kind"] == SYMPTOMS.get(fault.cause) and _within(alert, fault)


def _label(alert: dict[str, Any]) -> str:
    evidence = alert["evidence"]
    if alert["kind"] == "straggler":
        blame = evidence.get("blame", {})
        what = f"{blame.get('dimension')} {blame.get('group')} {evidence.get('cause', '')}"
        return f"straggler[{what}]@{_step(alert)}"
    return f"{alert['kind']}[{','.join(map(str, evidence.get('ranks', [])))}]@{_step(alert)}"


def judge(args: argparse.Namespace) -> list[Verdict]:
    by_name = {f.name: f for f in faults(args.fault_from)}
    verdicts = []
    for condition in ("quiet", "busy"):
        where = ROOT / args.set / condition
        for directory in sorted(where.glob("*-*")) if where.is_dir() else []:
            if not (directory / "run.json").exists():
                continue  # still being collected
            if args.only and directory.name.rsplit("-", 1)[0] not in args.only:
                continue
            verdict = judge_run(directory, by_name, args.within, args.slowdown)
            verdict.run = f"{condition}/{directory.name}"
            verdicts.append(verdict)
    return verdicts


def table(verdicts: list[Verdict]) -> str:
    lines = [
        "| fault | condition | runs | right | steps to alert (median, max) | alerts per run"
        " (median, max) | wrong runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(v.fault for v in verdicts):
        for condition in ("quiet", "busy"):
            mine = [v for v in verdicts if v.fault == name and v.run.startswith(condition)]
            if not mine:
                continue
            delays = sorted(v.first_step for v in mine if v.first_step is not None)
            shown = f"{delays[len(delays) // 2]}, {delays[-1]}" if delays else "-"
            wrong = "; ".join(
                f"{v.run.split('/')[1]}: {v.why or v.alerts}" for v in mine if not v.right
            )
            right = sum(v.right for v in mine)
            pages = sorted(v.pages for v in mine)
            paged = f"{pages[len(pages) // 2]}, {pages[-1]}"
            lines.append(
                f"| {name} | {condition} | {len(mine)} | {right} | {shown} | {paged}"
                f" | {wrong or '-'} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("collect", "judge"):
        p = sub.add_parser(name)
        p.add_argument("--set", required=True, help="tune or final (a folder of its own)")
        p.add_argument("--fault-from", type=int, default=60)
    c = sub.choices["collect"]
    c.add_argument("--runs", type=int, default=5)
    c.add_argument("--first-run", type=int, default=0, help="index (and seed) of the first run")
    c.add_argument("--steps", type=int, default=120, help="steps of a fault run (healthy: 200)")
    c.add_argument("--only", nargs="*", help="fault names (default: all)")
    c.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    c.add_argument(
        "--matmuls", type=int, default=12, help="extra 256x256 matmuls a slow rank does per forward"
    )
    j = sub.choices["judge"]
    j.add_argument("--within", type=int, default=30, help="steps after the fault starts")
    j.add_argument("--json", type=Path, help="write the verdicts here")
    j.add_argument(
        "--slowdown", type=json.loads, help="DetectorConfig fields, e.g. '{\"job_window\": 20}'"
    )
    j.add_argument("--only", nargs="*", help="fault names (default: all)")
    args = parser.parse_args()
    if args.what == "collect":
        collect(args)
        return 0
    verdicts = judge(args)
    print(table(verdicts))
    if args.json:
        args.json.write_text(json.dumps([vars(v) for v in verdicts], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
