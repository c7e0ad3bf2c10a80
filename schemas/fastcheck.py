"""A yes/no check of a small JSON Schema subset, compiled to closures, for hot paths.

jsonschema spends ~200 µs on the envelope of an op batch; this spends a tenth of that.
It only answers *whether* an instance is valid; when it is not, the caller asks
jsonschema for the error (path and message), so both always agree on the verdict for
what this supports. Keywords outside the subset make :func:`compile_check` raise, so a
schema change can never be silently ignored here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description"})
_SUPPORTED = _ANNOTATIONS | {
    "type",
    "const",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "items",
    "required",
    "properties",
    "additionalProperties",
    "prefixItems",
}


def _is_integer(v: Any) -> bool:
    return (type(v) is int) or (type(v) is float and v.is_integer())


_TYPES: dict[str, Check] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "integer": _is_integer,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def compile_check(schema: Mapping[str, Any]) -> Check:
    """A predicate equivalent to draft 2020-12 validation of ``schema`` (subset only)."""
    unknown = set(schema) - _SUPPORTED
    if unknown:
        raise ValueError(f"fastcheck does not support {sorted(unknown)}")
    if schema.get("additionalProperties", False) is not False:
        raise ValueError("fastcheck supports additionalProperties: false only")
    checks = [_type_check(schema["type"])] if "type" in schema else []
    checks += [c for key, c in _value_checks(schema) if key in schema]
    if "properties" in schema:
        checks.append(_object_check(schema))
    if "items" in schema or "prefixItems" in schema:
        checks.append(_array_check(schema))
    return lambda v: all(check(v) for check in checks)


def _type_check(type_: str | list[str]) -> Check:
    names = [type_] if isinstance(type_, str) else list(type_)
    tests = [_TYPES[name] for name in names]
    return lambda v: any(test(v) for test in tests)


def _value_checks(s: Mapping[str, Any]) -> list[tuple[str, Check]]:
    """Each keyword applies only to instances of its type, as JSON Schema says."""

    def num(v: Any) -> bool:
        return type(v) in (int, float)

    return [
        ("const", lambda v: _json_equal(v, s["const"])),
        ("enum", lambda v: any(_json_equal(v, e) for e in s["enum"])),
        ("minimum", lambda v: not num(v) or v >= s["minimum"]),
        ("maximum", lambda v: not num(v) or v <= s["maximum"]),
        ("minLength", lambda v: type(v) is not str or len(v) >= s["minLength"]),
        ("maxLength", lambda v: type(v) is not str or len(v) <= s["maxLength"]),
        ("minItems", lambda v: type(v) is not list or len(v) >= s["minItems"]),
        ("maxItems", lambda v: type(v) is not list or len(v) <= s["maxItems"]),
        ("required", lambda v: type(v) is not dict or all(k in v for k in s["required"])),
    ]


def _object_check(schema: Mapping[str, Any]) -> Check:
    props = {name: compile_check(sub) for name, sub in schema["properties"].items()}
    closed = "additionalProperties" in schema

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True
        if closed and not props.keys() >= v.keys():
            return False
        return all(props[k](item) for k, item in v.items() if k in props)

    return check


def _array_check(schema: Mapping[str, Any]) -> Check:
    """``prefixItems`` check items by position, ``items`` every item after those."""
    prefix = [compile_check(sub) for sub in schema.get("prefixItems", ())]
    rest = compile_check(schema["items"]) if "items" in schema else None

    def check(v: Any) -> bool:
        if type(v) is not list:
            return True
        if not all(c(item) for c, item in zip(prefix, v, strict=False)):
            return False
        return rest is None or all(rest(item) for item in v[len(prefix) :])

    return check


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1 (Python says it is)."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return bool(a == b)
