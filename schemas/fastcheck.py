"""A yes/no check of a small JSON Schema subset, compiled to one Python function.

jsonschema spends ~200 µs on the envelope of an op batch. The first version of this
module composed closures (one call per keyword and property: ~40 µs); this one writes
the whole schema out as the source of a single function of straight-line tests and
compiles it once, so checking an envelope costs a few µs. It only answers *whether* an
instance is valid; when it is not, the caller asks jsonschema for the error (path and
message), so both always agree on the verdict for what this supports. Keywords outside
the subset make :func:`compile_check` raise, so a schema change can never be silently
ignored here.

The subset covers every JSON message schema shipped (all kinds but the ops frames, which
the frame reader checks): the codec checks each incoming heartbeat, stack, metrics
sample and outgoing result with it first (decoding a heartbeat: 199 µs before, 17
after; ``benchmarks/bench_codec.py``, benchmarks/README.md "What a message costs").
``$ref`` is resolved into the root's ``$defs`` only, and ``pattern`` is searched with
Python's ``re``, as jsonschema does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})
_SUPPORTED = _ANNOTATIONS | {
    "$ref",
    "type",
    "const",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "pattern",
    "propertyNames",
    "oneOf",
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
    return _Writer(schema.get("$defs", {})).compiled(schema)


class _Writer:
    """Emits ``if <instance fails>: return False`` lines for each schema node."""

    def __init__(self, defs: Mapping[str, Any], expanding: tuple[str, ...] = ()) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {"_json_equal": _json_equal, "_MISSING": _MISSING}
        self._names = 0
        self._defs = defs  # the root's $defs
        self._expanding = list(expanding)  # the $refs being written out, to refuse recursion

    def compiled(self, schema: Mapping[str, Any]) -> Check:
        """``schema`` as one function."""
        self.node(schema, "v", 1)
        source = "\n".join(["def check(v):", *self.lines, "    return True", ""])
        namespace = dict(self.constants)
        exec(compile(source, "<fastcheck>", "exec"), namespace)  # written above, from the schema
        check: Check = namespace["check"]
        check.source = source  # type: ignore[attr-defined]  # for reading and debugging
        return check

    def _branch(self, schema: Mapping[str, Any]) -> str:
        """A subschema compiled as its own function (a ``oneOf`` branch), by name."""
        return self._constant(_Writer(self._defs, tuple(self._expanding)).compiled(schema))

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
        if "$ref" in schema:
            self._ref(schema["$ref"], v, depth)
        if "type" in schema:
            names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
            tests = " or ".join(_TYPE_TESTS[name].format(v=v) for name in names)
            self._fail_if(f"not ({tests})", depth)
        self._values(schema, v, depth)
        if "oneOf" in schema:
            branches = ", ".join(self._branch(sub) for sub in schema["oneOf"])
            self._fail_if(f"[b({v}) for b in ({branches},)].count(True) != 1", depth)
        if {"properties", "required", "additionalProperties", "propertyNames"} & set(schema):
            self._object(schema, v, depth)
        if "items" in schema or "prefixItems" in schema:
            self._array(schema, v, depth)

    def _ref(self, ref: str, v: str, depth: int) -> None:
        """A ``#/$defs/<name>`` of the root, written out in place (it applies beside the
        node's other keywords, as in draft 2020-12); other and recursive refs raise."""
        name = ref.removeprefix("#/$defs/")
        if name == ref or "/" in name or name not in self._defs:
            raise ValueError(f"fastcheck supports $ref to the root's $defs only, not {ref!r}")
        if name in self._expanding:
            raise ValueError(f"fastcheck does not support recursive $ref {ref!r}")
        self._expanding.append(name)
        self.node(self._defs[name], v, depth)
        self._expanding.pop()

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
        if "pattern" in s:  # searched, not matched, as jsonschema does (Python's re)
            pattern = self._constant(re.compile(s["pattern"]))
            self._fail_if(f"type({v}) is str and not {pattern}.search({v})", depth)
        for keyword, kind, op in (
            ("minLength", "str", ">="),
            ("maxLength", "str", "<="),
            ("minItems", "list", ">="),
            ("maxItems", "list", "<="),
            ("maxProperties", "dict", "<="),
        ):
            if keyword in s:
                bound = self._constant(s[keyword])
                self._fail_if(f"type({v}) is {kind} and not len({v}) {op} {bound}", depth)

    def _object(self, schema: Mapping[str, Any], v: str, depth: int) -> None:
        pad = "    " * depth
        self.lines.append(f"{pad}if type({v}) is dict:")
        self.lines.append(f"{pad}    pass")
        extra = schema.get("additionalProperties", True)
        if extra is not True:
            allowed = self._constant(frozenset(schema.get("properties", {})))
            if extra is False:
                self._fail_if(f"not {v}.keys() <= {allowed}", depth + 1)
            else:  # a schema every other property's value must meet
                name, item = self._new("x"), self._new("x")
                self.lines.append(f"{pad}    for {name}, {item} in {v}.items():")
                self.lines.append(f"{pad}        if {name} not in {allowed}:")
                self.lines.append(f"{pad}            pass")
                self.node(extra, item, depth + 3)
        for key in schema.get("required", ()):
            self._fail_if(f"{key!r} not in {v}", depth + 1)
        if "propertyNames" in schema:
            name = self._new("x")
            self.lines.append(f"{pad}    for {name} in {v}:")
            self.lines.append(f"{pad}        pass")
            self.node(schema["propertyNames"], name, depth + 2)
        for key, sub in schema.get("properties", {}).items():
            item = self._new("x")
            self.lines.append(f"{pad}    {item} = {v}.get({key!r}, _MISSING)")
            self.lines.append(f"{pad}    if {item} is not _MISSING:")
            self.lines.append(f"{pad}        pass")
            self.node(sub, item, depth + 2)

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
