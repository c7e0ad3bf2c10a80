"""``rankwatch hang report JOB``: a job's hang episodes and their merged stacks;
``rankwatch hang worker``: the stream worker that detects them.

Prints each episode (culprit, waiting ranks, where the culprit is) and its merged
stacks in folded-stack text (``frame;frame;frame COUNT``), which flame graph tools
read as is (``--folded`` prints only that, for piping).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

from rankwatch.errors import UserError


def register(sub: Any) -> None:
    parser = sub.add_parser("hang", help="hang episodes of a job and their merged stacks")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    report = verbs.add_parser("report", help="episodes and merged stacks of JOB")
    report.add_argument("job")
    report.add_argument("--clickhouse", help="DSN (default from config and environment)")
    report.add_argument("--episode", help="only this episode id (default: the latest)")
    report.add_argument("--folded", action="store_true", help="print folded stacks only")
    report.set_defaults(func=run_report)
    worker = verbs.add_parser("worker", help="run the hang detector's stream worker (faust)")
    worker.add_argument("--config", help="TOML config file (see README)")
    worker.add_argument("--kafka", help="bootstrap servers (overrides config and env)")
    worker.add_argument("--clickhouse", help="ClickHouse DSN (overrides config and env)")
    worker.add_argument("--k", type=float, help="stall after k x median step ([hang] k)")
    worker.add_argument("--floor", type=float, metavar="SECONDS",
                        help="never stalled sooner than this ([hang] floor_s)")  # fmt: skip
    worker.add_argument("--warmup", type=float, metavar="SECONDS",
                        help="the bound of a job's first steps ([hang] warmup_s)")  # fmt: skip
    worker.add_argument("--silent-after", type=float, metavar="SECONDS",
                        help="heartbeats missing this long: the rank is silent")  # fmt: skip
    worker.add_argument("--tick", type=float, metavar="SECONDS", help="[hang] tick_s")
    worker.add_argument("--offset-reset", choices=("latest", "earliest"),
                        help="where a new group starts ([hang] offset_reset)")  # fmt: skip
    worker.add_argument("--status-file", help="health file written every tick ([hang] status_file)")
    worker.add_argument("--loglevel", default="info")
    worker.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config, service_settings, with_flags
    from rankwatch.streams.hang.detector import HangConfig
    from rankwatch.streams.hang.worker import HangSettings, build_hang_app
    from rankwatch.streams.kit.faustapp import serve
    from rankwatch.topics import make_topics

    flags = {
        "kafka.bootstrap": args.kafka,
        "clickhouse.dsn": args.clickhouse,
        "hang.k": args.k,
        "hang.floor_s": args.floor,
        "hang.warmup_s": args.warmup,
        "hang.silent_after_s": args.silent_after,
        "hang.tick_s": args.tick,
        "hang.offset_reset": args.offset_reset,
        "hang.status_file": args.status_file,
    }
    config = with_flags(load_config(args.config), flags)
    hang = config.hang
    settings = HangSettings(
        **service_settings(config, "-hang"),
        status_file=hang.status_file or None,
        tick_s=hang.tick_s,
        offset_reset=hang.offset_reset,
        retire_after_s=hang.retire_after_s,
        hang=HangConfig(
            k=hang.k,
            floor_s=hang.floor_s,
            warmup_s=hang.warmup_s,
            max_phase_s=hang.max_phase_s,
            silent_after_s=hang.silent_after_s,
        ),
    )
    prefix = settings.topic_prefix
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    report = make_topics(config.kafka, [f"{prefix}.{kind}" for kind in kinds])
    app, state = build_hang_app(settings)
    state.topics = dict(report.partitions)
    serve(app, args.loglevel, settings.stop_wait_s)
    return 0


EPISODES_SQL = """
SELECT episode_id, time, resolved_at, step, culprit_ranks, waiting_ranks, silent_ranks,
       culprit_hosts, culprit_where, summary
FROM hangs FINAL WHERE job = {job:String} ORDER BY time DESC
"""
STACKS_SQL = """
SELECT stack, native, n_ranks, ranks, ranks_text, absent_ranks_text
FROM stacks FINAL WHERE job = {job:String} AND episode_id = {episode:String}
ORDER BY n_ranks DESC, stack
"""


def is_hook_thread(stack: dict[str, Any]) -> bool:
    """A thread whose run is the hooks' own (the publisher, which also beats and
    watches) is not where the rank is stuck: the report lists it after the rank's other
    threads. py-spy names the frame ``Thread.run`` in recent releases, ``run`` before,
    as the hooks' own watchdog does (``co_name``)."""
    frames = str(stack["stack"]).split(";")
    for here, after in itertools.pairwise(frames):
        if here.endswith(("threading.py:Thread.run", "threading.py:run")):
            return "/rankwatch/hooks/" in after
    return False


def run_report(args: argparse.Namespace) -> int:
    from rankwatch.stores import open_store, require_job
    from rankwatch.streams.hang.ranges import format_ranges

    with open_store(args.clickhouse) as store:
        require_job(store, args.job)
        episodes = store.query(EPISODES_SQL, {"job": args.job})
        if args.episode:
            episodes = [e for e in episodes if e["episode_id"] == args.episode]
            if not episodes:
                raise UserError(f"job {args.job!r} has no hang episode {args.episode!r}")
        if not episodes:
            out = sys.stderr if args.folded else sys.stdout  # --folded output stays stacks
            print(f"job {args.job}: no hang episode recorded in {store.where}", file=out)
            return 0
        episode = episodes[0]
        stacks = store.query(STACKS_SQL, {"job": args.job, "episode": episode["episode_id"]})
    if args.folded:
        print("".join(f"{s['stack']} {s['n_ranks']}\n" for s in stacks), end="")
        return 0
    state = "open" if episode["resolved_at"] is None else f"resolved {episode['resolved_at']}"
    print(f"episode {episode['episode_id']} ({state}), declared {episode['time']}")
    print(episode["summary"])
    print(
        f"culprits: {format_ranges(episode['culprit_ranks'])} on "
        f"{', '.join(episode['culprit_hosts'])}: {episode['culprit_where']}"
    )
    print(
        f"waiting: {format_ranges(episode['waiting_ranks'])}; "
        f"silent: {format_ranges(episode['silent_ranks']) or '-'}"
    )
    culprits = set(episode["culprit_ranks"])
    own = sorted((s for s in stacks if culprits & set(s["ranks"])), key=is_hook_thread)
    if own:  # where the culprits themselves are: what a person asks first
        print("\nthe culprits' own stacks (ranks in the path | ranks not in it):")
        for s in own:
            print(f"  [{s['ranks_text']} | {s['absent_ranks_text'] or '-'}] {s['stack']}")
    else:
        print(f"\nno stack of the culprits ({format_ranges(sorted(culprits))}) was taken")
    print("\nmerged stacks of the others (ranks in the path | ranks not in it):")
    for s in stacks:
        if s not in own:
            print(f"  [{s['ranks_text']} | {s['absent_ranks_text'] or '-'}] {s['stack']}")
    return 0
