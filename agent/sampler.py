"""Samplers: read /proc (and NVML), turn counters into per-second rates.

A sampler returns one flat ``{metric: value}`` dict per call; the clock is passed in
(``now_ns``) so tests need no sleeping. A file that cannot be read, or parsed, only
drops its metrics from that sample: the agent must never die of a kernel quirk.

Two kinds: :class:`HostSampler` (the whole machine) and :class:`ProcessSampler` (one
process treated as a machine: its CPU, run-queue wait, memory, faults, I/O and the
network of its namespace), the latter for tests on one host and for jobs that run
several ranks per host.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from rankwatch.agent import procfs
from rankwatch.schemas.agentmetrics import (
    HOST_RATES,
    PROCESS_GAUGES,
    PROCESS_RATES,
    RDMA_COUNTERS,
)

Reader = Callable[[str], str]
Parser = Callable[[str], dict[str, float]]


def read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _percent(part: float, total: float) -> float:
    """``part`` of ``total`` in percent, within [0, 100] as a share is. Rates are jiffies
    over a float interval, so a fully busy interval gives 100 * r / r, which rounds to
    100.00000000000001 for about one r in fifteen: the bound removes rounding, never a
    measurement."""
    return min(max(100.0 * part / total, 0.0), 100.0)


class Rates:
    """Per-second rates of cumulative counters between two calls."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._last_ns: int | None = None

    def update(self, now_ns: int, counters: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._last_ns is not None and now_ns > self._last_ns:
            dt = (now_ns - self._last_ns) / 1e9
            for name, value in counters.items():
                prev = self._last.get(name)
                if prev is not None and value >= prev:
                    out[name] = (value - prev) / dt
        self._last, self._last_ns = dict(counters), now_ns
        return out


class _Sampler:
    files: tuple[tuple[str, Parser], ...] = ()

    def __init__(self, root: str = "/proc", read: Reader = read_text) -> None:
        self.root, self.read = root, read
        self.rates = Rates()
        self.errors = 0

    def raw(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, parse in self.files:
            try:
                out.update(
                    {f"{name}.{k}": v for k, v in parse(self.read(self._path(name))).items()}
                )
            except (OSError, ValueError, IndexError):
                self.errors += 1
        return out

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"


class HostSampler(_Sampler):
    files = (
        ("stat", procfs.cpu_times),
        ("loadavg", procfs.loadavg),
        ("meminfo", procfs.meminfo),
        ("net/dev", procfs.net_dev),
        ("diskstats", procfs.diskstats),
        ("net/netstat", procfs.netstat_ce),
    )

    def sample(self, now_ns: int) -> dict[str, float]:
        raw = self.raw()
        rate = self.rates.update(now_ns, {k: v for k, v in raw.items() if k != "loadavg.load1"})
        out: dict[str, float] = {}
        total = rate.get("stat.total", 0.0)
        if total > 0:
            # iowait (and with it the total) may go backwards (proc(5): "not reliable"),
            # so over a short interval busy can outgrow the total: bounded to [0, 100]
            busy = min(rate.get("stat.busy", 0.0), total)
            iowait = min(rate.get("stat.iowait", 0.0), total - busy)
            out["cpu_util"] = _percent(busy, total)
            out["cpu_iowait"] = _percent(iowait, total)
        if "loadavg.load1" in raw:
            out["load1"] = raw["loadavg.load1"]
        if raw.get("meminfo.mem_total_bytes"):
            out["mem_used_bytes"] = raw["meminfo.mem_used_bytes"]
            out["mem_util"] = 100.0 * raw["meminfo.mem_used_bytes"] / raw["meminfo.mem_total_bytes"]
        for src, dst in HOST_RATES:
            if src in rate:
                out[dst] = rate[src]
        return out


class NetworkSampler(_Sampler):
    """Only the network of the agent's namespace (``/proc/net`` is the reader's
    namespace): beside :class:`~rankwatch.agent.cgroups.CgroupSampler` when a container
    is the machine, whose CPU and memory the kernel-wide files would misstate."""

    files = (("net/dev", procfs.net_dev), ("net/netstat", procfs.netstat_ce))

    def sample(self, now_ns: int) -> dict[str, float]:
        rate = self.rates.update(now_ns, self.raw())
        return {dst: rate[src] for src, dst in HOST_RATES if src in rate}


class ProcessSampler(_Sampler):
    """One process as a machine (``/proc/<pid>``; its ``net/dev`` is its namespace's)."""

    files = (
        ("stat", procfs.process_stat),
        ("schedstat", procfs.process_schedstat),
        ("status", procfs.process_status),
        ("io", procfs.process_io),
        ("net/dev", procfs.net_dev),
    )

    def __init__(self, pid: int, root: str = "/proc", read: Reader = read_text) -> None:
        super().__init__(root, read)
        self.pid = pid

    def _path(self, name: str) -> str:
        return f"{self.root}/{self.pid}/{name}"

    def alive(self) -> bool:
        return os.path.exists(f"{self.root}/{self.pid}/stat")

    def sample(self, now_ns: int) -> dict[str, float]:
        raw = self.raw()
        gauges = PROCESS_GAUGES
        rate = self.rates.update(now_ns, {k: v for k, v in raw.items() if k not in gauges})
        out = {dst: raw[src] for src, dst in gauges.items() if src in raw}
        for src, dst, scale in PROCESS_RATES:
            if src in rate:
                out[dst] = rate[src] * scale
        return out


class RdmaSampler:
    """RDMA NIC throughput and congestion counters from sysfs, summed over ports, where
    the host has them (``/sys/class/infiniband/<dev>/ports/<n>/``). PFC pause counters
    are only exposed through ethtool's ioctl, not read here."""

    def __init__(self, root: str = "/sys/class/infiniband") -> None:
        self.root = root
        self.rates = Rates()

    def ports(self) -> list[str]:
        try:
            devices = sorted(os.listdir(self.root))
        except OSError:
            return []
        out = []
        for dev in devices:
            try:
                out += [
                    f"{self.root}/{dev}/ports/{p}"
                    for p in sorted(os.listdir(f"{self.root}/{dev}/ports"))
                ]
            except OSError:
                continue
        return out

    def sample(self, now_ns: int) -> dict[str, float]:
        totals: dict[str, float] = {}
        for port in self.ports():
            for rel, name in RDMA_COUNTERS.items():
                try:
                    value = float(read_text(f"{port}/{rel}").strip())
                except (OSError, ValueError):
                    continue
                scale = 4.0 if rel.startswith("counters/port_") else 1.0
                totals[name] = totals.get(name, 0.0) + value * scale
        return self.rates.update(now_ns, totals)
