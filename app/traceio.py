"""Reading and writing traces and job metadata (the I/O the engine itself never does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rankwatch.errors import UserError
from rankwatch.sim.trace import TRACE_COLUMNS, JobMeta, Trace, TraceError, optype_codes


def require_file(path: str | Path) -> Path:
    """``path`` as a Path; a missing one is a UserError that says so in those words."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such file: {path}")
    if path.is_dir():
        raise UserError(f"{path} is a directory, not a file")
    return path


def read_trace(path: str | Path) -> Trace:
    """Read a ``trace-*.parquet`` file; any failure becomes a one-line UserError."""
    path = require_file(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # One column and one row group at a time, copied into numpy arrays made once:
        # arrow holds one row group of one column at a time, not a column or the trace.
        # Integer columns but step become int32 where the values fit, op types are read as
        # parquet dictionary codes, never as strings (benchmarks/README.md, "Offline
        # analysis of a 1,024-worker job").
        names = pq.read_schema(path).names
        source = pq.ParquetFile(path, read_dictionary=[n for n in ("optype",) if n in names])
        columns = {}
        for name in names:
            if name in TRACE_COLUMNS:
                columns[name] = _read_column(source, name)
                # arrow's allocator keeps freed decode buffers for reuse: give them back
                # before the next column (20 MiB less at the peak for 1.56M ops)
                pa.default_memory_pool().release_unused()
        return Trace.from_columns(columns)
    except (OSError, TraceError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from exc
    except Exception as exc:  # pyarrow raises its own hierarchy for corrupt files
        raise UserError(f"cannot read trace {path}: {type(exc).__name__}: {exc}") from exc


_NUMPY_TYPES = {
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float": np.float32,
    "double": np.float64,
}
_INT32 = np.iinfo(np.int32)


def _read_column(source: Any, name: str) -> np.ndarray:
    """One column of the file as a numpy array, filled a row group at a time.

    Numbers are read from arrow's buffers directly (``to_numpy`` imports pandas: about
    45 MiB and a quarter of a second, for a view of the same memory). Integers become
    int32 while they fit (int64 from the first row group that does not; ``step``
    always int64), floats float64; op-type names become codes. An empty value is an
    error naming the column.
    """
    out: np.ndarray | None = None
    filled = 0
    for group in range(source.metadata.num_row_groups):
        col = source.read_row_group(group, columns=[name], use_threads=False).column(0)
        for chunk in col.chunks:
            values = _optype_codes(chunk) if name == "optype" else _view(chunk, name)
            if out is None:
                out = np.empty(source.metadata.num_rows, dtype=_target(name, values.dtype))
            if out.dtype == np.int32 and values.size and not _fits_int32(values):
                out = out.astype(np.int64)
            out[filled : filled + values.size] = values
            filled += values.size
    if out is None:  # no rows
        return np.zeros(0, dtype=np.int8 if name == "optype" else np.float64)
    return out[:filled]


_WIDE = frozenset({"step"})
"""Integer columns kept int64: callers compute with step numbers (``streams/ops/replay.py``
makes ``step * 2**24 + rank`` keys, which int32 would overflow from step 128 on)."""


def _target(name: str, dtype: np.dtype) -> type:
    if name == "optype":  # codes: as they are (int8 from names; Trace checks raw codes)
        return dtype.type
    if dtype.kind == "f":
        return np.float64
    return np.int64 if name in _WIDE else np.int32


def _fits_int32(values: np.ndarray) -> bool:
    return bool(values.min() >= _INT32.min and values.max() <= _INT32.max)


def _optype_codes(chunk: Any) -> np.ndarray:
    """Op-type codes of one arrow array: names through its dictionary (no Python string
    per row), integer codes as they are."""
    import pyarrow as pa

    if pa.types.is_integer(chunk.type):
        return _view(chunk, "optype")
    if chunk.null_count:
        raise TraceError(f"optype is empty in {chunk.null_count} row(s)")
    encoded = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
    names = [str(n) for n in encoded.dictionary.to_pylist()]
    return optype_codes(names, _view(encoded.indices, "optype"))


def _view(chunk: Any, name: str) -> np.ndarray:
    """One arrow array of numbers, without nulls, as a numpy view of its buffer."""
    dtype = _NUMPY_TYPES.get(str(chunk.type))
    if dtype is None:
        raise TraceError(f"{name} is of type {chunk.type}, not numbers")
    if chunk.null_count:
        raise TraceError(f"{chunk.null_count} empty value(s) in {name}")
    width = np.dtype(dtype).itemsize
    data = chunk.buffers()[1]
    if data is None:  # an empty array may have no buffer
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * width)


def write_trace(trace: Trace, path: str | Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(trace.columns()), path)


def read_meta(path: str | Path) -> JobMeta:
    path = require_file(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read job metadata {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"job metadata {path} is not YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise UserError(f"job metadata {path} is not a mapping")
    try:
        return JobMeta.from_mapping(raw)
    except TraceError as exc:
        raise UserError(f"{path}: {exc}") from exc
