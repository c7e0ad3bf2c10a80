"""The store on real ClickHouse engines: embedded chDB (``chdb://``), a fresh data
directory per test, and the same tests through the ``http://`` path, against chDB behind
the HTTP endpoint of ``support/chdbhttp.py`` (a process of its own, a fresh database per
test)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from support.chdbhttp import ChdbHttp, endpoint

from rankwatch.commands import db as db_command
from rankwatch.schemas.ddl import migrations, tables
from rankwatch.schemas.examples import T0_NS, example, example_batch
from rankwatch.schemas.tables import CONTRACTS
from rankwatch.streams.kit.housekeeping import BACKGROUND_THREADS
from rankwatch.streams.kit.output import alert_row
from rankwatch.streams.kit.store import Column, Store, StoreError
from rankwatch.streams.ops.pipeline import JobHistory
from rankwatch.streams.ops.recovery import load_history

pytestmark = pytest.mark.integration

NOW_NS = time.time_ns() // 10**9 * 10**9
"""Rows of tables with a TTL must be recent, or ClickHouse drops them on insert."""


@pytest.fixture(scope="module")
def http_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbHttp]:
    with endpoint(tmp_path_factory.mktemp("chdbhttp")) as running:
        yield running


@pytest.fixture(params=["chdb", "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "chdb":
        dsn, database = f"chdb://{tmp_path / 'chdb'}", "rw_test"
    else:
        dsn = request.getfixturevalue("http_endpoint").dsn()
        database = f"rw_{uuid.uuid4().hex[:12]}"
    with Store.connect(dsn, database=database) as opened:
        opened.migrate()
        yield opened


def _steps_row(version: int, slowdown: float = 1.25) -> dict[str, object]:
    row = CONTRACTS["steps"].row(
        example("steps", slowdown=slowdown), analysed_at=datetime.now(UTC), version=version
    )
    return row


def test_migrate_twice_the_second_is_a_no_op(tmp_path: Path) -> None:
    with Store.connect(f"chdb://{tmp_path}") as store:
        assert store.migrate() == [m.name for m in migrations()]
        assert store.migrate() == []
        present = {row["name"] for row in store.query("SHOW TABLES")}
        assert present == {*tables(), "schema_migrations"}
        n = len(migrations())
        assert store.query("SELECT count() AS n FROM schema_migrations") == [{"n": n}]
        assert store.database == "rankwatch"


def test_migrate_refuses_an_applied_migration_that_changed(store: Store) -> None:
    store.query("TRUNCATE TABLE schema_migrations")
    store.insert("schema_migrations", [{"name": migrations()[0].name, "checksum": "0" * 64}])
    with pytest.raises(StoreError, match="changed after it was applied"):
        store.migrate()


def test_the_engine_sees_the_declared_tables(store: Store) -> None:
    """What ClickHouse reports after migrating is what the DDL reader (and so every
    schema/DDL unit test) saw in the files."""
    for name, declared in tables().items():
        described = {c.name: c.type for c in store.columns(name)}
        assert described == declared.columns, name
        engine = store.query(
            "SELECT sorting_key FROM system.tables"
            " WHERE database = {db:String} AND name = {t:String}",
            {"db": store.database, "t": name},
        )
        assert tuple(engine[0]["sorting_key"].split(", ")) == declared.order_by, name


def test_migrate_reads_the_columns_that_describe_reports(store: Store) -> None:
    """One query at migrate stands for a ``DESCRIBE`` per table at its first insert: the
    same columns, in order, with the same kinds of default."""
    for name in [*tables(), "schema_migrations"]:
        rows = store.query(f"DESCRIBE TABLE {name}")
        described = tuple(Column(r["name"], r["type"], r["default_type"]) for r in rows)
        assert store.columns(name) == described, name


def test_a_job_the_store_never_saw_is_restored_in_one_query(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new job's restore (inside its first step) asks once whether the store holds
    any of its rows; one row, here a batch of a step still open when a worker died,
    sends it down the whole read, which finds that batch."""
    asked: list[str] = []
    query = store.query
    monkeypatch.setattr(store, "query", lambda sql, p=None: asked.append(sql) or query(sql, p))
    assert load_history(store, "job-1", (4, 2), 64, 20, 10) == JobHistory()
    assert len(asked) == 1
    store.insert_ops([example_batch(5, start_ns=NOW_NS + np.arange(5))])
    history = load_history(store, "job-1", (4, 2), 64, 20, 10)
    assert history.stored_batches and len(asked) > 2


def test_steps_insert_query_and_dedup_with_final(store: Store) -> None:
    store.insert("steps", [_steps_row(version=1, slowdown=1.5)])
    store.insert("steps", [_steps_row(version=2, slowdown=1.25)])  # a re-analysis
    store.insert("steps", [_steps_row(version=2, slowdown=1.25)])  # a retried insert
    rows = store.query(
        "SELECT step, slowdown, version, missing_workers, waste, partial"
        " FROM steps FINAL WHERE job = {job:String}",
        {"job": "job-1"},
    )
    assert rows == [
        {
            "step": 3,
            "slowdown": 1.25,
            "version": 2,
            "missing_workers": [],
            "waste": 0.2,
            "partial": 0,
        }
    ]


def test_null_and_arrays(store: Store) -> None:
    row = _steps_row(version=1)
    row.update(waste=None, partial=True, missing_workers=["0,1", "3,2"])
    store.insert("steps", [row])
    (got,) = store.query("SELECT waste, partial, missing_workers FROM steps")
    assert got == {"waste": None, "partial": 1, "missing_workers": ["0,1", "3,2"]}


def test_datetime64_round_trips_in_utc(store: Store) -> None:
    """ns ints and aware datetimes in any zone go in; aware UTC datetimes come out."""
    ist = timezone(timedelta(hours=5, minutes=30))
    analysed = datetime(2026, 3, 1, 17, 30, 0, 123000, tzinfo=ist)
    row = _steps_row(version=1)
    row.update(time=T0_NS + 456_789_000, analysed_at=analysed)
    store.insert("steps", [row])
    (got,) = store.query("SELECT time, analysed_at, toUnixTimestamp64Milli(time) AS ms FROM steps")
    assert got["analysed_at"] == analysed
    assert got["analysed_at"].utcoffset() == timedelta(0)
    assert got["time"] == datetime(2024, 11, 19, 7, 6, 40, 456000, tzinfo=UTC)
    assert got["ms"] == (T0_NS + 456_789_000) // 1_000_000
    in_range = store.query(
        "SELECT count() AS n FROM steps WHERE time >= {t:DateTime64(3, 'UTC')}",
        {"t": datetime(2024, 11, 19, 7, 6, 40, tzinfo=UTC)},
    )
    assert in_range == [{"n": 1}]


def test_a_column_of_ns_and_datetimes_stores_both(store: Store) -> None:
    """Rows may give a time as ns or as an aware datetime; one insert may mix them (the
    client takes a column as all ticks or all datetimes, so they become ticks)."""
    as_ns, as_datetime = _steps_row(version=1), _steps_row(version=1)
    as_ns.update(step=1, time=T0_NS + 456_789_000)
    moment = datetime(2024, 11, 19, 7, 6, 41, 5000, tzinfo=UTC)
    as_datetime.update(step=2, time=moment)
    store.insert("steps", [as_ns, as_datetime])
    got = store.query("SELECT step, toUnixTimestamp64Milli(time) AS ms FROM steps ORDER BY step")
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert got == [
        {"step": 1, "ms": (T0_NS + 456_789_000) // 1_000_000},
        {"step": 2, "ms": (moment - epoch) // timedelta(milliseconds=1)},
    ]


def test_naive_datetimes_are_refused(store: Store) -> None:
    row = _steps_row(version=1)
    row["analysed_at"] = datetime(2026, 1, 1)
    with pytest.raises(StoreError, match="naive"):
        store.insert("steps", [row])


def test_ops_keep_ns_and_collapse_duplicates(store: Store) -> None:
    batch = example_batch(200, extras=True, start_ns=NOW_NS + np.arange(200) * 1000)
    plain = example_batch(5, rank=6, start_ns=NOW_NS + np.arange(5) * 7 + 1)
    store.insert_ops([batch, plain])
    store.insert_ops([batch])  # a hook retried the batch
    (got,) = store.query(
        "SELECT count() AS n, countIf(bytes IS NULL) AS no_bytes,"
        " groupUniqArray(optype) AS optypes FROM ops FINAL"
    )
    assert got["n"] == 205
    assert got["no_bytes"] == 5
    assert sorted(got["optypes"]) == ["backward-compute", "forward-compute"]
    ns = store.query("SELECT toUnixTimestamp64Nano(time) AS ns FROM ops WHERE rank = 6 ORDER BY ns")
    assert [r["ns"] for r in ns] == (NOW_NS + np.arange(5) * 7 + 1).tolist()


def test_arrow_and_row_inserts_store_the_same_ops(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Numpy-only op columns go to the engine as Arrow; what is stored is what the
    clickhouse-connect path stores, value for value (ns times included)."""
    from rankwatch.streams.kit import store as store_module

    batches = [
        example_batch(50, extras=True, start_ns=NOW_NS + np.arange(50) * 7),
        example_batch(20, extras=True, rank=6, start_ns=NOW_NS + np.arange(20) * 3 + 1),
        # header strings as codes; recent, as all three (older ones meet the TTL)
        example_batch(10, rank=7, job="job-b", host="host-b", start_ns=NOW_NS + np.arange(10)),
    ]
    query = (
        "SELECT * EXCEPT inserted_at, toUnixTimestamp64Nano(time) AS ns FROM ops"
        " ORDER BY rank, optype, seq_id"
    )
    store.insert_ops(batches)
    via_arrow = store.query(query)
    store.query("TRUNCATE TABLE ops")
    monkeypatch.setattr(store_module, "_arrow_table", lambda known, columns: None)
    store.insert_ops(batches)
    assert store.query(query) == via_arrow
    assert len(via_arrow) == 80
    assert via_arrow[0]["ns"] == NOW_NS
    by_rank = {(r["rank"], r["job"], r["host"]) for r in via_arrow}
    first = (batches[0].rank, batches[0].job, batches[0].host)
    assert by_rank == {first, (6, batches[1].job, batches[1].host), (7, "job-b", "host-b")}


def test_arrow_insert_refuses_values_out_of_range(store: Store) -> None:
    with pytest.raises(StoreError, match="chunk"):
        store.insert_ops([example_batch(3, chunk=np.array([0, 1, 40_000]))])
    assert store.query("SELECT count() AS n FROM ops") == [{"n": 0}]


def test_dead_letter_insert(store: Store) -> None:
    payload = b'{"schema": "ops", "version": 9' * 10
    store.insert(
        "dead_letters",
        [
            {
                "time": NOW_NS,
                "topic": "rankwatch.ops",
                "partition": 3,
                "offset": 1234,
                "key": "job-1",
                "reason": "unknown-version",
                "detail": "$.version: 9; known: [1]",
                "payload": payload[:64].decode(),
                "payload_bytes": len(payload),
            }
        ],
    )
    (got,) = store.query("SELECT * FROM dead_letters")
    assert got["reason"] == "unknown-version"
    assert got["offset"] == 1234 and got["payload_bytes"] == len(payload)
    assert len(got["payload"]) == 64


def test_alert_rows_from_messages(store: Store) -> None:
    message = {**example("alerts"), "ts_ns": 1_732_000_120_123_456_789}
    store.insert("alerts", [alert_row(message)])
    (got,) = store.query("SELECT kind, state, evidence, ts_ns FROM alerts")
    assert got.pop("ts_ns") == message["ts_ns"]  # to the ns (time holds ms)
    assert got == {
        "kind": "hang",
        "state": "firing",
        "evidence": '{"culprit_ranks":[5],"waiting_ranks":[0,1,2,3]}',
    }
    with pytest.raises(StoreError) as caught:  # the CHECK constraint on kind
        store.insert("alerts", [alert_row(example("alerts", kind="meltdown"))])
    assert not caught.value.transient  # bad data: retrying cannot help


def test_inserts_that_do_not_fit_the_table(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown columns"):
        store.insert("steps", [{**_steps_row(1), "colour": "red"}])
    row = _steps_row(1)
    del row["t_base"]
    with pytest.raises(StoreError, match=r"missing columns \['t_base'\]"):
        store.insert("steps", [row])
    with pytest.raises(StoreError, match="same columns"):
        store.insert("steps", [_steps_row(1), {"job": "x"}])
    with pytest.raises(StoreError):
        store.insert("no_such_table", [{"a": 1}])
    with pytest.raises(StoreError, match="identifier"):
        store.columns("steps; DROP TABLE steps")


def test_a_row_the_engine_refuses_for_its_value_is_a_refusal_the_others_are_failures(
    store: Store,
) -> None:
    """The engine's own answers, over chDB and HTTP: a row breaking a table's CHECK
    constraint is refused for what it holds (one that the delivery dead-letters, the
    rest stored); rows that do not match the table are the table's fault, not the
    rows' (a failure: kept, retried, health red)."""
    from rankwatch.streams.kit.delivery import Delivery
    from rankwatch.streams.kit.output import Output

    row = {"job": "j", "step": 1, "time": datetime.now(UTC), "dimension": "stage",
           "group": "0", "slowdown": 1.5, "version": 1}  # fmt: skip
    with pytest.raises(StoreError) as caught:
        store.insert("step_attribution", [{**row, "dimension": "colour"}])
    assert caught.value.refused and "VIOLATED_CONSTRAINT" in str(caught.value)
    with pytest.raises(StoreError) as caught:
        store.insert("step_attribution", [{**row, "colour": "red"}])
    assert not caught.value.refused
    delivery = Delivery(lambda: store)
    out = Output()
    for group in range(5):
        out.add("step_attribution", {**row, "group": str(group)})
    out.add("step_attribution", {**row, "group": "bad", "dimension": "colour"})
    delivery.write(out)
    assert delivery.flush() and delivery.counters.rows_refused == 1
    stored = store.query("SELECT `group` FROM step_attribution FINAL ORDER BY `group`")
    assert [r["group"] for r in stored] == ["0", "1", "2", "3", "4"]
    (letter,) = store.query("SELECT topic, reason, payload FROM dead_letters FINAL")
    assert letter["topic"] == "store:step_attribution" and letter["reason"] == "store-refused"
    assert '"group":"bad"' in letter["payload"]


def test_db_migrate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(clickhouse=f"chdb://{tmp_path}", database="cli_db")
    assert db_command.run_migrate(args) == 0
    assert db_command.run_migrate(args) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(migrations())
    assert out[:n] == [f"applied {m.name}" for m in migrations()]
    assert out[n].endswith(f"({n} migration(s) applied now)")
    assert out[n + 1].endswith("(0 migration(s) applied now)")


def test_a_path_held_by_another_process_is_refused(tmp_path: Path) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from rankwatch.streams.kit.store import Store
        store = Store.connect("chdb://{tmp_path}")
        print("ready", flush=True)
        sys.stdin.read()
        store.close()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(
            StoreError, match=f"in use by another process \\(pid {proc.pid}\\)"
        ) as caught:
            Store.connect(f"chdb://{tmp_path}")
        assert caught.value.transient
    finally:
        proc.communicate("", timeout=60)
    with Store.connect(f"chdb://{tmp_path}") as store:  # free again once the holder exits
        assert store.query("SELECT 1 AS one") == [{"one": 1}]


def test_unreachable_server_is_a_store_error() -> None:
    with pytest.raises(
        StoreError, match=re.escape("cannot reach ClickHouse at http://127.0.0.1:1/db")
    ) as caught:
        Store.connect("http://user:secret@127.0.0.1:1/db")
    assert "secret" not in str(caught.value)
    assert caught.value.transient


def test_bad_dsn() -> None:
    with pytest.raises(StoreError, match="DSN"):
        Store.connect("postgres://localhost/x")


def test_stores_of_one_process_share_a_path(tmp_path: Path) -> None:
    with (
        Store.connect(f"chdb://{tmp_path}") as first,
        Store.connect(f"chdb://{tmp_path}/") as second,
    ):
        first.migrate()
        first.insert("steps", [_steps_row(version=1)])
        assert second.query("SELECT count() AS n FROM steps") == [{"n": 1}]
    with Store.connect(f"chdb://{tmp_path}") as again:  # the lock went with the last one
        assert again.query("SELECT count() AS n FROM steps") == [{"n": 1}]


def test_in_memory() -> None:
    with Store.connect("chdb://memory", database="scratch") as store:
        assert store.migrate() == [m.name for m in migrations()]
        assert store.where == "chdb://memory"


def _threads() -> list[tuple[str, int]]:
    """(name, nice value) of each thread of this process."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            out.append((name, os.getpriority(os.PRIO_PROCESS, int(tid))))
        except OSError:  # ended meanwhile
            continue
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_chdb_merges_run_at_the_housekeeping_nice_value(store: Store) -> None:
    """The thread names the store lowers are the ones chDB gives its merges (a chDB that
    renamed them would leave its merges competing with the worker, silently)."""
    if store.housekeeping is None:
        pytest.skip("embedded chDB's threads only")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base >= 19:
        pytest.skip("this process runs at nice 19 already")
    assert store.housekeeping is not None
    store.housekeeping.every_s = 0.0
    deadline = time.monotonic() + 30
    version = 0
    while not any(name == "MergeMutate" for name, _ in _threads()):
        assert time.monotonic() < deadline, f"no merge thread in 30 s: {sorted(_threads())}"
        version += 1  # parts of one partition, which chDB merges in the background
        store.insert("steps", [_steps_row(version=version)])
        time.sleep(0.05)
    store.insert("steps", [_steps_row(version=version + 1)])  # the insert after lowers them
    threads = _threads()
    assert {nice for name, nice in threads if name == "MergeMutate"} == {19}
    assert {nice for name, nice in threads if name == "python"} == {base}
    # ClickHouse's shared pool threads that a merge started inherit its priority (Linux
    # threads do), also when they later serve an insert: they are not checked here. Nor is
    # the engine's memory monitor, found at nice 19 in 1 run of 8 of this file (at
    # 0fbce8a and after): the store lowers no thread of that name, so it inherited it.
    # Nor a query's pipeline executor (QueryPullPipeEx), started from a lowered pool
    # thread: found at nice 19 in 1 of 8 loop runs of this file (2026-12-02)
    shared = {"ThreadPool", "MemoryWorker", "QueryPullPipeEx", *BACKGROUND_THREADS}
    lowered = [(name, nice) for name, nice in threads if nice == 19 and name not in shared]
    assert lowered == [], sorted(threads)
