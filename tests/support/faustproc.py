"""A small faust app of the integration tests, run as a real worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def faust_worker(app: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run the faust app in ``app`` as a worker; stop it with SIGTERM (a graceful faust
    shutdown). The faust CLI starts its web server on port 6066 whatever the app's
    ``web_enabled`` says, so a second suite on the same machine made this worker exit at
    start ("address already in use"): ``--without-web``."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(app), "worker", "--without-web", "--loglevel", "info"],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
