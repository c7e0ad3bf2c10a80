"""The jobs table's rows: sizes and hosts from the op batches, times from the closed
steps; one row when the job's first step closes, another when its shape changes,
otherwise one per refresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from rankwatch.schemas.ddl import tables
from rankwatch.schemas.examples import T0_NS, example_batch
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.streams.ops.assembly import StepAssembler
from rankwatch.streams.ops.jobs import JobBook


def _at(ns: int) -> datetime:
    """The expected datetime of an ns time, floored to the microsecond in integers (a
    float would round: the bug ``streams/kit/times.py`` ``utc`` describes)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)


SECOND = 10**9


def batch(rank: int, host: str, at_s: float = 0.0, **overrides: object) -> OpBatch:
    """A batch of step 3 of the DP 2 x PP 2 job, rank r = dp * 2 + stage, ``at_s`` late."""
    b = example_batch(4, **overrides)
    return OpBatch(**{
        **{f: getattr(b, f) for f in b.__dataclass_fields__},
        "rank": rank, "dp_rank": rank // 2, "pp_rank": rank % 2, "dp_size": 2, "pp_size": 2,
        "host": host, "start_ns": b.start_ns + int(at_s * SECOND),
    })  # fmt: skip


def feed(book: JobBook, batches: list[OpBatch]) -> list[dict[str, Any]]:
    """The batches through an assembler, as the pipeline does: rows due at step close."""
    assembler = StepAssembler()
    for b in batches:
        book.observe(b)
        assembler.add(b, 0)
    return [row for step in assembler.flush() if (row := book.due(step)) is not None]


def whole_job(at_s: float = 0.0) -> list[OpBatch]:
    return [batch(rank, f"node-{rank // 2}", at_s) for rank in range(4)]


def test_one_row_when_the_first_step_closes() -> None:
    (row,) = feed(JobBook(), whole_job())
    assert (row["dp_size"], row["pp_size"], row["tp_size"], row["world_size"]) == (2, 2, 1, 4)
    assert row["hosts"] == ["node-0", "node-1"]
    assert row["first_seen"] == _at(T0_NS)
    assert row["last_seen"] == _at(T0_NS + 3_900_000)


def test_rows_have_exactly_the_tables_columns() -> None:
    (row,) = feed(JobBook(), whole_job())
    assert set(row) == set(tables()["jobs"].columns)


def test_a_new_host_is_a_row_at_once_and_time_alone_once_a_refresh() -> None:
    book = JobBook(refresh_ns=60 * SECOND)
    (first,) = feed(book, whole_job())
    assert feed(book, whole_job(at_s=30)) == []
    (moved,) = feed(book, [*whole_job(at_s=31)[:3], batch(3, "node-9", at_s=31)])
    assert moved["hosts"] == ["node-0", "node-1", "node-9"]  # rank 3 on a spare machine
    (later,) = feed(book, whole_job(at_s=100))
    assert later["version"] > moved["version"] > first["version"]


def test_tensor_parallel_and_chunks_count_in_the_sizes() -> None:
    chunk1 = np.ones(4, dtype=np.int64)
    peer = batch(7, "node-3", tp_rank=1, chunk=chunk1)  # a TP peer: counted, not assembled
    (row,) = feed(JobBook(), [peer, batch(0, "node-0", chunk=chunk1)])
    assert (row["tp_size"], row["vpp_size"], row["world_size"]) == (2, 2, 8)


def test_a_restarted_worker_keeps_the_stored_first_seen_and_hosts() -> None:
    book = JobBook()
    book.restore("job-1", T0_NS - 3600 * SECOND, frozenset({"node-7"}))
    (row,) = feed(book, whole_job())
    assert row["first_seen"] == _at(T0_NS - 3600 * SECOND)
    assert row["hosts"] == ["node-0", "node-1", "node-7"]


def test_forgotten_jobs_give_no_row() -> None:
    book = JobBook()
    feed(book, whole_job())
    book.forget("job-1")
    assert book.unwritten() == []


def test_the_end_of_a_replay_writes_what_moved_since_the_last_row() -> None:
    book = JobBook()
    feed(book, whole_job())
    assert book.unwritten() == []
    assert feed(book, whole_job(at_s=5)) == []  # within the refresh: no row yet
    (row,) = book.unwritten()
    assert row["last_seen"] > row["first_seen"] + timedelta(seconds=5)
    assert book.unwritten() == []
