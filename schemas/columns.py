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
    """The ops schema without per-item rules: what jsonschema checks before numpy does."""
    stripped = copy.deepcopy(dict(ops_schema))
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
