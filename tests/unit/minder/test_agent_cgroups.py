"""The agent with a container as the machine (``agent/cgroups.py``): cgroup v1 and v2
files as the kernel writes them, then a real cgroup v1 with a busy process in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rankwatch.agent.cgroups import CgroupSampler
from rankwatch.cli import main
from rankwatch.schemas.agentmetrics import agent_metric

NS = 1_000_000_000


def v1_tree(root: Path, cpu_ns: int, throttled_ns: int, rss: int) -> None:
    for controller in ("cpuacct", "cpu", "memory"):
        (root / controller / "lab" / "host1").mkdir(parents=True, exist_ok=True)
    (root / "cpuacct/lab/host1/cpuacct.usage").write_text(f"{cpu_ns}\n")
    (root / "cpu/lab/host1/cpu.stat").write_text(
        f"nr_periods 10\nnr_throttled 3\nthrottled_time {throttled_ns}\n"
    )
    (root / "memory/lab/host1/memory.stat").write_text(f"cache 4096\nrss 1\ntotal_rss {rss}\n")


def test_cgroup_v1_cpu_throttling_and_memory(tmp_path: Path) -> None:
    v1_tree(tmp_path, cpu_ns=10 * NS, throttled_ns=0, rss=1 << 20)
    sampler = CgroupSampler("/lab/host1/", root=str(tmp_path))
    assert not sampler.unified and sampler.exists()
    assert sampler.sample(0) == {"mem_used_bytes": float(1 << 20)}  # no rate yet
    v1_tree(tmp_path, cpu_ns=10 * NS + NS // 2, throttled_ns=NS // 4, rss=3 << 20)
    got = sampler.sample(NS)
    assert got == {"cpu_util": 50.0, "cpu_throttled_pct": 25.0, "mem_used_bytes": 3 << 20}
    assert all(agent_metric(name) for name in got)


def test_cgroup_v2_and_a_file_that_is_gone(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "pod").mkdir()
    (tmp_path / "pod/cpu.stat").write_text("usage_usec 1000000\nthrottled_usec 0\n")
    (tmp_path / "pod/memory.stat").write_text("anon 4096\nfile 8192\n")
    sampler = CgroupSampler("pod", root=str(tmp_path))
    assert sampler.unified and sampler.exists()
    sampler.sample(0)
    (tmp_path / "pod/cpu.stat").write_text("usage_usec 3000000\nthrottled_usec 500000\n")
    assert sampler.sample(2 * NS) == {
        "cpu_util": 100.0,
        "cpu_throttled_pct": 25.0,
        "mem_used_bytes": 4096.0,
    }
    (tmp_path / "pod/memory.stat").unlink()  # the container is going away
    assert sampler.sample(3 * NS) == {"cpu_util": 0.0, "cpu_throttled_pct": 0.0}
    assert sampler.errors == 1


def test_an_unknown_cgroup_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["agent", "--job", "j", "--stdout", "--count", "1", "--cgroup", "no/such/cgroup"]
    assert main(args) == 2
    assert "no such cgroup" in capsys.readouterr().err


V1 = Path("/sys/fs/cgroup")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (V1 / "cpuacct/cpuacct.usage").exists(),
    reason="needs root and a cgroup v1 cpuacct controller",
)
def test_a_real_cgroup_sees_its_busy_process_and_its_quota(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"rankwatch-test-{uuid.uuid4().hex[:8]}"
    dirs = [V1 / c / name for c in ("cpuacct", "cpu", "memory")]
    for d in dirs:
        d.mkdir()
    # memory is charged where it is allocated (v1 moves no charge by default): the
    # process allocates once it is in the cgroup
    spin = "import time; time.sleep(0.3); b = bytearray(8 << 20)\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        (V1 / "cpu" / name / "cpu.cfs_period_us").write_text("100000")
        (V1 / "cpu" / name / "cpu.cfs_quota_us").write_text("20000")  # a fifth of a CPU
        (V1 / "cpu" / name / "cpu.shares").write_text("262144")  # it gets that, box busy or not
        for d in dirs:
            (d / "tasks").write_text(str(busy.pid))
        sampler = CgroupSampler(name)
        sampler.sample(time.monotonic_ns())
        time.sleep(1.5)
        got = sampler.sample(time.monotonic_ns())
        capsys.readouterr()
        args = ["agent", "--job", "j", "--host", "h1", "--stdout", "--count", "2"]
        assert main([*args, "--interval", "0.5", "--cgroup", name]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    finally:
        busy.kill()
        busy.wait()
        time.sleep(0.2)
        for d in dirs:
            d.rmdir()
    assert 2.0 < got["cpu_util"] < 30.0, got  # held to about 20% by the quota
    assert got["cpu_throttled_pct"] > 10.0, got
    assert got["mem_used_bytes"] > 1 << 20, got
    assert [m["host"] for m in lines] == ["h1", "h1"]
    assert "cpu_util" in lines[1]["metrics"] and "load1" not in lines[1]["metrics"]
