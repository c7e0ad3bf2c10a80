"""Joined bundles (``x-joined`` of the ops schema): one set of column blocks for a
host's frames. Each member must come out as it would from a bundle of the same frames
(and so as it would alone): the same batch, or the same refusal with the same words;
an envelope that cannot be cut apart refuses the whole message."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.messages import frame_with

from rankwatch.schemas import bundle, frame, joined
from rankwatch.schemas.codec import (
    InvalidMessage,
    decode_ops,
    decode_ops_members,
    encode_ops,
    encode_ops_bundle,
    encode_ops_joined,
)
from rankwatch.schemas.examples import example_batch
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.registry import schema


def frames(n: int = 3, *, extras: bool = False) -> list[bytes]:
    return [encode_ops(example_batch(5 + i, rank=i, extras=extras)) for i in range(n)]


def outcome(got: OpBatch | InvalidMessage) -> tuple[object, ...]:
    """What a consumer can tell of a member: its batch's fields and columns, or why not."""
    if isinstance(got, InvalidMessage):
        return ("refused", got.reason, got.detail)
    columns = got.columns()
    return (
        got.job,
        got.rank,
        got.batch_seq,
        got.steps_done,
        got.rank_steps,
        tuple((k, v.dtype.str, v.tolist()) for k, v in columns.items()),
    )


def as_bundle(members: list[bytes]) -> list[tuple[object, ...]]:
    return [outcome(got) for _, got in decode_ops_members(encode_ops_bundle(members))]


def as_joined(members: list[bytes]) -> list[tuple[object, ...]]:
    return [outcome(got) for _, got in decode_ops_members(encode_ops_joined(members))]


@pytest.mark.parametrize("extras", [False, True])
def test_members_come_out_as_from_a_bundle_as_views_of_the_message(extras: bool) -> None:
    members = frames(extras=extras)
    data = encode_ops_joined(members)
    assert joined.is_joined(data) and not bundle.is_bundle(data) and not frame.is_frame(data)
    assert as_joined(members) == as_bundle(members)
    for _, batch in decode_ops_members(data):
        assert isinstance(batch, OpBatch)
        assert np.shares_memory(batch.start_ns, np.frombuffer(data, dtype=np.uint8))
    assert len(data) < len(encode_ops_bundle(members))  # one set of blocks, no member padding


@pytest.mark.parametrize(
    "bad",
    [
        {"optype": [0, 99, 0]},
        {"duration_ns": [1, 2, -3]},
        {"mb_id": [0, -2, 0]},
        {"step": [3, -1, 3]},
        {"header": {"steps_done": [{"step": 3, "n_ops": 3.0}]}},
        {"header": {"rank": -1}},
        {"header": {"job": "another-job"}},  # the job rule is the consumer's: kept here
        {"header": {"strings": {"stream": ["x"]}}},  # a string list for no column sent
    ],
)
def test_a_members_fault_is_named_as_alone_and_costs_the_others_nothing(
    bad: dict[str, object],
) -> None:
    members = [frame_with(0), frame_with(1, **bad), frame_with(2)]  # type: ignore[arg-type]
    got = as_joined(members)
    assert got == as_bundle(members)
    try:
        alone = outcome(decode_ops(members[1]))
    except InvalidMessage as exc:
        alone = outcome(exc)
    assert got[1] == alone
    assert got[0][0] == got[2][0] == "job-1"


def test_string_codes_index_each_members_own_list() -> None:
    a = example_batch(4, rank=0, extras=True, stream=np.array(["a", "b", "a", "b"], dtype=object))
    b = example_batch(3, rank=1, extras=True, stream=np.array(["z", "z", "b"], dtype=object))
    members = [encode_ops(a), encode_ops(b)]
    got = decode_ops_members(encode_ops_joined(members))
    streams = [batch.stream.tolist() for _, batch in got if isinstance(batch, OpBatch)]
    assert streams == [["a", "b", "a", "b"], ["z", "z", "b"]]
    assert as_joined(members) == as_bundle(members)


def _joined_of(headers: list[bytes], body: bytes) -> bytes:
    head = struct.pack(f"<4sI{len(headers)}I", b"RWBJ", len(headers), *map(len, headers))
    head += b"".join(headers)
    return head + bytes(-len(head) % 8) + body


def _parts(data: bytes) -> tuple[list[bytes], bytes]:
    heads, start = joined.split(data)
    return [bytes(h) for h in heads], data[start:]


def _with_header(data: bytes, i: int, **fields: object) -> bytes:
    heads, body = _parts(data)
    heads[i] = orjson.dumps({**orjson.loads(heads[i]), **fields})
    return _joined_of(heads, body)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda b: b[:4] + struct.pack("<I", 0) + b[8:], "0 members"),
        (lambda b: b[:4] + struct.pack("<I", 10**6) + b[8:], "members"),
        (lambda b: b + bytes(8), "take"),  # trailing bytes
        (lambda b: b[:-1], "take"),  # cut short
        (lambda b: b[:6], "shorter"),
        (lambda b: _joined_of([b"{", *_parts(b)[0][1:]], _parts(b)[1]), "member 0's header"),
        (lambda b: _with_header(b, 1, records=4), "take"),  # the sizes do not add up
        (lambda b: _with_header(b, 1, records=0), "records"),
        (lambda b: _with_header(b, 1, records=True), "records"),
        (lambda b: _with_header(b, 0, version=2), "version 3"),
        (lambda b: _with_header(b, 1, extra_columns=["bytes"]), "extra_columns"),
        (lambda b: _with_header(b, 1, extra_columns=["flops", "bytes"]), "extra_columns"),
    ],
)
def test_an_envelope_that_cannot_be_cut_refuses_the_whole_message(edit, words: str) -> None:  # type: ignore[no-untyped-def]
    good = encode_ops_joined(frames(2))
    assert all(isinstance(got, OpBatch) for _, got in decode_ops_members(good))
    with pytest.raises(InvalidMessage) as info:
        decode_ops_members(edit(good))
    assert info.value.reason in ("malformed-frame", "malformed-json", "column-length")
    assert words in info.value.detail


def test_padding_after_the_headers_must_be_zero() -> None:
    heads, body = _parts(encode_ops_joined(frames(2)))
    heads[0] += b" " * (1 + (8 + 4 * 2 + sum(map(len, heads))) % 8)  # JSON still: padding
    data = bytearray(_joined_of(heads, body))
    assert all(isinstance(got, OpBatch) for _, got in decode_ops_members(bytes(data)))
    at = 8 + 4 * 2 + sum(map(len, heads))
    assert at % 8, "the headers must leave padding to spoil"
    data[at] = 1
    with pytest.raises(InvalidMessage, match="padding"):
        decode_ops_members(bytes(data))


def test_a_joined_bundle_larger_than_the_limit_is_refused() -> None:
    data = encode_ops_joined(frames(3))
    with pytest.raises(InvalidMessage) as info:
        decode_ops_members(data, max_bytes=len(data) - 1)
    assert info.value.reason == "too-large"


def test_only_frames_of_one_shape_are_joined_and_a_relay_bundles_the_rest() -> None:
    plain, extra = frames(2), frames(2, extras=True)
    json_message = encode_ops(example_batch(4), version=2)
    short = plain[1][:-8]
    for unjoinable in (
        plain[:1],
        [plain[0], extra[1]],
        [plain[0], json_message],
        [plain[0], short],
        [plain[0], b"RWOB\xff\xff\xff\xff"],
        [plain[0], frame_with(1, header={"records": 2})],
    ):
        assert joined.join(unjoinable) is None
        with pytest.raises(InvalidMessage):
            encode_ops_joined(unjoinable)
        sent = joined.message(unjoinable)
        assert sent == (unjoinable[0] if len(unjoinable) == 1 else bundle.pack(unjoinable))
    assert joined.is_joined(joined.message(plain))
    assert bundle.is_bundle(joined.message(plain, join_them=False))


def test_the_layout_is_the_schemas_and_unlike_a_frame_a_bundle_or_json() -> None:
    lay = joined.layout()
    declared = schema("ops", 3)["x-joined"]
    assert (lay.magic.decode(), lay.align, lay.max_members, lay.version) == (
        declared["magic"],
        declared["align"],
        declared["max_members"],
        3,
    )
    assert lay.magic not in (bundle.layout().magic, frame.magic())
    assert lay.magic[:1] not in b"{ \t\r\n"
    binary = frame.layout(3)
    assert lay.order == binary.order
    assert lay.itemsize == {name: dt.itemsize for name, dt in binary.dtypes.items()}


_FAULTS = [
    {},
    {"optype": [0, 99, 0]},
    {"duration_ns": [1, 2, -3]},
    {"header": {"rank": 2**40}},
    {"header": {"dp_rank": 1.5}},
    {"header": {"job": "another-job"}},
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(_FAULTS))), min_size=2, max_size=6))
def test_joined_and_bundled_frames_come_out_alike(faults: list[int]) -> None:
    """Whatever mix of good and faulty members: member for member the same outcome."""
    members = [frame_with(i, **_FAULTS[f]) for i, f in enumerate(faults)]  # type: ignore[arg-type]
    assert as_joined(members) == as_bundle(members)
