"""What a test starts through ``support.lifetime.tied`` dies when the test process is
killed (the workers orphaned by a killed pytest ran on through later benchmarks)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_PARENT = """
import subprocess, sys, time
from support.lifetime import tied
command = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]
child = subprocess.Popen(tied(command), stdout=subprocess.PIPE)
child.stdout.readline()  # the command runs: setpriv set the signal before it ran it
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, waiting to be reaped
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here")
def test_a_tied_child_dies_with_the_killed_parent() -> None:
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, env=env, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
