"""A process's stacks as the ``stacks`` message carries them, from ``py-spy dump``.

Shared by the two that take stacks: a rank's own watchdog (``hooks/watchdog.py``) adds
native frames of its threads, and the host's agent (``agent/stacks.py``) takes the
stacks of a rank that cannot dump its own (stopped, wedged). py-spy reads the process
from outside; it is a tool on PATH (or beside this Python), never a library import, and
nothing here raises.

py-spy needs to attach with ptrace: root, ``CAP_SYS_PTRACE``, or the same user with
Yama's ``ptrace_scope`` 0 (its default of 1 lets a process trace only its
descendants). It cannot suspend a process that is already stopped (SIGSTOP: "unexpected
waitpid result", py-spy 0.4.3), so a stopped process is read without suspending it
(``--nonblocking``): its Python frames are exact (it is not running), its native frames
are not to be had that way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

STACKS_VERSION = 1
MAX_THREADS = 4096
MAX_FRAMES = 2048
"""The schema's limits; deeper stacks keep their innermost frames (where it waits)."""


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or installed beside this Python (a virtualenv
    whose ``bin`` is not on PATH)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if os.access(beside, os.X_OK) else None)


def process_state(pid: int, proc: str = "/proc") -> str:
    """The process's state letter (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced,
    ``Z``...), "" when it is gone or unreadable."""
    try:
        stat = Path(f"{proc}/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :][:1]


def dump_threads(
    pid: int, timeout_s: float, native: bool = True
) -> tuple[list[dict[str, Any]], str]:
    """(threads, "") or ([], why not). ``native``: native frames as well, which needs
    the process suspended; a stopped process is read as it is, Python frames only."""
    exe = py_spy()
    if exe is None:
        return [], "py-spy is not installed"
    stopped = process_state(pid) in ("T", "t")
    cmd = [exe, "dump", "--json", "--pid", str(pid)]
    cmd += ["--nonblocking"] if stopped or not native else ["--native"]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"py-spy failed: {exc}"
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return [], f"py-spy failed: {lines[0] if lines else done.returncode}"[:512]
    try:
        threads = [_thread(t, native and not stopped) for t in orjson.loads(done.stdout)]
    except (ValueError, TypeError, AttributeError) as exc:
        return [], f"py-spy said something unexpected: {exc}"[:512]
    return threads[:MAX_THREADS], ""


def _thread(thread: dict[str, Any], native: bool) -> dict[str, Any]:
    """py-spy lists frames innermost first; the schema wants outermost first."""
    frames = [
        {
            "file": str(f.get("filename") or f.get("module") or "?")[:4096],
            "line": max(int(f.get("line") or 0), 0),
            "function": str(f.get("name") or "?")[:1024],
        }
        for f in thread.get("frames", [])[:MAX_FRAMES]
    ]
    frames.reverse()
    return {
        "name": str(thread.get("thread_name") or thread.get("thread_id"))[:256],
        "thread_id": max(int(thread.get("thread_id") or 0), 0),
        "native": native,
        "frames": frames,
    }


def encode_stacks(
    job: str, host: str, rank: int, sent_ns: int, reason: str, threads: list[dict[str, Any]]
) -> bytes:
    """One ``stacks`` v1 message."""
    return orjson.dumps(
        {
            "schema": "stacks",
            "version": STACKS_VERSION,
            "job": job,
            "host": host,
            "rank": rank,
            "sent_ns": sent_ns,
            "reason": reason[:1024],
            "threads": threads[:MAX_THREADS],
        }
    )
