"""``rankwatch agent``: the per-machine metrics agent for the faulty-machine detector."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = """\
Sample this machine's metrics once a second (CPU, memory, network, disk, ECN marks;
RDMA throughput and CNP/ECN counters from sysfs; GPUs through NVML when pynvml is
installed) and publish them to <prefix>.metrics,
tagged with the job and host. With --pid, treat each given process as a machine
(its CPU, run-queue wait, memory, faults, I/O and the network of its namespace).
Also sends the spools that ranks of this host left behind, and (without --pid) takes
the stack of a rank of this host whose heartbeats stopped, from outside, with py-spy
(agent/stacks.py; needs ptrace rights: root or CAP_SYS_PTRACE)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="per-machine metrics agent (publishes to <prefix>.metrics)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--job", required=True)
    parser.add_argument("--host", default="", help="host name to report (default: hostname)")
    parser.add_argument("--config", help="rankwatch.toml (kafka section)")
    parser.add_argument("--kafka", help="bootstrap servers (default: config / RANKWATCH_KAFKA)")
    parser.add_argument("--stdout", action="store_true", help="print JSON lines, no Kafka")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--count", type=int, help="stop after this many samples")
    parser.add_argument(
        "--pid",
        action="append",
        default=[],
        metavar="PID[=NAME]",
        help="sample this process as a machine named NAME (repeatable)",
    )
    parser.add_argument("--no-gpu", action="store_true", help="skip NVML")
    parser.add_argument(
        "--cgroup",
        metavar="PATH",
        help="the machine is this cgroup (a container: its CPU, throttling and memory, "
        "v1 or v2, path under /sys/fs/cgroup) and the agent's network namespace",
    )
    add_spool_arguments(parser)
    parser.set_defaults(func=run)


def add_spool_arguments(parser: Any) -> None:
    """``--spool-dir`` and ``--no-sweep``: the agent and the relay send the spools that
    ranks of this host left behind (``rankwatch.agent.spools``)."""
    parser.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="where this host's ranks spool (default: RANKWATCH_HOOKS_SPOOL, else"
        " $TMPDIR/rankwatch-<uid>/spool, as the hooks do); spools of ranks that are gone"
        " are sent to <prefix>.ops every 10 s",
    )
    parser.add_argument("--no-sweep", action="store_true", help="do not send left spools")
    parser.add_argument(
        "--no-stacks",
        action="store_true",
        help="do not take the stacks of this host's silent ranks from outside (py-spy)",
    )


def start_sweeper(args: argparse.Namespace, config: Any, bootstrap: str, stop: Any) -> Any:
    """The spool sweeper's closer (None when there is none to run: --no-sweep, no Kafka,
    or the spool directory switched off)."""
    from pathlib import Path

    from rankwatch.agent.spools import kafka_sweeper, sweep_in_background
    from rankwatch.hooks.session import OFF_VALUES
    from rankwatch.schemas.spool import default_spool_dir

    prefix = config.kafka.topic_prefix
    where = args.spool_dir or config.host.spool_dir
    if args.no_sweep or not bootstrap or where.lower() in OFF_VALUES | {"none"}:
        return None
    folder = Path(where) if where else default_spool_dir()
    sweeper, close = kafka_sweeper(bootstrap, folder, prefix)
    thread = sweep_in_background(sweeper, stop)

    def finish() -> None:  # once ``stop`` is set: the sweep under way ends first
        thread.join(timeout=30)
        close()

    return finish


def start_stack_taker(args: argparse.Namespace, config: Any, bootstrap: str, stop: Any) -> Any:
    """The stack taker's closer (None when there is none to run: --no-stacks, no
    Kafka): it watches the beacons beside the spool directory (agent/stacks.py)."""
    from pathlib import Path

    from rankwatch.agent.spools import kafka_senders
    from rankwatch.agent.stacks import StackTaker, take_in_background
    from rankwatch.hooks.session import OFF_VALUES
    from rankwatch.schemas.beacon import beats_dir
    from rankwatch.schemas.spool import default_spool_dir

    where = args.spool_dir or config.host.spool_dir
    if args.no_stacks or not bootstrap:
        return None
    off = where.lower() in OFF_VALUES | {"none"}
    folder = beats_dir(default_spool_dir() if off or not where else Path(where))
    send, close = kafka_senders(bootstrap)
    thread = take_in_background(StackTaker(folder, send), stop)

    def finish() -> None:
        thread.join(timeout=30)
        close()

    return finish


def targets(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(host name, samplers) per machine the agent speaks for."""
    from rankwatch.agent import HostSampler, ProcessSampler
    from rankwatch.agent.sampler import RdmaSampler
    from rankwatch.errors import UserError

    if args.cgroup:
        from rankwatch.agent.cgroups import CgroupSampler
        from rankwatch.agent.sampler import NetworkSampler

        if args.pid:
            raise UserError("--cgroup and --pid exclude each other")
        cgroup = CgroupSampler(args.cgroup)
        if not cgroup.exists():
            raise UserError(f"--cgroup {args.cgroup}: no such cgroup under {cgroup.root}")
        return [(args.host, [NetworkSampler(), cgroup])]
    if not args.pid:
        samplers: list[Any] = [HostSampler()]
        if RdmaSampler().ports():
            samplers.append(RdmaSampler())
        if not args.no_gpu:
            from rankwatch.agent.gpu import GpuSampler

            gpu = GpuSampler()
            if gpu.available:
                samplers.append(gpu)
        return [(args.host, samplers)]
    out = []
    for spec in args.pid:
        pid_text, _, name = spec.partition("=")
        if not pid_text.isdigit():
            raise UserError(f"--pid {spec}: expected PID or PID=NAME")
        sampler = ProcessSampler(int(pid_text))
        if not sampler.alive():
            raise UserError(f"--pid {spec}: no such process")
        out.append((name or f"{args.host or 'pid'}-{pid_text}", [sampler]))
    return out


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from rankwatch.agent import (
        Agent,
        AgentConfig,
        KafkaTransport,
        LinesTransport,
        Outbox,
        run_agents,
    )
    from rankwatch.config import load_config

    config = load_config(args.config)
    if args.stdout:
        transport: Any = LinesTransport(sys.stdout)
    else:
        bootstrap = args.kafka or config.kafka.bootstrap
        transport = KafkaTransport(bootstrap, f"{config.kafka.topic_prefix}.metrics")
    outbox = Outbox(transport)
    agents = [
        Agent(AgentConfig(job=args.job, host=host, interval_s=args.interval), samplers, outbox)
        for host, samplers in targets(args)
    ]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    bootstrap = "" if args.stdout else (args.kafka or config.kafka.bootstrap)
    closers = [start_sweeper(args, config, bootstrap, stop)]
    if not args.pid:  # one agent per host: the host's ranks are its own to look at
        closers.append(start_stack_taker(args, config, bootstrap, stop))
    run_agents(agents, args.interval, stop, count=args.count)
    stop.set()
    outbox.close()
    for close in closers:
        if close is not None:
            close()
    c = outbox.counters
    print(
        f"rankwatch agent: {c.sent} sent, {c.dropped_full + c.dropped_failed} dropped, "
        f"{c.transport_errors} transport errors",
        file=sys.stderr,
    )
    return 0
