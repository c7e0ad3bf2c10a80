"""encode/decode of every kind: what the code emits is accepted, anything else refused
with InvalidMessage and a reason."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.schemas.codec import decode, encode
from rankwatch.schemas.errors import REASONS, InvalidMessage
from rankwatch.schemas.examples import example
from rankwatch.schemas.registry import KINDS, versions


def _reason(kind: str, data: bytes, **kwargs: int) -> str:
    with pytest.raises(InvalidMessage) as caught:
        decode(kind, data, **kwargs)
    assert caught.value.reason in REASONS
    assert caught.value.detail
    return caught.value.reason


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(kind: str) -> None:
    message = example(kind)
    assert decode(kind, encode(kind, message)) == message


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_bytes_are_malformed(kind: str) -> None:
    data = encode(kind, example(kind))
    for cut in (1, len(data) // 2, len(data) - 1):
        assert _reason(kind, data[:cut]) == "malformed-json"
    assert _reason(kind, data[:0]) == "no-value"  # no bytes at all: no message


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_version(kind: str) -> None:
    unknown = versions(kind)[-1] + 1
    data = orjson.dumps(example(kind, version=unknown))
    assert _reason(kind, data) == "unknown-version"
    with pytest.raises(InvalidMessage) as caught:
        encode(kind, example(kind, version=unknown))
    assert caught.value.reason == "unknown-version"


@pytest.mark.parametrize("kind", KINDS)
def test_missing_field(kind: str) -> None:
    message = example(kind)
    del message["job"]
    assert _reason(kind, orjson.dumps(message)) == "schema"


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_field(kind: str) -> None:
    assert _reason(kind, orjson.dumps(example(kind, surprise=1))) == "schema"


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_kind_and_non_object(kind: str) -> None:
    other = "steps" if kind != "steps" else "alerts"
    assert _reason(kind, orjson.dumps(example(other))) == "schema"
    assert _reason(kind, b"[1, 2]") == "schema"
    assert _reason(kind, b'"ops"') == "schema"


@pytest.mark.parametrize(
    ("kind", "field", "value", "reason"),
    [
        ("heartbeats", "rank", "5", "schema"),
        ("heartbeats", "rank", -1, "bad-value"),
        ("heartbeats", "step", True, "schema"),
        ("heartbeats", "step", 2**63, "bad-value"),
        ("heartbeats", "in_flight", {"optype": "gc"}, "schema"),
        ("stacks", "threads", [{"name": "x"}], "schema"),
        ("metrics", "metrics", {"cpu": "high"}, "schema"),
        ("metrics", "metrics", {"bad name!": 1}, "bad-value"),
        ("steps", "missing_workers", ["0-1"], "bad-value"),
        ("steps", "t_sim", -0.5, "bad-value"),
        (
            "steps",
            "top_attribution",
            {"dimension": "host", "group": "a", "slowdown": 1},
            "bad-value",
        ),
        ("alerts", "kind", "meltdown", "bad-value"),
        ("alerts", "evidence", [], "schema"),
        ("alerts", "summary", "", "bad-value"),
    ],
)
def test_wrong_values(kind: str, field: str, value: object, reason: str) -> None:
    data = orjson.dumps(example(kind, **{field: value}))
    assert _reason(kind, data) == reason
    with pytest.raises(InvalidMessage):
        encode(kind, example(kind, **{field: value}))


def test_nullable_fields_take_null() -> None:
    for kind, field in [
        ("steps", "waste"),
        ("steps", "top_attribution"),
        ("heartbeats", "in_flight"),
    ]:
        message = example(kind, **{field: None})
        assert decode(kind, encode(kind, message)) == message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_on_encode(value: float) -> None:
    with pytest.raises(InvalidMessage) as caught:
        encode("steps", example("steps", t_base=value))
    assert caught.value.reason == "bad-value"
    assert "$.t_base" in caught.value.detail


def test_non_finite_literals_are_refused_on_decode() -> None:
    data = orjson.dumps(example("steps")).replace(b'"t_base":1.92', b'"t_base":NaN')
    assert _reason("steps", data) == "malformed-json"
    data = orjson.dumps(example("steps")).replace(b'"t_base":1.92', b'"t_base":1e999')
    assert _reason("steps", data) == "malformed-json"


def test_too_large() -> None:
    data = encode("steps", example("steps"))
    assert _reason("steps", data, max_bytes=len(data) - 1) == "too-large"
    assert decode("steps", data, max_bytes=len(data))["step"] == 3
    with pytest.raises(InvalidMessage) as caught:
        encode("steps", example("steps"), max_bytes=10)
    assert caught.value.reason == "too-large"


def test_unknown_kind() -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode("gossip", b"{}")
    assert caught.value.reason == "unknown-kind"


def test_not_bytes() -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode("steps", "{}")  # type: ignore[arg-type]
    assert caught.value.reason == "malformed-json"


def test_detail_names_the_path() -> None:
    message = example("stacks")
    message["threads"][0]["frames"][1]["line"] = -3
    with pytest.raises(InvalidMessage) as caught:
        decode("stacks", orjson.dumps(message))
    assert "$.threads[0].frames[1].line" in caught.value.detail


def test_error_pickles_with_its_reason() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(InvalidMessage("schema", "$.x: bad")))
    assert (error.reason, error.detail) == ("schema", "$.x: bad")


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_any_corruption_is_invalid_message_or_a_valid_message(
    kind: str, data: st.DataObject
) -> None:
    """Random byte edits never raise anything but InvalidMessage."""
    raw = bytearray(encode(kind, example(kind)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        decoded = decode(kind, bytes(raw))
    except InvalidMessage as exc:
        assert exc.reason in REASONS
    else:
        assert decoded["schema"] == kind


@settings(max_examples=100, deadline=None)
@given(
    step=st.integers(0, 2**63 - 1),
    t_base=st.floats(0, 1e6),
    waste=st.none() | st.floats(-1e6, 1),
    workers=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=5),
)
def test_steps_round_trip_property(
    step: int, t_base: float, waste: float | None, workers: list[tuple[int, int]]
) -> None:
    message = example(
        "steps",
        step=step,
        t_base=t_base,
        waste=waste,
        missing_workers=[f"{dp},{stage}" for dp, stage in workers],
    )
    assert decode("steps", encode("steps", message)) == message
