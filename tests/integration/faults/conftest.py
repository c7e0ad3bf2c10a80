"""Fixtures of the fault suite: a broker of a test's own (for the tests that stop it),
a small disk that can be filled, and the worker's health as an operator checks it.

The suite's tests are listed, with what each guarantees, in docs/contracts.md,
"Guarantees". Each compares the store after its fault with a clean run of the same
input (``support.faults``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.devbroker import DevBroker


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[DevBroker]:
    """A broker of this test alone, with no topics, that it may stop and start again
    (same port, same data)."""
    broker = DevBroker(tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        if broker.is_running():
            broker.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs mounted for this test (root only: CI runs as root, and the fault
    must be a real full disk, not a store told to refuse)."""
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs in CI: {done.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here (root needed): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
