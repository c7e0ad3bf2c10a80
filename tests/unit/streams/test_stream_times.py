"""ns timestamps become datetimes truncated, never rounded up across a boundary."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from rankwatch.streams.kit.times import utc


def test_a_timestamp_just_below_a_millisecond_stays_in_it() -> None:
    """Seen in test_worker_kill: first_seen .085999717 was stored as .086 (float rounding)."""
    assert utc(1_795_647_524_085_999_717).microsecond == 85_999
    assert utc(0) == datetime(1970, 1, 1, tzinfo=UTC)


@given(st.integers(0, 4_102_444_800 * 10**9))  # up to 2100
def test_utc_is_the_timestamp_truncated_to_the_microsecond(ns: int) -> None:
    back = utc(ns) - datetime(1970, 1, 1, tzinfo=UTC)
    assert (back.days * 86_400 + back.seconds) * 10**6 + back.microseconds == ns // 1000
