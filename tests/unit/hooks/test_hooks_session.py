"""What ``rankwatch.hooks.init`` does with the destination it is given, or not given:
it never raises into the training program, and spools by default when it sends to
Kafka."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rankwatch import hooks
from rankwatch.hooks.identity import Identity

IDENT = Identity(job="j", host="h", rank=3, dp_rank=0, pp_rank=0)


def test_init_with_no_destination_at_all_is_a_warning_and_a_no_op() -> None:
    """In an empty environment: exit 0, one warning line, nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
    code = "import rankwatch.hooks as rw; assert rw.init() is None; rw.step_begin(0); rw.step_end()"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "rankwatch hooks: off" in lines[0], done.stderr
    assert done.stdout == ""


def test_with_kafka_the_rank_spools_by_default_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    config = hooks.HooksConfig(kafka="127.0.0.1:9")  # nothing listens there
    rw = hooks.init(config, identity=IDENT)
    try:
        assert rw is not None and rw.publisher.spool is not None
        path = rw.publisher.spool.path
        assert path == tmp_path / f"rankwatch-{os.getuid()}" / "spool" / "j.rank3.spool"
        assert (path.parent.stat().st_mode & 0o777) == 0o700
    finally:
        hooks.shutdown()


def test_spool_off_means_none(tmp_path: Path) -> None:
    rw = hooks.init(hooks.HooksConfig(kafka="127.0.0.1:9", spool_dir="off"), identity=IDENT)
    try:
        assert rw is not None and rw.publisher.spool is None
    finally:
        hooks.shutdown()
