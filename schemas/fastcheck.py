"""A yes/no check of a small JSON Schema subset, compiled to one Python function.

jsonschema spends ~200 µs on the envelope of an op batch. The first version of this
module composed closures (one call per keyword and property: ~40 µs); this one writes
the whole schema out as the source of a single function of straight-line tests and
compiles it once, so checking an envelope costs a few µs. It only answers *whether* an
instance is valid; when it is not, the caller asks jsonschema for the error (path and
message), so both always agree on the verdict for what this supports. Keywords outside
the subset make :func:`compile_check` raise, so a schema change can never be silently
ignored here.
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

_TYPE_TESTS = {
    "object": "type({v}) is dict",
    "array": "type({v}) is list",
    "string": "type({v}) is str",
    "integer": "(type({v}) is int or (type({v}) is float and {v}.is_integer()))",
    "number": "(type({v}) is int or type({v}) is float)",
    "boolean": "type({v}) is bool",
    "null": "{v} is None",
}


def compile_check(schema: Mapping[str, Any]) -> Check:
    """A predicate equivalent to draft 2020-12 validation of ``schema`` (subset only)."""
    writer = _Writer()
    writer.node(schema, "v", 1)
    source = "\n".join(["def check(v):", *writer.lines, "    return True", ""])
    namespace: dict[str, Any] = {"_json_equal": _json_equal, **writer.constants}
    exec(compile(source, "<fastcheck>", "exec"), namespace)  # source written above, from the schema
    check: Check = namespace["check"]
    check.source = source  # type: ignore[attr-defined]  # for reading and debugging
    return check


class _Writer:
    """Emits ``if <instance fails>: return False`` lines for each schema node."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self._names = 0

    def _new(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def _constant(self, value: Any) -> str:
        name = self._new("C")
        self.constants[name] = value
        return name

    def _fail_if(self, condition: str, depth: int) -> None:
        self.lines.append(f"{'    ' * depth}if {condition}: return False")

    def node(self, schema: Mapping[str, Any], v: str, depth: int) -> None:
        unknown = set(schema) - _SUPPORTED
        if unknown:
            raise ValueError(f"fastcheck does not support {sorted(unknown)}")
        if schema.get("additionalProperties", False) is not False:
            raise ValueError("fastcheck supports additionalProperties: false only")
        if "type" in schema:
            names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
            tests = " or ".join(_TYPE_TESTS[name].format(v=v) for name in names)
            self._fail_if(f"not ({tests})", depth)
        self._values(schema, v, depth)
        if {"properties", "required", "additionalProperties"} & set(schema):
            self._object(schema, v, depth)
        if "items" in schema or "prefixItems" in schema:
            self._array(schema, v, depth)

    def _values(self, s: Mapping[str, Any], v: str, depth: int) -> None:
        """Each keyword applies only to instances of its type, as JSON Schema says."""
        num = f"(type({v}) is int or type({v}) is float)"
        if "const" in s:
            self._fail_if(f"not _json_equal({v}, {self._constant(s['const'])})", depth)
        if "enum" in s:
            options = self._constant(tuple(s["enum"]))
            self._fail_if(f"not any(_json_equal({v}, e) for e in {options})", depth)
        if "minimum" in s:
            self._fail_if(f"{num} and not {v} >= {self._constant(s['minimum'])}", depth)
        if "maximum" in s:
            self._fail_if(f"{num} and not {v} <= {self._constant(s['maximum'])}", depth)
        for keyword, kind, op in (
            ("minLength", "str", ">="),
            ("maxLength", "str", "<="),
            ("minItems", "list", ">="),
            ("maxItems", "list", "<="),
        ):
            if keyword in s:
                bound = self._constant(s[keyword])
                self._fail_if(f"type({v}) is {kind} and not len({v}) {op} {bound}", depth)

    def _object(self, schema: Mapping[str, Any], v: str, depth: int) -> None:
        pad = "    " * depth
        self.lines.append(f"{pad}if type({v}) is dict:")
        self.lines.append(f"{pad}    pass")
        if "additionalProperties" in schema:
            allowed = self._constant(frozenset(schema.get("properties", {})))
            self._fail_if(f"not {v}.keys() <= {allowed}", depth + 1)
        for key in schema.get("required", ()):
            self._fail_if(f"{key!r} not in {v}", depth + 1)
        for key, sub in schema.get("properties", {}).items():
            item = self._new("x")
            self.lines.append(f"{pad}    {item} = {v}.get({key!r}, _MISSING)")
            self.lines.append(f"{pad}    if {item} is not _MISSING:")
            self.lines.append(f"{pad}        pass")
            self.node(sub, item, depth + 2)
            self.constants["_MISSING"] = _MISSING

    def _array(self, schema: Mapping[str, Any], v: str, depth: int) -> None:
        pad = "    " * depth
        self.lines.append(f"{pad}if type({v}) is list:")
        self.lines.append(f"{pad}    pass")
        prefix = schema.get("prefixItems", ())
        for i, sub in enumerate(prefix):
            item = self._new("x")
            self.lines.append(f"{pad}    if len({v}) > {i}:")
            self.lines.append(f"{pad}        {item} = {v}[{i}]")
            self.node(sub, item, depth + 2)
        if "items" in schema:
            item = self._new("x")
            rest = f"{v}[{len(prefix)}:]" if prefix else v
            self.lines.append(f"{pad}    for {item} in {rest}:")
            self.lines.append(f"{pad}        pass")
            self.node(schema["items"], item, depth + 2)


_MISSING = object()


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1 (Python says it is)."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return bool(a == b)
