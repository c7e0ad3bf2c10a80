"""Reading trace files: the same Trace whatever the op-type column's encoding, and a
one-line error for a column that cannot be op types."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rankwatch.errors import UserError
from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.traceio import read_trace, write_trace


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=2))[0]


def table_with_optype(trace: Trace, optype: pa.Array) -> pa.Table:
    columns = trace.columns()
    columns["optype"] = optype
    columns["note"] = np.full(len(trace), "ignored")  # a column a trace does not have
    return pa.table(columns)


def assert_same(read: Trace, written: Trace) -> None:
    """Equal values; integer columns but step read back as int32 when they fit."""
    for f in fields(Trace):
        a, b = getattr(read, f.name), getattr(written, f.name)
        np.testing.assert_array_equal(a, b, err_msg=f.name)
        narrow = b.dtype == np.int64 and f.name != "step"
        assert a.dtype == (np.int32 if narrow else b.dtype), f.name


def test_step_numbers_stay_int64_for_keys_made_from_them(trace: Trace, tmp_path: Path) -> None:
    """streams/ops/replay.py orders records by ``step * 2**24 + rank``: int32 wraps at 128."""
    write_trace(replace(trace, step=trace.step + 1000), tmp_path / "t.parquet")
    read = read_trace(tmp_path / "t.parquet")
    assert read.step.dtype == np.int64
    assert (read.step * (1 << 24) + read.rank > 0).all()


def test_a_written_trace_reads_back_identical(trace: Trace, tmp_path: Path) -> None:
    write_trace(trace, tmp_path / "t.parquet")
    assert_same(read_trace(tmp_path / "t.parquet"), trace)


@pytest.mark.parametrize("rows", ["all", "last"])
def test_integers_beyond_int32_stay_int64(trace: Trace, tmp_path: Path, rows: str) -> None:
    """Also when only a later row group holds them (read a row group at a time)."""
    columns = trace.columns()
    seq_id = columns["seq_id"].copy()
    seq_id[slice(None) if rows == "all" else slice(-1, None)] += 2**40
    columns["seq_id"] = seq_id
    pq.write_table(pa.table(columns), tmp_path / "t.parquet", row_group_size=7)
    read = read_trace(tmp_path / "t.parquet")
    assert read.seq_id.dtype == np.int64
    np.testing.assert_array_equal(read.seq_id, seq_id)
    assert read.stage.dtype == np.int32


def test_an_empty_number_is_an_error(trace: Trace, tmp_path: Path) -> None:
    columns = trace.columns()
    columns["duration"] = pa.array([None, *trace.duration[1:].tolist()], pa.float64())
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    with pytest.raises(UserError, match=r"1 empty value.*duration"):
        read_trace(tmp_path / "t.parquet")


@pytest.mark.parametrize("encoding", ["string", "dictionary", "codes", "chunked"])
def test_every_optype_encoding_gives_the_same_trace(
    trace: Trace, tmp_path: Path, encoding: str
) -> None:
    names = pa.array(trace.optype_names.tolist())
    optype = {
        "string": names,
        "dictionary": names.dictionary_encode(),
        "codes": pa.array(trace.optype),
        "chunked": pa.chunked_array([names[:5], names[5:]]),
    }[encoding]
    pq.write_table(table_with_optype(trace, optype), tmp_path / "t.parquet", row_group_size=7)
    assert_same(read_trace(tmp_path / "t.parquet"), trace)


def test_an_unknown_op_type_is_named(trace: Trace, tmp_path: Path) -> None:
    names = trace.optype_names.tolist()
    names[3] = "teleport"
    pq.write_table(table_with_optype(trace, pa.array(names)), tmp_path / "t.parquet")
    with pytest.raises(UserError, match=r"unknown op type.*teleport"):
        read_trace(tmp_path / "t.parquet")


def test_an_empty_op_type_is_an_error(trace: Trace, tmp_path: Path) -> None:
    names: list[str | None] = list(trace.optype_names.tolist())
    names[0] = None
    pq.write_table(table_with_optype(trace, pa.array(names)), tmp_path / "t.parquet")
    with pytest.raises(UserError, match="optype is empty in 1 row"):
        read_trace(tmp_path / "t.parquet")
