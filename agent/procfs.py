"""Parsers of the /proc files the agent reads: text in, plain numbers out.

Counters are returned raw (cumulative); :mod:`rankwatch.agent.sampler` turns
them into rates. Every parser tolerates missing fields (kernels differ) by leaving
them out rather than failing.
"""

from __future__ import annotations

CLOCK_TICKS = 100
"""USER_HZ: the unit of the CPU times in /proc/stat and /proc/<pid>/stat on Linux."""


def cpu_times(stat_text: str) -> dict[str, float]:
    """The aggregate ``cpu`` line of /proc/stat: busy, iowait and total jiffies."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            v = [float(x) for x in line.split()[1:]]
            v += [0.0] * (8 - len(v))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            busy = user + nice + system + irq + softirq + steal
            return {"busy": busy, "iowait": iowait, "total": busy + idle + iowait}
    return {}


def loadavg(text: str) -> dict[str, float]:
    parts = text.split()
    return {"load1": float(parts[0])} if parts else {}


def meminfo(text: str) -> dict[str, float]:
    """Total, available and used memory in bytes (MemAvailable when the kernel has it)."""
    kb: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            kb[name] = float(fields[0])
    total = kb.get("MemTotal", 0.0) * 1024
    avail = kb.get("MemAvailable", kb.get("MemFree", 0.0)) * 1024
    if total <= 0:
        return {}
    return {"mem_total_bytes": total, "mem_used_bytes": total - avail}


def net_dev(text: str) -> dict[str, float]:
    """Received and sent bytes summed over the interfaces other than loopback."""
    rx = tx = 0.0
    seen = False
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name.strip() == "lo" or len(fields) < 9:
            continue
        rx += float(fields[0])
        tx += float(fields[8])
        seen = True
    return {"rx_bytes": rx, "tx_bytes": tx} if seen else {}


def diskstats(text: str) -> dict[str, float]:
    """Bytes read and written by whole block devices: partitions (a device whose name
    extends another's, ``sda1``, ``nvme0n1p1``), loop, ram and device-mapper skipped."""
    rows = [f for f in (line.split() for line in text.splitlines()) if len(f) >= 10]
    names = {f[2] for f in rows}
    read = written = 0.0
    for f in rows:
        name = f[2]
        if name.startswith(("loop", "ram", "dm-", "sr", "zram")):
            continue
        if any(other != name and name.startswith(other) for other in names):
            continue
        read += float(f[5]) * 512
        written += float(f[9]) * 512
    return {"read_bytes": read, "write_bytes": written}


def netstat_ce(text: str) -> dict[str, float]:
    """ECN congestion-experienced packets received (IpExt InCEPkts), where exposed."""
    lines = text.splitlines()
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        if head.startswith("IpExt:"):
            table = dict(zip(head.split()[1:], values.split()[1:], strict=False))
            if "InCEPkts" in table:
                return {"ce_pkts": float(table["InCEPkts"])}
    return {}


def process_stat(text: str) -> dict[str, float]:
    """/proc/<pid>/stat: CPU seconds (user + system) and page faults."""
    rest = text[text.rfind(")") + 2 :].split()
    # fields after the command: state(3) ... minflt(10) majflt(12) utime(14) stime(15)
    return {
        "minflt": float(rest[7]),
        "majflt": float(rest[9]),
        "cpu_s": (float(rest[11]) + float(rest[12])) / CLOCK_TICKS,
        "threads": float(rest[17]),
    }


def process_schedstat(text: str) -> dict[str, float]:
    """/proc/<pid>/schedstat: seconds on a CPU and seconds waiting for one (run queue)."""
    f = text.split()
    return {"run_s": float(f[0]) / 1e9, "wait_s": float(f[1]) / 1e9} if len(f) >= 2 else {}


def process_status(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name == "VmRSS" and fields:
            out["rss_bytes"] = float(fields[0]) * 1024
        elif name == "nonvoluntary_ctxt_switches" and fields:
            out["nvcsw"] = float(fields[0])
    return out


def process_io(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("read_bytes", "write_bytes") and rest.strip():
            out[name] = float(rest)
    return out
