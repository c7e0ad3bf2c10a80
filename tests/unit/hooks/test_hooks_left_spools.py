"""Spools left behind by ranks that are gone (their job ended while the broker was
away): the host's agent or relay sends them, keyed by the job, and removes them once
the broker has everything; a live rank's spool, and one the broker did not take, stay."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from rankwatch.agent.spools import SpoolSweeper, job_of
from rankwatch.schemas.spool import Message, Spool


class Broker:
    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.got: list[tuple[bytes, bytes]] = []
        self.topics: list[str] = []

    def __call__(self, topic: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not self.up:
            raise ConnectionError("broker away")
        self.got += items
        self.topics.append(topic)


def left(
    folder: Path, name: str, values: list[bytes], *, close: bool = True, **meta: object
) -> Spool:
    spool = Spool(folder / name, meta=meta or None)
    for v in values:
        spool.append(Message("ops", v, len(v)))
    if close:
        spool.close()  # the rank is gone: its lock is free
    return spool


def test_a_gone_ranks_spool_is_sent_keyed_by_its_job_then_removed(tmp_path: Path) -> None:
    left(tmp_path, "job.a.rank0.spool", [b"m1", b"m22"])
    left(tmp_path, "other.rank3.4242.spool", [b"m3"])
    broker = Broker()
    sweeper = SpoolSweeper(tmp_path, broker)
    assert sweeper.sweep() == 2
    assert sorted(broker.got) == [(b"job.a", b"m1"), (b"job.a", b"m22"), (b"other", b"m3")]
    assert broker.topics == ["rankwatch.ops", "rankwatch.ops"]  # no head: the default
    assert list(tmp_path.iterdir()) == []
    assert (sweeper.counters.files_sent, sweeper.counters.records_sent) == (2, 7)


def test_a_live_ranks_spool_and_one_the_broker_refused_stay(tmp_path: Path) -> None:
    live = left(tmp_path, "j.rank0.spool", [b"live"], close=False)
    left(tmp_path, "j.rank1.spool", [b"gone"])
    broker = Broker(up=False)
    sweeper = SpoolSweeper(tmp_path, broker)
    assert sweeper.sweep() == 0 and sweeper.counters.send_failures == 1
    assert (tmp_path / "j.rank1.spool").exists()
    broker.up = True
    assert sweeper.sweep() == 1 and broker.got == [(b"j", b"gone")]
    assert (tmp_path / "j.rank0.spool").exists()  # its rank resends it itself
    live.close()


@pytest.mark.parametrize(
    ("name", "job"),
    [("j.rank0.spool", "j"), ("a.rank.b.rank12.spool", "a.rank.b"), ("x.spool", "")],
)
def test_the_job_is_read_from_the_name_the_hooks_give(name: str, job: str) -> None:
    assert job_of(Path(name)) == job


def test_a_left_spool_goes_where_its_rank_sent_and_another_kafkas_stays(tmp_path: Path) -> None:
    """The head of the file says where its rank sent: its job, topic prefix and Kafka.
    A spool of another cluster is not this sweeper's to send."""
    left(tmp_path, "x.rank0.spool", [b"a"], job="real-job", topic_prefix="p1", kafka="k:1")
    left(tmp_path, "y.rank0.spool", [b"b"], job="other", topic_prefix="p2", kafka="elsewhere:9")
    broker = Broker()
    sweeper = SpoolSweeper(tmp_path, broker, default_prefix="dflt", kafka="k:1")
    assert sweeper.sweep() == 1
    assert (broker.topics, broker.got) == (["p1.ops"], [(b"real-job", b"a")])
    assert (tmp_path / "y.rank0.spool").exists() and sweeper.counters.elsewhere == 1


def test_a_head_is_kept_across_a_resend_and_old_files_read_as_before(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "j.rank0.spool", meta={"job": "j", "topic_prefix": "p"})
    spool.append(Message("ops", b"m1", 1))
    spool.append(Message("ops", b"m2", 1))
    spool.replace([Message("ops", b"m2", 1)])
    assert spool.read() == [Message("ops", b"m2", 1)] and spool.meta["topic_prefix"] == "p"
    spool.close()
    old = tmp_path / "old.rank1.spool"  # a file written before heads: frames only
    old.write_bytes(bytes([0]) + (1).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"m3")
    assert Spool(old, lock=False).read() == [Message("ops", b"m3", 1)]
    assert Spool(old, lock=False).meta == {}


def test_a_lock_file_without_its_spool_is_removed(tmp_path: Path) -> None:
    (tmp_path / "gone.rank0.spool.lock").touch()  # a rank killed before it spooled
    SpoolSweeper(tmp_path, Broker()).sweep()
    assert list(tmp_path.iterdir()) == []
