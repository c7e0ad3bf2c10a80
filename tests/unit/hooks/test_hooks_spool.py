from __future__ import annotations

from pathlib import Path

from rankwatch.hooks.spool import Message, Spool


def test_append_read_replace(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s" / "r0.spool")
    a, b = Message("ops", b'{"a":1}', 3), Message("heartbeats", b'{"b":2}', 0)
    assert spool.append(a) and spool.append(b)
    assert spool.read() == [a, b]
    assert spool.pending_records() == 3
    spool.replace([b])
    assert spool.read() == [b] and spool.pending_records() == 0
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
    assert Spool(path).read() == [Message("ops", b"whole", 2)]
