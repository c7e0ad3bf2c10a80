"""Item rules of the ``ops`` batch columns, read from the schema and checked vectorised.

Validating 2,000 op records item by item with jsonschema costs milliseconds; the same
rules checked with numpy over whole columns cost microseconds. The rules are not
restated here: :func:`column_specs` reads them from ``ops.v1.schema.json`` (item type,
bounds, enum, string length) and refuses item keywords it does not know, so a rule
added to the schema can never be silently skipped.
"""

from __future__ import annotations

import array
import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from rankwatch.schemas.errors import InvalidMessage

GROUPS: tuple[str, ...] = ("ops", "extra")
"""Objects of the ops message that hold columns: required ones, then optional ones."""

_ITEM_KEYWORDS = frozenset({"type", "minimum", "maximum", "enum", "maxLength", "description"})
_KNOWN_TYPES = frozenset({"integer", "number", "string"})


@dataclass(frozen=True)
class ColumnSpec:
    """What one column's items must be, as the schema says."""

    name: str
    group: str  # "ops" (required) or "extra" (optional)
    type: str  # "integer" | "number" | "string"
    minimum: int | float | None = None
    maximum: int | float | None = None
    enum: tuple[str, ...] | None = None
    max_length: int | None = None

    @property
    def path(self) -> str:
        return f"$.{self.group}.{self.name}"

    @property
    def dtype(self) -> np.dtype[Any]:
        """Enum columns hold int8 codes into ``enum``; free strings are object arrays."""
        if self.enum is not None:
            return np.dtype(np.int8)
        return np.dtype({"integer": np.int64, "number": np.float64, "string": object}[self.type])


def column_specs(ops_schema: Mapping[str, Any]) -> tuple[ColumnSpec, ...]:
    """Every column of the ops schema, in schema order, required group first."""
    specs = []
    for group in GROUPS:
        for name, prop in ops_schema["properties"][group]["properties"].items():
            specs.append(_spec(group, name, prop["items"]))
    return tuple(specs)


def max_items(ops_schema: Mapping[str, Any]) -> int:
    """The most records a batch may hold (the smallest ``maxItems`` of any column)."""
    return min(
        int(prop["maxItems"])
        for group in GROUPS
        for prop in ops_schema["properties"][group]["properties"].values()
    )


def envelope_schema(ops_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The ops schema without per-item rules (and without the ``x-`` annotations of a
    binary layout): what jsonschema checks before numpy does."""
    stripped = {k: copy.deepcopy(v) for k, v in ops_schema.items() if not k.startswith("x-")}
    for group in GROUPS:
        for prop in stripped["properties"][group]["properties"].values():
            prop.pop("items")
    return stripped


def _spec(group: str, name: str, items: Mapping[str, Any]) -> ColumnSpec:
    unknown = set(items) - _ITEM_KEYWORDS
    if unknown or items.get("type") not in _KNOWN_TYPES:
        raise RuntimeError(f"ops schema column {group}.{name}: cannot check items {dict(items)}")
    enum = items.get("enum")
    if enum is not None and len(enum) > np.iinfo(np.int8).max:
        raise RuntimeError(f"ops schema column {group}.{name}: enum too long for int8 codes")
    return ColumnSpec(
        name=name,
        group=group,
        type=items["type"],
        minimum=items.get("minimum"),
        maximum=items.get("maximum"),
        enum=tuple(enum) if enum is not None else None,
        max_length=items.get("maxLength"),
    )


# -- from JSON lists (decode) ------------------------------------------------------------


def read_column(spec: ColumnSpec, values: list[Any], *, bools_possible: bool = True) -> np.ndarray:
    """A decoded JSON list as a checked numpy column, or :class:`InvalidMessage`.

    ``bools_possible=False`` is the caller's promise that the document held no ``true``
    or ``false`` literal; numbers then skip the per-item type scan (see
    :func:`_read_numbers_fast`).
    """
    if spec.enum is not None:
        return _read_enum(spec, values)
    if spec.type != "string" and not bools_possible:
        fast = _read_numbers_fast(spec, values)
        if fast is not None:
            return check_column(spec, fast)
    types = set(map(type, values))
    if spec.type == "string":
        if types != {str}:
            _wrong_type(spec, values, (str,))
        return _read_strings(spec, values)
    if types == {int}:
        try:
            column = np.fromiter(values, dtype=spec.dtype, count=len(values))
        except OverflowError:
            raise InvalidMessage("bad-value", f"{spec.path}: integer beyond 64 bits") from None
    elif types <= {int, float}:
        column = np.fromiter(values, dtype=np.float64, count=len(values))
        if spec.type == "integer":
            column = _integral(spec, column)
    else:
        _wrong_type(spec, values, (int, float) if spec.type == "number" else (int,))
    return check_column(spec, column)


@dataclass(frozen=True, eq=False)
class IntegerBlock:
    """Equal-length plain integer columns read and bound-checked in one go.

    For a document with no ``true``/``false`` literal (as :func:`read_column` with
    ``bools_possible=False``). One C conversion and one comparison over all columns
    instead of a dozen numpy calls per column: per-call overhead, not arithmetic, is
    what small batches pay for.
    """

    specs: tuple[ColumnSpec, ...]
    lower: np.ndarray  # (column, 1) int64
    upper: np.ndarray  # (column, 1) int64

    @classmethod
    def of(cls, specs: tuple[ColumnSpec, ...]) -> IntegerBlock:
        info = np.iinfo(np.int64)
        for spec in specs:
            if spec.type != "integer" or spec.enum is not None:
                raise ValueError(f"{spec.path}: not a plain integer column")
            for bound in (spec.minimum, spec.maximum):
                if bound is not None and type(bound) is not int:
                    raise ValueError(f"{spec.path}: bound {bound!r} is not an integer")
        lower = [info.min if s.minimum is None else max(s.minimum, info.min) for s in specs]
        upper = [info.max if s.maximum is None else min(s.maximum, info.max) for s in specs]
        return cls(
            specs=specs,
            lower=np.array(lower, dtype=np.int64).reshape(-1, 1),
            upper=np.array(upper, dtype=np.int64).reshape(-1, 1),
        )

    def read(self, values: Sequence[list[Any]]) -> np.ndarray | None:
        """A (column, record) int64 array whose rows are the columns ``values`` (in
        ``specs`` order), or None when any item is not an in-range integer. The caller
        then reads column by column, which names the fault; this only says yes quickly."""
        try:
            converted = array.array("q", list(itertools.chain.from_iterable(values)))
        except (TypeError, OverflowError):
            return None
        block = np.frombuffer(converted, dtype=np.int64).reshape(len(values), -1)
        if bool((block < self.lower).any()) or bool((block > self.upper).any()):
            return None
        return block


def _read_numbers_fast(spec: ColumnSpec, values: list[Any]) -> np.ndarray | None:
    """``array.array`` converts in C and refuses, for integers, floats, strings, None and
    lists (for numbers: all but ints and floats); only bools slip through, which the
    caller has ruled out. None when it refuses: the exact path then names the fault."""
    try:
        converted = array.array("q" if spec.type == "integer" else "d", values)
    except (TypeError, OverflowError):
        return None
    return np.frombuffer(converted, dtype=spec.dtype)


def _read_enum(spec: ColumnSpec, values: list[Any]) -> np.ndarray:
    """Names to int8 codes; a non-string is simply not a known name (no type scan)."""
    assert spec.enum is not None
    code = _codes(spec.enum)
    try:
        return np.fromiter(map(code.__getitem__, values), dtype=np.int8, count=len(values))
    except (KeyError, TypeError):
        at = next(i for i, v in enumerate(values) if type(v) is not str or v not in code)
    if type(values[at]) is not str:
        _wrong_type(spec, values, (str,))
    raise InvalidMessage(
        "bad-value", f"{spec.path}[{at}]: {values[at][:80]!r} is not a known {spec.name}"
    )


@cache
def _codes(names: tuple[str, ...]) -> dict[str, int]:
    return {name: i for i, name in enumerate(names)}


def _read_strings(spec: ColumnSpec, values: list[str]) -> np.ndarray:
    if spec.max_length is not None and max(map(len, values)) > spec.max_length:
        at = next(i for i, v in enumerate(values) if len(v) > spec.max_length)
        raise InvalidMessage(
            "bad-value", f"{spec.path}[{at}]: longer than {spec.max_length} characters"
        )
    return np.array(values, dtype=object)


def _integral(spec: ColumnSpec, column: np.ndarray) -> np.ndarray:
    """JSON Schema counts 3.0 as an integer; 3.5 is not. orjson reads huge ints as floats."""
    fractional = ~np.isfinite(column) | (column != np.floor(column))
    if fractional.any():
        at = int(np.flatnonzero(fractional)[0])
        raise InvalidMessage(
            "schema", f"{spec.path}[{at}]: {column[at].item()!r} is not an integer"
        )
    beyond = np.abs(column) >= 2.0**63
    if beyond.any():
        at = int(np.flatnonzero(beyond)[0])
        raise InvalidMessage("bad-value", f"{spec.path}[{at}]: {column[at].item()!r} beyond int64")
    return column.astype(np.int64)


def _wrong_type(spec: ColumnSpec, values: Sequence[Any], allowed: tuple[type, ...]) -> None:
    at = next(i for i, v in enumerate(values) if type(v) not in allowed)
    raise InvalidMessage(
        "schema", f"{spec.path}[{at}]: {type(values[at]).__name__} where {spec.type} expected"
    )


# -- numpy columns (both directions) -----------------------------------------------------


def check_column(spec: ColumnSpec, column: np.ndarray) -> np.ndarray:
    """Check a numpy column against ``spec``; returns it in the spec's dtype."""
    if column.ndim != 1:
        raise InvalidMessage("schema", f"{spec.path}: a column must be one-dimensional")
    if spec.enum is not None:
        return _check_codes(spec, column)
    if spec.type == "string":
        return _check_strings(spec, column)
    if column.dtype.kind not in ("iu" if spec.type == "integer" else "iuf"):
        raise InvalidMessage("schema", f"{spec.path}: dtype {column.dtype} where {spec.type}")
    column = column.astype(spec.dtype, copy=False)
    bad = np.zeros(column.shape, dtype=bool)
    if column.dtype.kind == "f":
        bad |= ~np.isfinite(column)
    if spec.minimum is not None:
        bad |= column < spec.minimum
    if spec.maximum is not None:
        bad |= column > spec.maximum
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        value = column[at].item()
        raise InvalidMessage(
            "bad-value",
            f"{spec.path}[{at}]: {value!r} is not finite"
            if not math.isfinite(value)
            else f"{spec.path}[{at}]: {value!r} is outside [{spec.minimum}, {spec.maximum}]",
        )
    return column


def _check_codes(spec: ColumnSpec, column: np.ndarray) -> np.ndarray:
    assert spec.enum is not None
    if column.dtype.kind not in "iu":
        raise InvalidMessage("schema", f"{spec.path}: dtype {column.dtype} where int8 codes")
    bad = (column < 0) | (column >= len(spec.enum))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise InvalidMessage("bad-value", f"{spec.path}[{at}]: not one of the {spec.name} names")
    return column.astype(np.int8, copy=False)


def _check_strings(spec: ColumnSpec, column: np.ndarray) -> np.ndarray:
    values = column.tolist()
    if not all(type(v) is str for v in values):
        _wrong_type(spec, values, (str,))
    return _read_strings(spec, values)


# -- binary blocks (ops v3 frames) -------------------------------------------------------


def check_run(
    specs: Sequence[ColumnSpec], run: np.ndarray, strings: Mapping[str, list[str]]
) -> list[np.ndarray]:
    """Columns read from a frame as one (column, record) array of their wire dtype (see
    ``rankwatch.schemas.frame``), all of ``specs`` sharing one dtype and one set of item
    rules, checked against those rules; returns the columns. Only the bounds the dtype
    does not already hold cost a pass. Enum codes come back as int8, string codes as the
    strings (``strings[name]``: the list the frame's header gives for the column), the
    rest as views of the frame."""
    spec = specs[0]
    if spec.enum is not None:
        return [_check_block_codes(s, row) for s, row in zip(specs, run, strict=True)]
    if spec.type == "string":
        return [
            _check_block_strings(s, row, strings.get(s.name))
            for s, row in zip(specs, run, strict=True)
        ]
    if spec.type == "number":
        return [check_column(s, row) for s, row in zip(specs, run, strict=True)]
    low, high = _unheld_bounds(spec, run.dtype)
    if low is not None and run.min() < low:
        _out_of_bounds(specs, run, run < low)
    if high is not None and run.max() > high:
        _out_of_bounds(specs, run, run > high)
    return list(run)


@cache
def _unheld_bounds(spec: ColumnSpec, dtype: np.dtype[Any]) -> tuple[int | None, int | None]:
    """The bounds of ``spec`` that values of ``dtype`` can break (None: cannot)."""
    info = np.iinfo(dtype)
    low = spec.minimum if spec.minimum is not None and spec.minimum > info.min else None
    high = spec.maximum if spec.maximum is not None and spec.maximum < info.max else None
    return (None if low is None else int(low)), (None if high is None else int(high))


def _check_block_codes(spec: ColumnSpec, block: np.ndarray) -> np.ndarray:
    assert spec.enum is not None
    if block.dtype.itemsize != 1:
        raise RuntimeError(f"{spec.path}: enum codes travel as one byte, not {block.dtype}")
    # as unsigned bytes a negative code is >= 128: one pass for both bounds
    if int(block.view(np.uint8).max()) >= len(spec.enum):
        at = int(np.flatnonzero(block.view(np.uint8) >= len(spec.enum))[0])
        raise InvalidMessage("bad-value", f"{spec.path}[{at}]: not one of the {spec.name} names")
    return block.view(np.int8)


def _check_block_strings(
    spec: ColumnSpec, block: np.ndarray, strings: list[str] | None
) -> np.ndarray:
    if strings is None:
        raise InvalidMessage("schema", f"$.strings.{spec.name}: required for the column's codes")
    if block.size and int(block.max()) >= len(strings):
        at = int(np.flatnonzero(block >= len(strings))[0])
        raise InvalidMessage(
            "bad-value", f"{spec.path}[{at}]: code {int(block[at])} beyond $.strings.{spec.name}"
        )
    return np.asarray(strings, dtype=object)[block]


def _out_of_bounds(specs: Sequence[ColumnSpec], run: np.ndarray, bad: np.ndarray) -> None:
    column, at = (int(i[0]) for i in np.nonzero(bad))
    spec = specs[column]
    raise InvalidMessage(
        "bad-value",
        f"{spec.path}[{at}]: {run[column, at].item()!r} is outside"
        f" [{spec.minimum}, {spec.maximum}]",
    )
