"""Op batches: columnar encode/decode, the vectorised checks and their reasons."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.protocols import Validator

from rankwatch.schemas import columns as cols
from rankwatch.schemas.codec import decode, decode_ops, encode, encode_ops
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.examples import example, example_batch, rank_step
from rankwatch.schemas.fastcheck import Check, compile_check
from rankwatch.schemas.opbatch import HEADER_FIELDS, OpBatch
from rankwatch.schemas.optypes import OPTYPES
from rankwatch.schemas.registry import compile_schema, schema


def _assert_same(a: OpBatch, b: OpBatch) -> None:
    for name in HEADER_FIELDS:
        assert getattr(a, name) == getattr(b, name), name
    assert a.columns().keys() == b.columns().keys()
    for name, column in a.columns().items():
        np.testing.assert_array_equal(column, b.columns()[name], err_msg=name)
    assert a.steps_done == b.steps_done


def _mutated(**ops: Any) -> bytes:
    message = example("ops")
    message["ops"].update(ops)
    return orjson.dumps(message)


def _reason(data: bytes) -> str:
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(data)
    return caught.value.reason


@pytest.mark.parametrize("extras", [False, True])
def test_batch_round_trip(extras: bool) -> None:
    batch = example_batch(50, extras=extras, steps_done=((3, 50),))
    decoded = decode_ops(encode_ops(batch))
    _assert_same(batch, decoded)
    assert decoded.optype.dtype == np.int8
    assert decoded.step.dtype == np.int64


def test_message_and_batch_agree() -> None:
    message = example("ops")
    data = encode("ops", message)
    batch = decode_ops(data)
    assert decode("ops", data) == message
    assert batch.optype_names.tolist() == message["ops"]["optype"]
    assert batch.stream is not None and batch.stream.tolist() == ["compute", "pp"]
    assert batch.flops is None
    assert batch.steps_done == ((2, 412),)
    assert batch.rank_steps == ()
    assert orjson.loads(encode_ops(batch, version=2)) == {**message, "version": 2}


def test_version_1_producers_are_still_accepted() -> None:
    """An old hook (ops v1, no rank_steps) decodes exactly as before; v1 refuses the
    v2-only field, v2 carries it through."""
    v1 = example("ops")
    assert decode_ops(encode("ops", v1)).rank_steps == ()
    with pytest.raises(InvalidMessage):
        decode_ops(orjson.dumps({**v1, "rank_steps": [rank_step()]}))
    v2 = {**v1, "version": 2, "rank_steps": [rank_step()]}
    batch = decode_ops(encode("ops", v2))
    assert batch.rank_steps == (rank_step(),)
    assert orjson.loads(encode_ops(batch, version=2)) == v2


def test_bad_rank_step_is_refused_with_its_path() -> None:
    bad = rank_step(ops=[{"optype": "forward-compute", "n": 0, "time_ns": 5}])
    message = {**example("ops"), "version": 2, "rank_steps": [bad]}
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(orjson.dumps(message))
    assert "rank_steps" in caught.value.detail


def test_every_optype_survives() -> None:
    n = len(OPTYPES)
    batch = example_batch(n, optype=np.arange(n, dtype=np.int8))
    assert decode_ops(encode_ops(batch)).optype_names.tolist() == list(OPTYPES)


@pytest.mark.parametrize(
    ("ops", "reason"),
    [
        ({"step": [3]}, "column-length"),
        ({"step": [3, True]}, "schema"),
        ({"step": [3, "3"]}, "schema"),
        ({"step": [3, None]}, "schema"),
        ({"step": [3, 3.5]}, "schema"),
        ({"step": [3, -1]}, "bad-value"),
        ({"step": [3, 2**63]}, "bad-value"),
        ({"mb_id": [0, -2]}, "bad-value"),
        ({"chunk": [0, 40000]}, "bad-value"),
        ({"duration_ns": [1, -5]}, "bad-value"),
        ({"optype": ["forward-compute", "teleport"]}, "bad-value"),
        ({"optype": ["forward-compute", 3]}, "schema"),
        ({"step": []}, "schema"),
        ({"step": 3}, "schema"),
    ],
)
def test_bad_columns(ops: dict[str, Any], reason: str) -> None:
    assert _reason(_mutated(**ops)) == reason


def test_detail_names_column_and_row() -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(_mutated(duration_ns=[1, -5]))
    assert "$.ops.duration_ns[1]" in caught.value.detail


def test_integral_floats_count_as_integers() -> None:
    """JSON Schema says 3.0 is an integer; so does the vectorised check."""
    assert decode_ops(_mutated(step=[3.0, 4])).step.tolist() == [3, 4]


def test_missing_and_extra_columns() -> None:
    message = example("ops")
    del message["ops"]["gmc"]
    assert _reason(orjson.dumps(message)) == "schema"
    message = example("ops")
    message["extra"]["colour"] = ["red", "blue"]
    assert _reason(orjson.dumps(message)) == "schema"
    message = example("ops")
    message["extra"]["bytes"] = [1]
    assert _reason(orjson.dumps(message)) == "column-length"
    message = example("ops")
    message["extra"]["flops"] = [1.0, -1.0]
    assert _reason(orjson.dumps(message)) == "bad-value"


def test_header_checks() -> None:
    assert _reason(orjson.dumps(example("ops", rank=-1))) == "bad-value"
    assert _reason(orjson.dumps(example("ops", dp_size=0))) == "bad-value"
    assert _reason(orjson.dumps(example("ops", job=""))) == "bad-value"
    assert _reason(orjson.dumps(example("ops", version=7))) == "unknown-version"
    assert _reason(orjson.dumps(example("steps"))) == "schema"
    assert _reason(b'{"schema": "ops"') == "malformed-json"


def test_too_many_records() -> None:
    limit = cols.max_items(schema("ops"))
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(limit + 1))
    assert caught.value.reason in ("column-length", "too-large")
    assert (
        len(decode_ops(encode_ops(example_batch(limit), max_bytes=64 << 20), max_bytes=64 << 20))
        == limit
    )


def test_encode_checks_the_batch() -> None:
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, duration_ns=np.array([1, 2, -3, 4])))
    assert caught.value.reason == "bad-value"
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, step=np.zeros(3, dtype=np.int64)))
    assert caught.value.reason == "column-length"
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, optype=np.full(4, 99, dtype=np.int8)))
    assert caught.value.reason == "bad-value"
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, flops=np.array([1.0, np.nan, 1.0, 1.0])))
    assert caught.value.reason == "bad-value"
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, rank=-1))
    assert caught.value.reason == "bad-value"
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4, step=np.full(4, 1.5)))
    assert caught.value.reason == "schema"


def test_unserialisable_text_is_invalid() -> None:
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(2, stream=np.array(["ok", "\ud800"], dtype=object)))
    assert caught.value.reason == "schema"


def test_numpy_header_values_are_accepted() -> None:
    batch = example_batch(4, rank=np.int64(7), sent_ns=np.int64(5))
    assert decode_ops(encode_ops(batch)).rank == 7


_records = st.integers(1, 40)


@settings(max_examples=60, deadline=None)
@given(n=_records, data=st.data())
def test_random_batches_round_trip(n: int, data: st.DataObject) -> None:
    ints = st.integers(0, 2**63 - 1)
    columns = {
        "step": np.array(data.draw(st.lists(ints, min_size=n, max_size=n)), dtype=np.int64),
        "optype": np.array(
            data.draw(st.lists(st.integers(0, len(OPTYPES) - 1), min_size=n, max_size=n)),
            dtype=np.int8,
        ),
        "mb_id": np.array(
            data.draw(st.lists(st.integers(-1, 2**31 - 1), min_size=n, max_size=n)), dtype=np.int64
        ),
        "flops": np.array(
            data.draw(st.lists(st.floats(0, 1e300), min_size=n, max_size=n)), dtype=np.float64
        ),
        "stream": np.array(
            data.draw(st.lists(st.text(max_size=64), min_size=n, max_size=n)), dtype=object
        ),
    }
    batch = example_batch(n, **columns)
    _assert_same(batch, decode_ops(encode_ops(batch)))


@cache
def _envelope_checks() -> tuple[Check, Validator]:
    envelope = cols.envelope_schema(schema("ops"))
    return compile_check(envelope), compile_schema(envelope)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_fastcheck_agrees_with_jsonschema(data: st.DataObject) -> None:
    """The fast envelope check and jsonschema give the same verdict on random edits."""
    fast, slow = _envelope_checks()
    message = example("ops")
    field = data.draw(st.sampled_from([*message, "ops", "extra", "steps_done"]))
    junk = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=False),
        st.text(max_size=300),
        st.lists(st.integers(-2, 2), max_size=3),
        st.dictionaries(st.sampled_from(["step", "n_ops", "x"]), st.integers(-1, 3), max_size=3),
    )
    if field in ("ops", "extra"):
        column = data.draw(st.sampled_from(["step", "bytes", "flops", "nope"]))
        message.setdefault(field, {})[column] = data.draw(junk)
    elif field == "steps_done":
        message[field] = data.draw(st.lists(junk, max_size=3))
    elif data.draw(st.booleans()):
        message[field] = data.draw(junk)
    else:
        del message[field]
    assert fast(message) == slow.is_valid(message)


_NUMERIC_SPECS = {
    spec.name: spec for spec in cols.column_specs(schema("ops")) if spec.type != "string"
}
_json_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-3, 3).map(float),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=1),
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(_NUMERIC_SPECS)), values=st.lists(_json_values, min_size=1))
def test_fast_and_exact_column_reading_agree(name: str, values: list[Any]) -> None:
    """Skipping the type scan (no bool literal in the document) changes no verdict."""
    spec = _NUMERIC_SPECS[name]

    def outcome(bools_possible: bool) -> tuple[str, list[Any] | None]:
        try:
            column = cols.read_column(spec, values, bools_possible=bools_possible)
        except InvalidMessage as exc:
            return exc.reason, None
        assert column.dtype == spec.dtype
        return "ok", column.tolist()

    assert outcome(False) == outcome(True)


def test_a_bool_is_caught_even_when_strings_say_true() -> None:
    message = example("ops", job="true-north")
    message["ops"]["chunk"] = [0, False]
    assert _reason(orjson.dumps(message)) == "schema"
    assert decode_ops(orjson.dumps(example("ops", job="true-north"))).job == "true-north"


_SUBSET_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["a"],
    "properties": {
        "a": {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
        "b": {"enum": ["x", 1, True]},
        "c": {"type": "array", "prefixItems": [{"const": "p"}], "items": {"type": "number"}},
        "d": {"type": "string", "minLength": 1, "maxLength": 3},
    },
}
_subset_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.floats(-1, 11),
    st.sampled_from(["", "x", "p", "abcd", "ab"]),
    st.lists(st.one_of(st.just("p"), st.integers(0, 3), st.floats(0, 1), st.none()), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    instance=st.one_of(
        st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), _subset_values, max_size=4),
        _subset_values,
    )
)
def test_compiled_check_agrees_with_jsonschema_on_the_whole_subset(instance: Any) -> None:
    """Every keyword fastcheck compiles (type lists, enum with true vs 1, prefixItems,
    closed objects) gives jsonschema's verdict."""
    fast = compile_check(_SUBSET_SCHEMA)
    assert fast(instance) == compile_schema(_SUBSET_SCHEMA).is_valid(instance)


def test_compile_check_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="format"):
        compile_check({"type": "string", "format": "date"})
    with pytest.raises(ValueError, match="patternProperties"):
        compile_check({"type": "object", "patternProperties": {"^a": {"type": "string"}}})
