"""``rankwatch scenario JOB|TRACE``: the job's step time on other hardware, network or
parallelism (docs/scenarios.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.sim.scenario import Hardware, Scenario, ScenarioResult
    from rankwatch.sim.trace import JobMeta, Trace

DESCRIPTION = """\
Calibrate a compute and a communication model on the job's measured op costs, re-time
every op under each scenario (and re-shape the schedule for DP/PP/microbatch changes),
and simulate the steps with the what-if engine. Without --sweep, the first row is the
job as measured (simulated), the second the --set changes. JOB is read from the store
(its latest analysed steps); a .parquet file is a trace and needs --meta. The job's
hardware (GPU, bandwidths, sizes) comes from the `hardware:` mapping of --meta.
Exit code 2 when the input cannot be read, modelled or changed that way."""

DEFAULT_STEPS = 20
"""Analysed steps of a stored job to calibrate on (the latest ones)."""


def register(subparsers: Any) -> None:
    from rankwatch.sim.scenario import KEYS

    keys = "; ".join(f"{k}: {v}" for k, v in KEYS.items())
    parser = subparsers.add_parser(
        "scenario",
        help="a job's step time on other hardware, network or parallelism",
        description=DESCRIPTION,
        epilog=f"keys: {keys}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="JOB|TRACE", help="stored job id or trace (.parquet)")
    parser.add_argument("--meta", metavar="META.yaml", help="job sizes and hardware (yaml)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario setting"
    )
    parser.add_argument("--sweep", metavar="KEY=V1,V2,...", help="one scenario per value")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--plot", type=Path, metavar="FILE.png|FILE.html", help="draw the curve")
    parser.add_argument(
        "--store", action="store_true", help="also write the results to the store (scenarios)"
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="stored steps to use")
    parser.add_argument("--clickhouse", metavar="DSN", help="store (default from config)")
    parser.add_argument("--database", help="database (default: $RANKWATCH_DATABASE)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from rankwatch.sim import ModelError
    from rankwatch.sim.scenario import ScenarioError, calibrate_trace, run_scenarios
    from rankwatch.sim.scenario.report import format_table

    trace, meta, hardware, job = _load(args)
    try:
        scenarios = _scenarios(args)
        cal = calibrate_trace(trace, meta, hardware)
        results = run_scenarios(cal, scenarios)
    except (ModelError, ScenarioError) as exc:
        raise UserError(f"cannot run the scenarios on {args.source}: {exc}") from exc
    if args.plot:
        _plot(results, args)
    if args.store:
        from rankwatch.scenario_store import write_results

        swept = _pair(args.sweep, "--sweep")[0] if args.sweep else None
        where = write_results(results, job, trace, swept, args.clickhouse, args.database)
        if args.format == "text":
            print(f"stored {len(results)} scenario(s) of job {job} in {where}")
    if args.format == "json":
        print(orjson.dumps({"scenarios": [r.to_json() for r in results]}).decode())
    else:
        print(format_table(results, cal))
    return 0


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    from rankwatch.sim.scenario import Scenario, ScenarioError, sweep

    fixed = dict(_pair(item, "--set") for item in args.set)
    if args.sweep:
        key, values = _pair(args.sweep, "--sweep")
        return sweep(key, [v for v in values.split(",") if v.strip()], fixed)
    out = [Scenario.of({})]
    if fixed:
        out.append(Scenario.of(fixed))
    if len({s.name for s in out}) != len(out):
        raise ScenarioError("the scenarios' names repeat")
    return out


def _pair(item: str, flag: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise UserError(f"{flag} takes KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


def _load(args: argparse.Namespace) -> tuple[Trace, JobMeta, Hardware, str]:
    """The trace, sizes and hardware of a trace file or of a stored job."""
    raw = _read_yaml(args.meta) if args.meta else {}
    hardware = _hardware(raw.get("hardware"), args.meta)
    if args.source.endswith(".parquet") or Path(args.source).is_file():
        from rankwatch.traceio import read_meta, read_trace

        if not args.meta:
            raise UserError(f"{args.source} is a trace file: give its sizes with --meta META.yaml")
        return read_trace(args.source), read_meta(args.meta), hardware, Path(args.source).stem
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, not {args.steps}")
    from rankwatch.scenario_store import read_job

    trace, meta = read_job(args.source, args.steps, args.clickhouse, args.database)
    return trace, meta, hardware, args.source


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml

    from rankwatch.traceio import require_file

    try:
        raw = yaml.safe_load(require_file(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read job metadata {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise UserError(f"job metadata {path} is not a mapping")
    return raw


def _hardware(raw: object, path: str | None) -> Hardware:
    from rankwatch.sim.scenario import Hardware, ScenarioError

    if raw is not None and not isinstance(raw, dict):
        raise UserError(f"{path}: hardware must be a mapping")
    try:
        return Hardware.from_mapping(raw)
    except ScenarioError as exc:
        raise UserError(f"{path}: {exc}") from exc


def _plot(results: list[ScenarioResult], args: argparse.Namespace) -> None:
    from rankwatch.scenario_plot import render

    suffix = args.plot.suffix.lower()
    if suffix not in (".png", ".html"):
        raise UserError(f"--plot writes .png or .html, not {args.plot.name}")
    key = _pair(args.sweep, "--sweep")[0] if args.sweep else None
    try:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.write_bytes(render(results, key, as_html=suffix == ".html", title=args.source))
    except OSError as exc:
        raise UserError(f"cannot write {args.plot}: {exc}") from exc
