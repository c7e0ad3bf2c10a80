"""Reading and writing traces and job metadata (the I/O the engine itself never does)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rankwatch.errors import UserError
from rankwatch.sim.trace import JobMeta, Trace, TraceError


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

        table = pq.read_table(path)
        columns = {}
        for name in table.column_names:
            col = table.column(name)
            if str(col.type).startswith("dictionary"):
                col = col.cast("string")
            columns[name] = col.to_numpy(zero_copy_only=False)
        return Trace.from_columns(columns)
    except (OSError, TraceError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from exc
    except Exception as exc:  # pyarrow raises its own hierarchy for corrupt files
        raise UserError(f"cannot read trace {path}: {type(exc).__name__}: {exc}") from exc


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
