"""The jobs table's rows: sizes and hosts from the op batches, one row when the job
is first complete, another when its shape changes, otherwise one per refresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from rankwatch.schemas.ddl import tables
from rankwatch.schemas.examples import T0_NS, example_batch
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.streams.jobs import JobBook, facts_of

SECOND = 10**9


def batch(rank: int, host: str, at_s: float = 0.0, **overrides: object) -> OpBatch:
    """A batch of the DP 2 x PP 2 job, rank r = dp * 2 + stage, ``at_s`` into the job."""
    b = example_batch(4, **overrides)
    shift = int(at_s * SECOND)
    return OpBatch(**{
        **{f: getattr(b, f) for f in b.__dataclass_fields__},
        "rank": rank, "dp_rank": rank // 2, "pp_rank": rank % 2, "dp_size": 2, "pp_size": 2,
        "host": host, "start_ns": b.start_ns + shift,
    })  # fmt: skip


def whole_job(book: JobBook, at_s: float = 0.0) -> None:
    for rank in range(4):
        book.observe(batch(rank, f"node-{rank // 2}", at_s))


def test_one_row_once_the_job_is_seen_whole() -> None:
    book = JobBook()
    whole_job(book)
    row = book.due("job-1")
    assert row is not None
    assert (row["dp_size"], row["pp_size"], row["tp_size"], row["world_size"]) == (2, 2, 1, 4)
    assert row["hosts"] == ["node-0", "node-1"]
    assert row["first_seen"] == datetime.fromtimestamp(T0_NS / 1e9, tz=UTC)
    assert row["last_seen"] == datetime.fromtimestamp((T0_NS + 3_900_000) / 1e9, tz=UTC)
    assert book.due("job-1") is None  # nothing changed


def test_rows_have_exactly_the_tables_columns() -> None:
    book = JobBook()
    whole_job(book)
    row = book.due("job-1")
    assert row is not None
    assert set(row) == set(tables()["jobs"].columns)


def test_a_new_host_is_a_row_at_once_and_time_alone_once_a_refresh() -> None:
    book = JobBook(refresh_ns=60 * SECOND)
    whole_job(book)
    assert book.due("job-1") is not None
    whole_job(book, at_s=30)
    assert book.due("job-1") is None
    book.observe(batch(3, "node-9", at_s=31))  # rank 3 moved to a spare machine
    row = book.due("job-1")
    assert row is not None and row["hosts"] == ["node-0", "node-1", "node-9"]
    whole_job(book, at_s=100)
    later = book.due("job-1")
    assert later is not None and later["version"] > row["version"]


def test_tensor_parallel_and_chunks_count_in_the_sizes() -> None:
    b = batch(7, "node-3", tp_rank=1, chunk=np.ones(4, dtype=np.int64))
    facts = facts_of(b)
    assert facts is not None
    assert (facts.tp_size, facts.vpp_size, facts.world_size) == (2, 2, 8)


def test_a_restarted_worker_keeps_the_stored_first_seen_and_hosts() -> None:
    book = JobBook()
    book.restore("job-1", T0_NS - 3600 * SECOND, frozenset({"node-7"}))
    whole_job(book)
    row = book.due("job-1")
    assert row is not None
    assert row["first_seen"] == datetime.fromtimestamp(T0_NS / 1e9 - 3600, tz=UTC)
    assert row["hosts"] == ["node-0", "node-1", "node-7"]


def test_forgotten_jobs_and_unknown_jobs_give_no_row() -> None:
    book = JobBook()
    whole_job(book)
    book.forget("job-1")
    assert book.due("job-1") is None
    assert book.due("never-seen") is None


def test_the_end_of_a_replay_writes_what_moved_since_the_last_row() -> None:
    book = JobBook()
    whole_job(book)
    assert book.due("job-1") is not None
    assert book.unwritten() == []
    whole_job(book, at_s=5)
    (row,) = book.unwritten()
    assert row["last_seen"] > row["first_seen"] + timedelta(seconds=5)
    assert book.unwritten() == []
