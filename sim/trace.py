"""An op trace as numpy columns: the one input type of the what-if engine.

One row per timed op of one worker (a worker is a (dp_rank, stage) pair). Times are
seconds from the step's start (the earliest op start of that step), clocks aligned.
The same layout as ``trace-*.parquet`` of the shipped straggler traces; reading
files is the shell's job (``rankwatch.traceio``), this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from rankwatch.schemas.optypes import CODE, OPTYPES


class TraceError(ValueError):
    """A trace that cannot be read as op records (missing column, unknown op type...)."""


_INT_COLUMNS = ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "gmc", "mb_id")
_FLOAT_COLUMNS = ("start_ts", "duration")
TRACE_COLUMNS: frozenset[str] = frozenset((*_INT_COLUMNS, *_FLOAT_COLUMNS, "optype"))
"""The columns a trace is made of (a file's other columns are not read)."""


@dataclass(frozen=True)
class Trace:
    """Columns of equal length. ``optype`` holds codes into ``OPTYPES``.

    Integer columns are int64 or int32 (:func:`rankwatch.traceio.read_trace` narrows
    those but ``step`` to int32 where the values fit: 28 bytes per op less). Code
    that multiplies them must widen first (numpy keeps int32 and wraps around).
    """

    dp_rank: np.ndarray  # int64 or int32
    stage: np.ndarray  # int64 or int32
    rank: np.ndarray  # int64 or int32
    step: np.ndarray  # int64 (or int32 when built so)
    optype: np.ndarray  # int8 codes into OPTYPES
    seq_id: np.ndarray  # int64 or int32
    mc: np.ndarray  # int64 or int32, -1 where not a compute op
    gmc: np.ndarray  # int64 or int32, -1 where not a compute op
    mb_id: np.ndarray  # int64 or int32, -1 where not a compute op
    start_ts: np.ndarray  # float64 seconds from step start
    duration: np.ndarray  # float64 seconds

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @property
    def optype_names(self) -> np.ndarray:
        """Op types as strings (for display and export)."""
        return np.asarray(OPTYPES, dtype=object)[self.optype]

    def select(self, mask: np.ndarray) -> Trace:
        """Rows where ``mask`` holds (a boolean array or an index array)."""
        return Trace(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def columns(self) -> dict[str, np.ndarray]:
        """Columns with op types as strings, ready for a DataFrame or parquet."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["optype"] = self.optype_names
        return out

    @classmethod
    def from_columns(cls, columns: Mapping[str, object]) -> Trace:
        """Build from any mapping of array-likes; op types may be names or codes.

        Integer columns stay int32 when given as int32, else become int64.
        Raises :class:`TraceError` naming the missing column or unknown op types.
        """
        missing = [c for c in (*_INT_COLUMNS, *_FLOAT_COLUMNS, "optype") if c not in columns]
        if missing:
            raise TraceError(f"trace lacks column(s): {', '.join(missing)}")
        data: dict[str, np.ndarray] = {}
        for name in _INT_COLUMNS:
            raw = np.asarray(columns[name])
            data[name] = raw if raw.dtype == np.int32 else raw.astype(np.int64, copy=False)
        for name in _FLOAT_COLUMNS:
            data[name] = np.asarray(columns[name]).astype(np.float64, copy=False)
        data["optype"] = _optype_codes(np.asarray(columns["optype"]))
        lengths = {name: arr.shape[0] for name, arr in data.items()}
        if len(set(lengths.values())) != 1:
            raise TraceError(f"columns differ in length: {lengths}")
        return cls(**data)


def _optype_codes(raw: np.ndarray) -> np.ndarray:
    if raw.dtype.kind in "iu":
        bad = (raw < 0) | (raw >= len(OPTYPES))
        if bad.any():
            raise TraceError(f"unknown op type code(s): {sorted(set(raw[bad].tolist()))}")
        return raw.astype(np.int8)
    names, inverse = np.unique(raw.astype(str), return_inverse=True)
    return optype_codes(names.tolist(), inverse)


def optype_codes(names: Sequence[str], indices: np.ndarray) -> np.ndarray:
    """Op-type codes of a dictionary-encoded column (``names[indices]``), built without
    a Python string per row: for 1.5M ops, the difference between 1 GiB and 0.2 GiB
    when reading a trace. Names the column does not use are not checked."""
    used = np.unique(indices) if len(names) else indices
    unknown = sorted({names[i] for i in used.tolist() if names[i] not in CODE})
    if unknown:
        raise TraceError(f"unknown op type(s): {', '.join(unknown)}")
    lut = np.array([CODE.get(n, -1) for n in names], dtype=np.int8)
    return lut[indices]


@dataclass(frozen=True)
class JobMeta:
    """Parallel sizes of a job (``meta-*.yaml`` of the shipped traces)."""

    dp_size: int
    pp_size: int
    tp_size: int = 1
    dsp_size: int = 1
    vpp_size: int = 1
    world_size: int = 0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> JobMeta:
        """Keep the known keys; reject missing or non-positive sizes with a clear reason."""
        values: dict[str, int] = {}
        for f in fields(cls):
            if f.name not in raw:
                if f.name in ("dp_size", "pp_size"):
                    raise TraceError(f"job metadata lacks {f.name}")
                continue
            value = raw[f.name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TraceError(f"job metadata {f.name} must be a non-negative integer")
            values[f.name] = value
        meta = cls(**values)
        small = [
            f.name for f in fields(cls) if f.name != "world_size" and getattr(meta, f.name) < 1
        ]
        if small:
            raise TraceError(f"job metadata {', '.join(small)} must be at least 1")
        if meta.world_size and meta.world_size != meta.gpus:
            raise TraceError(
                f"job metadata is inconsistent: world_size {meta.world_size} is not dp_size x "
                f"dsp_size x pp_size x tp_size = {meta.dp_size} x {meta.dsp_size} x "
                f"{meta.pp_size} x {meta.tp_size} = {meta.gpus}"
            )
        return meta

    @property
    def gpus(self) -> int:
        """Ranks the sizes imply (``world_size`` must equal it when given)."""
        return self.dp_size * self.dsp_size * self.pp_size * self.tp_size
