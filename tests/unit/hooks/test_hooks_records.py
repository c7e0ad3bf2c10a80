"""The hooks' own encoder writes what the codec (numpy) accepts, field for field."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import InFlight, LastDone, encode_heartbeat, encode_ops
from rankwatch.schemas.codec import decode, decode_ops
from rankwatch.schemas.optypes import CODE

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
    message = orjson.loads(encode_ops(IDENT, RECORDS[:1], batch_seq=0, sent_ns=NOW))
    assert "steps_done" not in message
    assert decode_ops(encode_ops(IDENT, RECORDS[:1], batch_seq=0, sent_ns=NOW)).steps_done == ()


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
