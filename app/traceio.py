"""Reading and writing traces and job metadata (the I/O the engine itself never does)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from rankwatch.errors import UserError
from rankwatch.sim.trace import TRACE_COLUMNS, JobMeta, Trace, TraceError, optype_codes

if TYPE_CHECKING:
    from pyarrow import ChunkedArray


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

        # One column at a time, each made a numpy array before the next is read: the
        # peak is the trace plus one column, not the trace twice; integer columns are
        # narrowed to int32 and the op types read as arrow dictionary codes, never as
        # strings (benchmarks/README.md, "Offline analysis of a 1,024-worker job").
        names = pq.read_schema(path).names
        source = pq.ParquetFile(path, read_dictionary=[n for n in ("optype",) if n in names])
        columns = {}
        for field in source.schema_arrow:
            if field.name not in TRACE_COLUMNS:
                continue
            col = source.read(columns=[field.name], use_threads=False).column(0)
            if field.name == "optype":
                columns[field.name] = _optype_column(col)
            else:
                columns[field.name] = _numbers(col, field.name)
            del col
        # arrow's allocator keeps freed decode buffers for reuse; nothing here reads
        # parquet again, so give them back
        pa.default_memory_pool().release_unused()
        return Trace.from_columns(columns)
    except (OSError, TraceError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from exc
    except Exception as exc:  # pyarrow raises its own hierarchy for corrupt files
        raise UserError(f"cannot read trace {path}: {type(exc).__name__}: {exc}") from exc


def _optype_column(col: ChunkedArray) -> np.ndarray:
    """Op-type codes from arrow's dictionary encoding: no Python string per row."""
    import pyarrow as pa

    if pa.types.is_integer(col.type):
        return _numbers(col, "optype", narrow=False)
    if col.null_count:
        raise TraceError(f"optype is empty in {col.null_count} row(s)")
    parts = []
    for chunk in col.chunks:  # each row group may bring its own dictionary
        encoded = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
        names = [str(n) for n in encoded.dictionary.to_pylist()]
        parts.append(optype_codes(names, _view(encoded.indices, "optype")))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


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


def _numbers(col: ChunkedArray, name: str, narrow: bool = True) -> np.ndarray:
    """A numeric column as one numpy array; integers made int32 where they fit (unless
    not ``narrow``), the type of a trace's integer columns that takes least memory.

    Read from arrow's buffers directly: ``to_numpy`` imports pandas (about 45 MiB and
    a quarter of a second) for what is a view of the same memory.
    """
    views = [_view(chunk, name) for chunk in col.chunks]
    dtype = views[0].dtype if views else np.dtype(np.float64)
    if (
        narrow
        and dtype.kind in "iu"
        and all(v.size == 0 or (v.min() >= _INT32.min and v.max() <= _INT32.max) for v in views)
    ):
        dtype = np.dtype(np.int32)
    if len(views) == 1 and views[0].dtype == dtype:
        return views[0]
    out = np.empty(sum(v.size for v in views), dtype=dtype)
    offset = 0
    for v in views:
        out[offset : offset + v.size] = v
        offset += v.size
    return out


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
