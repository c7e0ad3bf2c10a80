"""Row versions: of two copies of a row, FINAL keeps the complete one, then the newer
owner's, then the later; whatever the wall clock says (a paused worker writes last)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rankwatch.streams.kit.versions import MAX_GENERATION, row_version, version_parts

NS = 1_000_000_000
times = st.integers(min_value=0, max_value=(2**32 - 1) * NS)
generations = st.integers(min_value=0, max_value=MAX_GENERATION)


@given(times, times, generations, generations)
def test_a_complete_row_beats_a_partial_one_whoever_wrote_it_and_when(
    t1: int, t2: int, g1: int, g2: int
) -> None:
    assert row_version(t1, generation=g1) > row_version(t2, generation=g2, complete=False)


@given(times, times, generations, st.booleans())
def test_a_newer_owner_beats_an_older_one_even_writing_earlier(
    t1: int, t2: int, g: int, complete: bool
) -> None:
    if g == MAX_GENERATION:
        return
    newer = row_version(t1, generation=g + 1, complete=complete)
    assert newer > row_version(t2, generation=g, complete=complete)


@given(times, times, generations, st.booleans())
def test_one_owner_later_row_wins_to_the_second(t1: int, t2: int, g: int, complete: bool) -> None:
    a, b = (row_version(t, generation=g, complete=complete) for t in (t1, t2))
    assert (a > b) == (t1 // NS > t2 // NS) and (a == b) == (t1 // NS == t2 // NS)
    assert version_parts(a) == (complete, g, t1 // NS)


def test_the_version_fits_the_tables_uint64() -> None:
    top = row_version((2**32 - 1) * NS, generation=MAX_GENERATION)
    assert 0 < top < 2**64 and row_version(0, generation=-5, complete=False) == 0
