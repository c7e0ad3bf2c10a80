from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rankwatch.schemas.spool import (
    Message,
    Spool,
    SpoolBusy,
    SpoolError,
    default_spool_dir,
    private_dir,
    take_lock,
)


def test_append_read_replace(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s" / "r0.spool")
    a, b = Message("ops", b'{"a":1}', 3), Message("heartbeats", b'{"b":2}', 0)
    assert spool.append(a) and spool.append(b)
    assert spool.read() == [a, b]
    assert spool.pending_records() == 3
    spool.replace([b])
    assert spool.read() == [b] and spool.pending_records() == 0
    spool.close()
    assert Spool(tmp_path / "s" / "r0.spool").read() == [b]  # survives a restart


def test_full_spool_refuses(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "r0.spool", max_bytes=30)
    assert spool.append(Message("ops", b"x" * 10, 1))
    assert not spool.append(Message("ops", b"y" * 10, 1))
    assert spool.read() == [Message("ops", b"x" * 10, 1)]


def test_a_torn_last_frame_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "r0.spool"
    spool = Spool(path)
    spool.append(Message("ops", b"whole", 2))
    spool.append(Message("ops", b"torn-frame", 2))
    path.write_bytes(path.read_bytes()[:-3])
    spool.close()
    assert Spool(path).read() == [Message("ops", b"whole", 2)]


def test_a_spool_belongs_to_one_live_process_and_an_empty_one_leaves_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.rank0.spool"
    spool = Spool(path)
    with pytest.raises(SpoolBusy):
        Spool(path)  # the same rank twice, or an agent sending it
    assert take_lock(path) is None
    spool.close()
    assert not path.exists() and not Path(f"{path}.lock").exists()
    kept = Spool(path)
    kept.append(Message("ops", b"x", 1))
    kept.close()
    assert path.exists()  # left for the host's agent: its lock is free now
    fd = take_lock(path)
    assert fd is not None
    os.close(fd)


def test_the_default_directory_is_private_and_a_shared_one_is_refused(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "rankwatch-1" / "spool")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(SpoolError, match="not private"):
        private_dir(shared)
    link = tmp_path / "rankwatch-2"
    link.symlink_to(shared)
    with pytest.raises(SpoolError, match="not a directory of its own"):
        private_dir(link / "spool")
    assert default_spool_dir().name == "spool"
    assert default_spool_dir().parent.name == f"rankwatch-{os.getuid()}"


def test_a_full_disk_refuses_the_message_and_keeps_the_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spool's disk is full: the message is refused (counted as dropped by the
    publisher, never raised into its thread) and nothing half-written stays."""
    spool = Spool(tmp_path / "r0.spool")
    assert spool.append(Message("ops", b"kept", 1))
    real_open = Path.open

    def full_disk(self: Path, mode: str = "r", *args: object, **kw: object) -> object:
        if self == spool.path and "a" in mode:
            raise OSError(28, "No space left on device")
        return real_open(self, mode, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", full_disk)
    assert not spool.append(Message("ops", b"lost", 1))
    monkeypatch.undo()
    assert spool.read() == [Message("ops", b"kept", 1)]
