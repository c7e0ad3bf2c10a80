"""fastcheck gives jsonschema's verdict on every shipped schema it compiles, and refuses
what it cannot check (the codec then asks jsonschema alone)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.schemas.codec import _fast_check, decode
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.examples import example
from rankwatch.schemas.fastcheck import compile_check
from rankwatch.schemas.registry import KINDS, compile_schema, schema, versions

_JSON_KINDS = [
    (kind, version)
    for kind in KINDS
    for version in versions(kind)
    if "x-binary" not in schema(kind, version)  # ops v3 frames: checked by the frame reader
]


@pytest.mark.parametrize(("kind", "version"), _JSON_KINDS)
def test_every_json_schema_compiles(kind: str, version: int) -> None:
    """A keyword added to a schema that fastcheck does not know would silently send that
    kind back to jsonschema (forty times slower per message): this makes it loud."""
    assert _fast_check(kind, version) is not None


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key or index path into a JSON value, the value itself first."""
    out = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*here, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*here, i))
    return out


_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", "forward-compute", "1,2", "1,2\n", "a b", "x" * 300]),
    st.lists(st.integers(-2, 2), max_size=3),
    st.dictionaries(st.sampled_from(["step", "a.b", "", "x y"]), st.integers(-1, 3), max_size=2),
)


_EXAMPLES = [
    (kind, version)
    for kind, version in _JSON_KINDS
    if kind != "ops"  # JSON op batches: their envelope check is tested with the ops codec
    and compile_schema(schema(kind, version)).is_valid(example(kind, version=version))
]


def test_every_kind_has_a_valid_example_to_edit() -> None:
    assert {kind for kind, _ in _EXAMPLES} == set(KINDS) - {"ops"}


@settings(max_examples=500, deadline=None)
@given(data=st.data(), which=st.sampled_from(_EXAMPLES))
def test_verdicts_agree_on_random_edits_of_every_kind(
    data: st.DataObject, which: tuple[str, int]
) -> None:
    """One value anywhere in a valid message replaced, removed or added to."""
    kind, version = which
    message = copy.deepcopy(example(kind, version=version))
    path = data.draw(st.sampled_from(_paths(message)[1:]))
    *parent_path, last = path
    parent = message
    for step in parent_path:
        parent = parent[step]
    action = data.draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "replace":
        parent[last] = data.draw(_junk)
    elif action == "remove":
        del parent[last]
    elif isinstance(parent, dict):
        parent[data.draw(st.sampled_from(["zz", "a.b", "x y"]))] = data.draw(_junk)
    else:
        parent.append(data.draw(_junk))
    fast = _fast_check(kind, version)
    assert fast is not None
    assert fast(message) == compile_schema(schema(kind, version)).is_valid(message)


_DEFS_SCHEMA = {
    "$defs": {"name": {"type": "string", "pattern": "^[a-z]{1,3}$"}},
    "type": "object",
    "maxProperties": 3,
    "propertyNames": {"maxLength": 2},
    "additionalProperties": {"type": "integer"},
    "properties": {
        "n": {"$ref": "#/$defs/name"},
        "o": {"oneOf": [{"type": "null"}, {"type": "integer"}, {"type": "number", "minimum": 5}]},
    },
}
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 9),
    st.floats(-1, 9),
    st.sampled_from(["", "ab", "abcd", "a1", "ab\n"]),
)


@settings(max_examples=300, deadline=None)
@given(
    instance=st.one_of(
        st.dictionaries(st.sampled_from(["n", "o", "p", "long"]), _values, max_size=4), _values
    )
)
def test_refs_oneof_patterns_and_property_rules_agree(instance: Any) -> None:
    """$ref into $defs, oneOf (an integer >= 5 matches two branches), pattern,
    propertyNames, maxProperties and a schema for additional properties."""
    assert compile_check(_DEFS_SCHEMA)(instance) == compile_schema(_DEFS_SCHEMA).is_valid(instance)


def test_refs_it_cannot_resolve_are_refused() -> None:
    with pytest.raises(ValueError, match="root's \\$defs only"):
        compile_check({"$ref": "https://example.com/x.json"})
    with pytest.raises(ValueError, match="root's \\$defs only"):
        compile_check({"$ref": "#/$defs/missing"})
    looped = {"$defs": {"a": {"items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}
    with pytest.raises(ValueError, match="recursive"):
        compile_check(looped)


def test_a_refused_message_still_names_the_field_and_rule() -> None:
    """The fast check only says no; the error a producer sees is jsonschema's."""
    message = example("heartbeats")
    message["in_flight"] = {"optype": "nope", "seq_id": 1, "mb_id": 0, "since_ns": 1}
    with pytest.raises(InvalidMessage) as caught:
        decode("heartbeats", orjson.dumps(message))
    assert "$.in_flight" in caught.value.detail
