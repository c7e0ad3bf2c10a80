"""Reading and writing traces and job metadata (the I/O the engine itself never does)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
        import pyarrow.parquet as pq

        # One column at a time, each made a numpy array before the next is read: the
        # peak is the trace plus one column, not the trace twice (benchmarks/README.md,
        # "Offline analysis of a 1,024-worker job").
        source = pq.ParquetFile(path)
        columns = {}
        for field in source.schema_arrow:
            if field.name == "optype":
                col = source.read(columns=[field.name]).column(0)
                columns[field.name] = _optype_column(col)
            elif field.name in TRACE_COLUMNS:
                col = source.read(columns=[field.name]).column(0)
                columns[field.name] = col.to_numpy()
        return Trace.from_columns(columns)
    except (OSError, TraceError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from exc
    except Exception as exc:  # pyarrow raises its own hierarchy for corrupt files
        raise UserError(f"cannot read trace {path}: {type(exc).__name__}: {exc}") from exc


def _optype_column(col: ChunkedArray) -> np.ndarray:
    """Op-type codes from arrow's dictionary encoding: no Python string per row."""
    import pyarrow as pa

    if pa.types.is_integer(col.type):
        return col.to_numpy()
    if col.null_count:
        raise TraceError(f"optype is empty in {col.null_count} row(s)")
    arr = col.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = [str(n) for n in arr.dictionary.to_pylist()]
    return optype_codes(names, arr.indices.to_numpy())


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
