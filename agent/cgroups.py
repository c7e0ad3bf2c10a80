"""A container as the machine: CPU and memory of one cgroup (v1 or v2).

Where a "machine" of the job is a container (a Kubernetes pod, a network namespace
with its own cgroup in the lab), ``/proc/stat`` and ``/proc/meminfo`` describe the
whole kernel, the same on every container of the node: useless for comparing machines.
The cgroup's own accounting is what the container used: its CPU time, the time the
kernel throttled it (a CPU quota reached), its anonymous memory. The network is the
agent's network namespace (``NetworkSampler``), so the agent runs inside it.

Metrics (names shared with the other samplers where the meaning is):
``cpu_util`` (percent of one CPU, as ``ProcessSampler``: a cgroup busy on four CPUs
reads 400, where the host's ``cpu_util`` is a share of all CPUs), ``cpu_throttled_pct``
(the time the cgroup's run queues were held back by its quota, in percent of one CPU's
time: the kernel sums the throttled time over the CPUs, so a group throttled on four
CPUs at once reads up to 400; not capped), ``mem_used_bytes`` (anonymous memory: what
a leak grows; page cache is left out, where the host's ``mem_used_bytes`` is total
minus ``MemAvailable`` and holds what the kernel cannot reclaim, shared memory too).
Compare machines of one kind: a job's hosts are all containers or all hosts.
"""

from __future__ import annotations

import os

from rankwatch.agent.sampler import Rates, Reader, read_text

ROOT = "/sys/fs/cgroup"


def _keyed(text: str) -> dict[str, float]:
    """``key value`` lines (``cpu.stat``, ``memory.stat``)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


class CgroupSampler:
    """One cgroup, by its path under the hierarchy (``lab/host3``), read once a tick."""

    def __init__(self, name: str, root: str = ROOT, read: Reader = read_text) -> None:
        self.name, self.root, self.read = name.strip("/"), root, read
        self.unified = os.path.exists(f"{root}/cgroup.controllers")
        self.rates = Rates()
        self.errors = 0

    def exists(self) -> bool:
        probe = f"{self.root}/{self.name}" if self.unified else f"{self.root}/cpuacct/{self.name}"
        return os.path.isdir(probe)

    def _file(self, controller: str, name: str) -> str:
        if self.unified:
            return self.read(f"{self.root}/{self.name}/{name}")
        return self.read(f"{self.root}/{controller}/{self.name}/{name}")

    def _counters(self) -> dict[str, float]:
        """CPU time and throttled time in seconds, cumulative."""
        out: dict[str, float] = {}
        try:
            if self.unified:
                stat = _keyed(self._file("cpu", "cpu.stat"))
                out["cpu_s"] = stat["usage_usec"] / 1e6
                if "throttled_usec" in stat:
                    out["throttled_s"] = stat["throttled_usec"] / 1e6
            else:
                out["cpu_s"] = float(self._file("cpuacct", "cpuacct.usage").strip()) / 1e9
                stat = _keyed(self._file("cpu", "cpu.stat"))
                if "throttled_time" in stat:
                    out["throttled_s"] = stat["throttled_time"] / 1e9
        except (OSError, ValueError, KeyError):
            self.errors += 1
        return out

    def _memory(self) -> dict[str, float]:
        try:
            stat = _keyed(self._file("memory", "memory.stat"))
            anon = stat.get("anon") if self.unified else stat.get("total_rss", stat.get("rss"))
        except OSError:
            self.errors += 1
            return {}
        return {} if anon is None else {"mem_used_bytes": anon}

    def sample(self, now_ns: int) -> dict[str, float]:
        rate = self.rates.update(now_ns, self._counters())
        out = self._memory()
        if "cpu_s" in rate:
            out["cpu_util"] = 100.0 * rate["cpu_s"]
        if "throttled_s" in rate:
            out["cpu_throttled_pct"] = 100.0 * rate["throttled_s"]
        return out
