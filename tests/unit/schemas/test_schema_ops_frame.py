"""Op batches as binary frames (ops v3): round trips, the JSON versions still read, and
every way a frame is refused (a reason, never a crash)."""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.schemas import columns as cols
from rankwatch.schemas import frame
from rankwatch.schemas.codec import decode, decode_ops, encode, encode_ops
from rankwatch.schemas.errors import REASONS, InvalidMessage
from rankwatch.schemas.examples import example, example_batch, rank_step
from rankwatch.schemas.opbatch import HEADER_FIELDS, OpBatch
from rankwatch.schemas.optypes import OPTYPES
from rankwatch.schemas.registry import latest_version, schema

V3 = 3
LAYOUT = frame.layout(V3)
SPECS = {spec.name: spec for spec in cols.column_specs(schema("ops", V3))}
REQUIRED = [name for name, spec in SPECS.items() if spec.group == "ops"]


def _same(a: OpBatch, b: OpBatch) -> None:
    for name in HEADER_FIELDS:
        assert getattr(a, name) == getattr(b, name), name
    assert a.columns().keys() == b.columns().keys()
    for name, column in a.columns().items():
        np.testing.assert_array_equal(column, b.columns()[name], err_msg=name)
    assert a.steps_done == b.steps_done
    assert a.rank_steps == b.rank_steps


def _reason(data: bytes, **kwargs: Any) -> str:
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(data, **kwargs)
    assert caught.value.reason in REASONS
    return caught.value.reason


def _header(n: int = 2, **overrides: Any) -> dict[str, Any]:
    batch = example_batch(n)
    header: dict[str, Any] = {"schema": "ops", "version": V3}
    header.update((name, getattr(batch, name)) for name in HEADER_FIELDS)
    header["records"] = n
    header.update(overrides)
    return {k: v for k, v in header.items() if v is not None}


def _blocks(n: int = 2, **columns: Any) -> dict[str, np.ndarray]:
    """The required columns of ``example_batch(n)`` in their wire types, any replaced
    (and any extra one added)."""
    batch = example_batch(n)
    out = {}
    for name in [*REQUIRED, *(c for c in columns if c not in REQUIRED)]:
        values = columns[name] if name in columns else getattr(batch, name)
        out[name] = np.asarray(values).astype(LAYOUT.dtypes[name])
    return out


def _frame(header: Any, blocks: dict[str, np.ndarray]) -> bytes:
    return frame.pack(orjson.dumps(header), blocks, LAYOUT)


# -- round trips --------------------------------------------------------------------------


def test_the_latest_version_is_the_frame() -> None:
    assert latest_version("ops") == V3
    assert frame.binary_versions() == (V3,)
    data = encode_ops(example_batch(4))
    assert frame.is_frame(data) and data[:4] == b"RWOB"


@pytest.mark.parametrize("extras", [False, True])
def test_round_trip(extras: bool) -> None:
    batch = example_batch(50, extras=extras, steps_done=((3, 50),), rank_steps=(rank_step(),))
    decoded = decode_ops(encode_ops(batch))
    _same(batch, decoded)
    assert decoded.optype.dtype == np.int8
    assert decoded.step.dtype == np.int64
    assert decoded.mb_id.dtype == np.int32 and decoded.chunk.dtype == np.int16


def test_columns_are_views_of_the_message() -> None:
    """No second copy of the records: the arrays are the frame's own bytes, read-only."""
    data = encode_ops(example_batch(64))
    batch = decode_ops(data)
    for name in REQUIRED:
        column = getattr(batch, name)
        assert column.base is not None and not column.flags.writeable, name
        assert np.shares_memory(column, np.frombuffer(data, dtype=np.uint8)), name


def test_several_steps_in_one_frame() -> None:
    step = np.repeat([7, 8, 9], 4)
    batch = example_batch(12, step=step, steps_done=((7, 4), (8, 4), (9, 4)))
    batch = OpBatch(**{**vars(batch), "rank_steps": (rank_step(step=7), rank_step(step=8))})
    _same(batch, decode_ops(encode_ops(batch)))


def test_json_versions_are_still_read_and_agree() -> None:
    batch = example_batch(30, extras=True, steps_done=((3, 30),), rank_steps=(rank_step(),))
    v2, v3 = encode_ops(batch, version=2), encode_ops(batch)
    assert v2[:1] == b"{" and orjson.loads(v2)["version"] == 2
    _same(decode_ops(v2), decode_ops(v3))
    v1 = example("ops")
    _same(decode_ops(encode("ops", v1)), decode_ops(encode_ops(decode_ops(encode("ops", v1)))))


def test_decode_gives_the_header_and_the_columns_as_lists() -> None:
    batch = example_batch(3, extras=True, steps_done=((3, 3),))
    message = decode("ops", encode_ops(batch))
    assert message["version"] == V3 and message["records"] == 3
    assert message["ops"]["optype"] == batch.optype_names.tolist()
    assert message["extra"]["stream"] == ["compute"] * 3
    assert message["extra_columns"] == ["bytes", "flops", "stream"]
    assert message["steps_done"] == [{"step": 3, "n_ops": 3}]
    with pytest.raises(InvalidMessage) as caught:
        encode("ops", message)  # a frame is written from a batch, not a dict
    assert caught.value.reason == "schema"


def test_strings_are_sent_once_each() -> None:
    stream = np.array(["pp", "dp", "pp", "", "dp\x00"], dtype=object)
    data = encode_ops(example_batch(5, stream=stream))
    assert decode("ops", data)["extra"]["stream"] == stream.tolist()
    header = orjson.loads(frame.split(data)[0])
    assert header["strings"] == {"stream": ["pp", "dp", "", "dp\x00"]}


_ints = {
    name: st.integers(int(spec.minimum), int(spec.maximum))
    for name, spec in SPECS.items()
    if spec.type == "integer" and spec.enum is None
}


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 30), extras=st.sets(st.sampled_from(["bytes", "flops", "stream"])),
       data=st.data())  # fmt: skip
def test_random_batches_round_trip_through_frames_and_json(
    n: int, extras: set[str], data: st.DataObject
) -> None:
    """Any batch inside the bounds: v3 and v2 carry the same values (the frame's types
    are the narrowest that hold the bounds), and a v2 batch re-sent as v3 is unchanged."""

    def column(strategy: st.SearchStrategy[Any], dtype: Any) -> np.ndarray:
        return np.array(data.draw(st.lists(strategy, min_size=n, max_size=n)), dtype=dtype)

    columns: dict[str, Any] = {name: column(s, np.int64) for name, s in _ints.items()}
    columns["optype"] = column(st.integers(0, len(OPTYPES) - 1), np.int8)
    if "bytes" in extras:
        columns["bytes"] = column(_ints["bytes"], np.int64)
    if "flops" in extras:
        columns["flops"] = column(st.floats(0, 1e300), np.float64)
    if "stream" in extras:
        columns["stream"] = column(st.text(max_size=64), object)
    done = data.draw(st.lists(st.tuples(_ints["step"], st.integers(1, 10**8)), max_size=3))
    batch = example_batch(n, **columns, steps_done=tuple(done))
    via_frame = decode_ops(encode_ops(batch))
    _same(batch, via_frame)
    _same(decode_ops(encode_ops(batch, version=2)), via_frame)
    _same(decode_ops(encode_ops(via_frame)), via_frame)


# -- refusals -----------------------------------------------------------------------------


def test_a_frame_built_here_is_valid() -> None:
    """The hand-made frames below differ from this one in one thing each."""
    decoded = decode_ops(_frame(_header(), _blocks()))
    _same(example_batch(2), decoded)


def test_cut_short_or_overlong() -> None:
    good = _frame(_header(), _blocks())
    assert _reason(good[:6]) == "malformed-frame"
    assert _reason(good[:8] + b"{") == "malformed-frame"  # header length says more
    head_end = 8 + len(orjson.dumps(_header()))
    assert _reason(good[:head_end]) == "column-length"  # no columns at all
    assert _reason(good[:-1]) == "column-length"
    assert _reason(good + bytes(8)) == "column-length"
    assert _reason(good, max_bytes=len(good) - 1) == "too-large"


def test_bad_header() -> None:
    good = _frame(_header(), _blocks())
    length = len(orjson.dumps(_header()))
    not_json = good[:8] + b"#" * length + good[8 + length :]
    assert _reason(not_json) == "malformed-json"
    assert _reason(_frame(_header(version=2), _blocks())) == "schema"  # v2 is JSON
    assert _reason(_frame(_header(version=9), _blocks())) == "unknown-version"
    assert _reason(_frame(_header(schema="steps"), _blocks())) == "schema"
    assert _reason(_frame(_header(records=None), _blocks())) == "schema"
    assert _reason(_frame(_header(records=0), _blocks())) == "bad-value"
    assert _reason(_frame(_header(rank=-1), _blocks())) == "bad-value"
    assert _reason(_frame(_header(colour="red"), _blocks())) == "schema"
    assert _reason(_frame(_header(ops={"step": [1, 2]}), _blocks())) == "schema"
    assert _reason(_frame([1, 2], _blocks())) == "schema"


def test_header_numbers_must_be_whole_integers() -> None:
    """JSON Schema counts 4.0 as an integer: ``records`` of 4.0 once passed every check
    and crashed ``np.frombuffer`` with a TypeError (a poison message for the worker)."""
    blocks = _blocks(4)
    assert _reason(_frame(_header(4, records=4.0), blocks)) == "schema"
    assert _reason(_frame(_header(4, records=True), blocks)) == "schema"
    assert _reason(_frame(_header(4, rank=5.0), blocks)) == "schema"
    assert _reason(_frame(_header(4, steps_done=[{"step": 3.0, "n_ops": 4}]), blocks)) == "schema"
    json_v2 = {**example("ops", version=2), "rank": 5.0}
    assert _reason(orjson.dumps(json_v2)) == "schema"


_HEADER_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)


@settings(max_examples=300, deadline=None)
@hypothesis.example(name="records", value=4.0)
@given(
    name=st.sampled_from([*HEADER_FIELDS, "records", "steps_done", "strings"]), value=_HEADER_VALUES
)
def test_any_header_value_is_read_or_refused_never_a_crash(name: str, value: Any) -> None:
    """A header that parses, with one field of any JSON type or size: a batch with that
    value as given, or InvalidMessage."""
    header = json.dumps({**_header(4), name: value}).encode()  # orjson stops at 64 bits
    try:
        batch = decode_ops(frame.pack(header, _blocks(4), LAYOUT))
    except InvalidMessage as exc:
        assert exc.reason in REASONS
    else:
        if name in HEADER_FIELDS:
            assert getattr(batch, name) == value and type(getattr(batch, name)) is type(value)


def test_padding_must_be_zero() -> None:
    header = orjson.dumps(_header(4))
    good = _frame(_header(4), _blocks(4))
    start, body = 8 + len(header), -(-(8 + len(header)) // 8) * 8
    for pad in range(1, 8):  # a header length whose frame has padding
        padded = orjson.dumps({**_header(4), "job": "j" * pad})
        if (8 + len(padded)) % 8:
            header, good = padded, _frame({**_header(4), "job": "j" * pad}, _blocks(4))
            start, body = 8 + len(header), -(-(8 + len(header)) // 8) * 8
            break
    assert body > start, "no header length gave the frame padding"
    decode_ops(good)
    dirty = good[:start] + b"\xff" * (body - start) + good[body:]
    assert _reason(dirty) == "malformed-frame"


def test_a_mutable_buffer_is_copied_not_viewed() -> None:
    """Columns are views of the message; of bytes (what Kafka hands over), never of a
    buffer the caller may change after the values were checked."""
    data = bytearray(encode_ops(example_batch(8)))
    batch = decode_ops(data)
    before = batch.step.copy()
    body = 8 + int.from_bytes(data[4:8], "little")
    data[body:] = b"\xff" * (len(data) - body)
    np.testing.assert_array_equal(batch.step, before)


def test_a_json_document_cannot_claim_the_frame_version() -> None:
    message = {**example("ops"), "version": V3}
    assert _reason(orjson.dumps(message)) == "schema"


def test_records_must_match_the_blocks() -> None:
    assert _reason(_frame(_header(records=3), _blocks())) == "column-length"
    assert _reason(_frame(_header(records=1), _blocks())) == "column-length"


def test_extra_columns_and_their_strings() -> None:
    n = 2
    flops = np.array([1.0, 2.0])
    codes = np.array([0, 1], dtype=np.uint32)
    both = _blocks(flops=flops, stream=codes)
    ok = _frame(_header(extra_columns=["flops", "stream"], strings={"stream": ["a", "b"]}), both)
    assert decode_ops(ok).stream.tolist() == ["a", "b"]
    assert decode_ops(ok).flops.tolist() == [1.0, 2.0]
    for extras in (["stream", "flops"], ["flops", "flops"], ["colour"]):
        header = _header(n, extra_columns=extras, strings={"stream": ["a", "b"]})
        assert _reason(_frame(header, both)) in ("schema", "bad-value")
    no_strings = _header(extra_columns=["flops", "stream"])
    assert _reason(_frame(no_strings, both)) == "schema"
    stray = _header(extra_columns=["flops"], strings={"stream": ["a"]})
    assert _reason(_frame(stray, _blocks(flops=flops))) == "schema"
    beyond = _header(extra_columns=["stream"], strings={"stream": ["a"]})
    assert _reason(_frame(beyond, _blocks(stream=codes))) == "bad-value"
    long = _header(extra_columns=["stream"], strings={"stream": ["x" * 65, "b"]})
    assert _reason(_frame(long, _blocks(stream=codes))) == "bad-value"
    assert _reason(_frame(_header(extra_columns=["flops"]), _blocks())) == "column-length"


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("step", [3, -1]),
        ("seq_id", [-5, 0]),
        ("seq_id", [0, -(2**63)]),
        ("mb_id", [0, -2]),
        ("chunk", [0, -2]),
        ("gmc", [-3, 0]),
        ("start_ns", [0, -1]),
        ("duration_ns", [1, -5]),
        ("optype", [0, len(OPTYPES)]),
        ("optype", [0, -1]),
    ],
)
def test_values_outside_their_bounds(column: str, values: list[int]) -> None:
    data = _frame(_header(), _blocks(**{column: values}))
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(data)
    assert caught.value.reason == "bad-value"
    assert f"$.ops.{column}[" in caught.value.detail


@pytest.mark.parametrize("flops", [[1.0, np.nan], [np.inf, 1.0], [1.0, -1.0]])
def test_bad_numbers(flops: list[float]) -> None:
    header = _header(extra_columns=["flops"])
    assert _reason(_frame(header, _blocks(flops=np.array(flops)))) == "bad-value"


def test_encode_refuses_what_decode_would() -> None:
    for overrides, reason in (
        ({"duration_ns": np.array([1, 2, -3, 4])}, "bad-value"),
        ({"mb_id": np.array([0, 2**31, 0, 0])}, "bad-value"),
        ({"step": np.zeros(3, dtype=np.int64)}, "column-length"),
        ({"optype": np.full(4, 99, dtype=np.int8)}, "bad-value"),
        ({"flops": np.array([1.0, np.nan, 1.0, 1.0])}, "bad-value"),
        ({"rank": -1}, "bad-value"),
        ({"step": np.full(4, 1.5)}, "schema"),
    ):
        with pytest.raises(InvalidMessage) as caught:
            encode_ops(example_batch(4, **overrides))
        assert caught.value.reason == reason, overrides
    with pytest.raises(InvalidMessage) as caught:
        encode_ops(example_batch(4), max_bytes=100)
    assert caught.value.reason == "too-large"


_GOOD = encode_ops(example_batch(6, extras=True, steps_done=((3, 6),), rank_steps=(rank_step(),)))


@settings(max_examples=400, deadline=None)
@given(
    cut=st.integers(0, len(_GOOD)),
    flips=st.lists(st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)), max_size=4),
)
def test_damaged_frames_are_refused_or_read_never_crash(
    cut: int, flips: list[tuple[int, int]]
) -> None:
    """Truncated or corrupted bytes give a batch or InvalidMessage, nothing else."""
    data = bytearray(_GOOD[:cut])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    try:
        batch = decode_ops(bytes(data))
    except InvalidMessage as exc:
        assert exc.reason in REASONS
    else:
        assert len(batch) == batch.step.shape[0] >= 1


# -- the contract -------------------------------------------------------------------------


def test_every_column_has_a_little_endian_type_that_holds_its_bounds() -> None:
    dtypes = schema("ops", V3)["x-binary"]["dtypes"]
    assert set(dtypes) == set(SPECS)
    for name, spec in SPECS.items():
        dtype = np.dtype(dtypes[name])
        assert dtypes[name][0] in "<|", name
        if spec.type == "integer" and spec.enum is None:
            info = np.iinfo(dtype)
            assert info.min <= spec.minimum and spec.maximum <= info.max, name
            assert np.iinfo(dtype.str[:-1] + str(dtype.itemsize // 2 or 1)).max < spec.maximum or (
                dtype.itemsize == 1
            ), f"{name}: a narrower type would do"


def test_a_type_too_narrow_for_its_bounds_is_a_schema_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = dict(schema("ops", V3))
    raw["x-binary"] = {**raw["x-binary"], "dtypes": {**raw["x-binary"]["dtypes"], "gmc": "<i2"}}
    monkeypatch.setattr(frame, "schema", lambda kind, version: raw)
    frame.layout.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="gmc"):
            frame.layout(V3)
    finally:
        monkeypatch.undo()
        frame.layout.cache_clear()
    assert frame.layout(V3).dtypes["gmc"] == np.dtype("<i4")
