"""The Minder lab's machines on one box: network namespaces joined to the host by veth
links, a TCP sink the stand-in ranks send their "gradients" to, and fault switches.

Used by ``tests/integration/test_minder_faults.py`` (ranks as machines, sampled in
process) and ``benchmarks/study_minder_lab.py`` (hosts as deployed: a namespace and a
cgroup each, one ``rankwatch agent`` per host, the real worker). Needs root and
iproute2.
"""

from __future__ import annotations

import fcntl
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NET_LOCK = Path("/tmp/rankwatch-minder-lab.lock")
LAB_SHARES = 262_144
"""cgroup v1's largest ``cpu.shares`` (the default is 1024): the lab's group wins the
CPU whenever one of its processes wants it."""
TBF = ("tbf", "rate", "64kbit", "burst", "16kbit", "latency", "400ms")
"""The slow link: 64 kbit/s (this kernel has no netem)."""


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Drain(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while self.request.recv(65536):
            pass


@contextmanager
def sink() -> Iterator[int]:
    """A TCP server that reads and drops whatever it is sent; yields its port."""
    server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), Drain)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def free_subnet() -> str:
    """A 10.X prefix no interface of this host uses (two runs at once, from two
    checkouts say, must not share one: the ranks' connections would go astray). The
    caller holds ``NET_LOCK`` until its addresses are assigned."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], check=True, capture_output=True, text=True)
    for second in range(200, 250):
        if f" 10.{second}." not in used.stdout:
            return f"10.{second}"
    raise RuntimeError("no free 10.200-249 subnet for the lab")


@contextmanager
def namespaces(tag: str, count: int) -> Iterator[str]:
    """``count`` namespaces ``rw<tag><i>``, each linked to the host (``rw<tag><i>h``
    here, ``rw<tag><i>c`` inside, addresses ``<net>.<i>.1`` and ``.2``); yields the
    10.X prefix. Removed on exit."""
    made: list[int] = []
    try:
        with open(NET_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released once our addresses are up
            net = free_subnet()
            for i in range(count):
                ns, host, peer = f"rw{tag}{i}", f"rw{tag}{i}h", f"rw{tag}{i}c"
                sh("ip", "netns", "add", ns)
                made.append(i)
                sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
                sh("ip", "link", "set", peer, "netns", ns)
                sh("ip", "addr", "add", f"{net}.{i}.1/24", "dev", host)
                sh("ip", "link", "set", host, "up")
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.{i}.2/24", "dev", peer)
                sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield net
    finally:
        for i in made:
            subprocess.run(["ip", "link", "del", f"rw{tag}{i}h"], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", f"rw{tag}{i}"], check=False, capture_output=True)


def slow_link(tag: str, i: int, on: bool) -> None:
    """The TBF rate limit on namespace i's link, on or off."""
    ns, dev = f"rw{tag}{i}", f"rw{tag}{i}c"
    if on:
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *TBF)
    else:
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root")
