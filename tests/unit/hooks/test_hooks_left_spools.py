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

    def __call__(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not self.up:
            raise ConnectionError("broker away")
        self.got += items


def left(folder: Path, name: str, values: list[bytes], *, close: bool = True) -> Spool:
    spool = Spool(folder / name)
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
