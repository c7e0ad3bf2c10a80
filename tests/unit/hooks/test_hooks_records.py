"""The hooks' own encoder writes what the codec (numpy) accepts, field for field: the
same frame bytes, and JSON where a frame cannot carry a value."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import (
    InFlight,
    LastDone,
    encode_heartbeat,
    encode_ops,
    encode_ops_json,
)
from rankwatch.schemas import codec
from rankwatch.schemas.codec import decode, decode_ops
from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.examples import rank_step
from rankwatch.schemas.optypes import CODE, OPTYPES

IDENT = Identity(job="j1", host="h0", rank=3, dp_rank=1, pp_rank=1, dp_size=2, pp_size=2)
NOW = 1_700_000_000_000_000_000
RECORDS = [
    (7, "forward-recv", 0, -1, -1, -1, NOW, 1_000),
    (7, "forward-compute", 0, 0, 0, 1, NOW + 2_000, 50_000),
    (7, "backward-compute", 0, 0, 0, 1, NOW + 60_000, 90_000),
    (7, "optimizer", 0, -1, -1, -1, NOW + 200_000, 5_000),
]


def test_decode_ops_accepts_what_the_hooks_write() -> None:
    data = encode_ops(IDENT, RECORDS, batch_seq=4, sent_ns=NOW + 1, steps_done=[(7, 4)])
    batch = decode_ops(data)
    assert (batch.job, batch.host, batch.rank) == ("j1", "h0", 3)
    assert (batch.dp_rank, batch.pp_rank) == (1, 1)
    assert (batch.dp_size, batch.pp_size, batch.batch_seq, batch.sent_ns) == (2, 2, 4, NOW + 1)
    assert batch.steps_done == ((7, 4),)
    assert batch.optype.tolist() == [CODE[r[1]] for r in RECORDS]
    assert batch.seq_id.tolist() == [0, 0, 0, 0]
    assert batch.mb_id.tolist() == [-1, 0, 0, -1]
    assert batch.gmc.tolist() == [-1, 1, 1, -1]
    assert batch.start_ns.dtype == np.int64 and batch.start_ns.tolist() == [r[6] for r in RECORDS]
    assert batch.duration_ns.tolist() == [r[7] for r in RECORDS]


def test_without_steps_done_the_field_is_absent() -> None:
    message = decode("ops", encode_ops(IDENT, RECORDS[:1], batch_seq=0, sent_ns=NOW))
    assert "steps_done" not in message
    assert decode_ops(encode_ops(IDENT, RECORDS[:1], batch_seq=0, sent_ns=NOW)).steps_done == ()
    assert "steps_done" not in orjson.loads(encode_ops_json(IDENT, RECORDS, batch_seq=0, sent_ns=1))


def test_the_hooks_write_the_codecs_frame_byte_for_byte() -> None:
    kwargs = {"batch_seq": 4, "sent_ns": NOW + 1, "steps_done": [(7, 4)]}
    data = encode_ops(IDENT, RECORDS, **kwargs, rank_steps=[rank_step(step=7)])
    assert data[:4] == b"RWOB"
    assert codec.encode_ops(decode_ops(data)) == data
    as_json = encode_ops_json(IDENT, RECORDS, **kwargs, rank_steps=[rank_step(step=7)])
    assert orjson.loads(as_json)["version"] == 2
    assert codec.encode_ops(decode_ops(as_json)) == data


def test_a_value_a_frame_cannot_carry_goes_as_json_and_is_refused_there() -> None:
    """The hooks never raise for a bad value: the worker dead-letters it with a reason."""
    bad = [(7, "forward-compute", 0, 2**40, 0, 1, NOW, 5)]  # mb_id beyond int32
    data = encode_ops(IDENT, bad, batch_seq=0, sent_ns=NOW)
    assert orjson.loads(data)["version"] == 2
    with pytest.raises(InvalidMessage) as caught:
        decode_ops(data)
    assert caught.value.reason == "bad-value"


_records = st.lists(
    st.tuples(
        st.integers(0, 2**63 - 1),
        st.sampled_from(OPTYPES),
        st.integers(0, 2**63 - 1),
        st.integers(-1, 2**31 - 1),
        st.integers(-1, 2**15 - 1),
        st.integers(-1, 2**31 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=100, deadline=None)
@given(records=_records)
def test_any_records_inside_the_bounds_round_trip(records: list[tuple]) -> None:
    data = encode_ops(IDENT, records, batch_seq=1, sent_ns=NOW)
    batch = decode_ops(data)
    assert [
        tuple(r) for r in zip(*(c.tolist() for c in batch.columns().values()), strict=True)
    ] == [(r[0], CODE[r[1]], *r[2:]) for r in records]
    assert codec.encode_ops(batch) == data


def test_a_batch_holds_at_least_one_record() -> None:
    with pytest.raises(ValueError, match="1 to"):
        encode_ops(IDENT, [], batch_seq=0, sent_ns=NOW)


@pytest.mark.parametrize(
    ("in_flight", "last_done"),
    [
        (None, None),
        (InFlight("forward-compute", 2, 1, NOW), LastDone("forward-recv", 2, 7, NOW - 5)),
    ],
)
def test_heartbeats_validate(in_flight: InFlight | None, last_done: LastDone | None) -> None:
    data = encode_heartbeat(
        IDENT, sent_ns=NOW, step=7, pid=1234, in_flight=in_flight, last_done=last_done
    )
    message = decode("heartbeats", data)
    assert message["step"] == 7 and message["rank"] == 3
    assert message["in_flight"] == (None if in_flight is None else in_flight._asdict())
