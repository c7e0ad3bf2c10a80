"""Bundles of ops frames (``x-bundle`` of the ops schema): each member decodes as if it
had come alone, one bad member costs only itself, a bad envelope refuses the whole."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.messages import frame_with

from rankwatch.schemas import bundle, frame
from rankwatch.schemas.codec import (
    InvalidMessage,
    decode_ops,
    decode_ops_members,
    encode_ops,
    encode_ops_bundle,
)
from rankwatch.schemas.examples import example_batch
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.registry import schema


def frames(n: int = 3) -> list[bytes]:
    return [encode_ops(example_batch(5 + i, rank=i, extras=i % 2 == 1)) for i in range(n)]


def same(a: OpBatch, b: OpBatch) -> bool:
    cols_a, cols_b = a.columns(), b.columns()
    return (
        (a.job, a.rank, a.batch_seq, a.steps_done) == (b.job, b.rank, b.batch_seq, b.steps_done)
        and cols_a.keys() == cols_b.keys()
        and all(np.array_equal(cols_a[k], cols_b[k]) for k in cols_a)
    )


def test_members_decode_as_they_would_alone_as_views_of_the_bundle() -> None:
    members = frames()
    data = encode_ops_bundle(members)
    got = decode_ops_members(data)
    assert len(got) == 3
    for (_, batch), alone in zip(got, members, strict=True):
        assert isinstance(batch, OpBatch) and same(batch, decode_ops(alone))
        assert np.shares_memory(batch.start_ns, np.frombuffer(data, dtype=np.uint8))


def test_a_message_alone_is_its_only_member() -> None:
    alone = frames(1)[0]
    json_message = encode_ops(example_batch(4), version=2)
    for data in (alone, json_message):
        [(raw, batch)] = decode_ops_members(data)
        assert raw is data and isinstance(batch, OpBatch)
    [(_, refused)] = decode_ops_members(alone[:6])
    assert isinstance(refused, InvalidMessage) and refused.reason == "malformed-frame"


@pytest.mark.parametrize(
    "bad",
    [
        {"optype": [0, 99, 0]},
        {"duration_ns": [1, 2, -3]},
        {"mb_id": [0, -2, 0]},
        {"step": [3, -1, 3]},
        {"header": {"steps_done": [{"step": 3, "n_ops": 3.0}]}},  # found after the columns
    ],
)
def test_a_members_fault_is_named_as_alone(bad: dict[str, object]) -> None:
    """A fault in one member's columns is named as it would be alone (the record counted
    within that member) and costs the others nothing."""
    members = [frame_with(0), frame_with(1, **bad), frame_with(2)]  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage) as alone:
        decode_ops(members[1])
    got = decode_ops_members(encode_ops_bundle(members))
    refused = got[1][1]
    assert isinstance(refused, InvalidMessage)
    assert (refused.reason, refused.detail) == (alone.value.reason, alone.value.detail)
    for i in (0, 2):
        batch = got[i][1]
        assert isinstance(batch, OpBatch) and same(batch, decode_ops(members[i]))


def test_a_bad_member_is_refused_and_the_others_kept() -> None:
    good = frames(2)
    short = good[1][:-8]  # a frame short of its last block's bytes
    other_job = encode_ops(example_batch(4, job="another-job"))
    got = decode_ops_members(encode_ops_bundle([good[0], short, other_job, good[1]]))
    kinds = [b.reason if isinstance(b, InvalidMessage) else b.job for _, b in got]
    assert kinds == ["job-1", "column-length", "another-job", "job-1"]  # the job: the key's rule


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda b: b[:4] + struct.pack("<I", 0) + b[8:], "0 members"),
        (lambda b: b[:4] + struct.pack("<I", 10**6) + b[8:], "members"),
        (lambda b: b + bytes(8), "take"),  # trailing bytes
        (lambda b: b[:-1], "take"),  # cut short
        (lambda b: b[:4], "shorter"),
        (lambda b: b[:-1] + b"\x01", "padding"),  # the last member's padding
    ],
)
def test_a_bad_envelope_refuses_the_whole_bundle(edit, words: str) -> None:  # type: ignore[no-untyped-def]
    good = encode_ops_bundle([frames(1)[0][:-3]])  # odd length: the last member is padded
    with pytest.raises(InvalidMessage) as info:
        decode_ops_members(edit(good))
    assert info.value.reason == "malformed-frame" and words in info.value.detail


def test_members_must_be_frames() -> None:
    json_member = encode_ops(example_batch(4), version=2)
    with pytest.raises(InvalidMessage, match="not a frame"):
        encode_ops_bundle([frames(1)[0], json_member])
    forged = bundle.pack([frames(1)[0], json_member])
    with pytest.raises(InvalidMessage, match="member 1 is not a frame"):
        decode_ops_members(forged)


def test_a_bundle_larger_than_the_limit_is_refused() -> None:
    data = encode_ops_bundle(frames(3))
    with pytest.raises(InvalidMessage) as info:
        decode_ops_members(data, max_bytes=len(data) - 1)
    assert info.value.reason == "too-large"


def test_the_layout_is_the_schemas_and_unlike_a_frame_or_json() -> None:
    lay = bundle.layout()
    declared = schema("ops", 3)["x-bundle"]
    assert (lay.magic.decode(), lay.align, lay.max_members) == (
        declared["magic"],
        declared["align"],
        declared["max_members"],
    )
    data = encode_ops_bundle(frames(2))
    assert bundle.is_bundle(data) and not frame.is_frame(data) and data[:1] not in b"{ \t\r\n"


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20))
def test_members_come_back_byte_for_byte_each_aligned(bodies: list[bytes]) -> None:
    magic = frame.magic()
    members = [magic + body for body in bodies]
    data = bundle.pack(members)
    views = bundle.split(data)
    assert [bytes(v) for v in views] == members
    base = np.frombuffer(data, dtype=np.uint8).ctypes.data
    offsets = [np.frombuffer(v, dtype=np.uint8).ctypes.data - base for v in views]
    align = bundle.layout().align
    assert all(at % align == 0 for at in offsets) and len(data) % align == 0
