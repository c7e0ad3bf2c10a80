"""Macro expansion as the ClickHouse datasource plugin does it (frontend, then backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rankwatch.grafana.macros import ALL, MacroError, QueryContext, expand

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
S0, S1 = int(T0.timestamp()), int(T1.timestamp())


def ctx(interval_s: float = 30.0, **variables: str | list[str]) -> QueryContext:
    return QueryContext(T0, T1, interval_s, variables)


def test_time_filter_is_whole_seconds_inclusive() -> None:
    assert expand("WHERE $__timeFilter(time)", ctx()) == (
        f"WHERE time >= toDateTime({S0}) AND time <= toDateTime({S1})"
    )
    assert expand("$__timeFilter_ms(t)", ctx()) == (
        f"t >= fromUnixTimestamp64Milli({S0 * 1000 + 678}) AND "
        f"t <= fromUnixTimestamp64Milli({S1 * 1000 + 678})"
    )


def test_time_interval_uses_the_panel_interval_at_least_one_second() -> None:
    assert expand("$__timeInterval(time)", ctx(30)) == (
        "toStartOfInterval(toDateTime(time), INTERVAL 30 second)"
    )
    assert expand("$__timeInterval( time )", ctx(0.2)) == (
        "toStartOfInterval(toDateTime(time), INTERVAL 1 second)"
    )
    assert expand("$__interval_s", ctx(90.7)) == "90"
    assert expand("$__fromTime / $__toTime", ctx()) == (f"toDateTime({S0}) / toDateTime({S1})")
    assert (
        expand("$__dateFilter(d)", ctx())
        == "d >= toDate('2026-01-02') AND d <= toDate('2026-01-02')"
    )


def test_variables_single_values_unquoted_lists_quoted() -> None:
    c = ctx(job="j-1", hosts=["a", "b"])
    assert expand("job = '${job}' AND job = '$job' AND host IN (${hosts})", c) == (
        "job = 'j-1' AND job = 'j-1' AND host IN ('a','b')"
    )
    assert expand("[[job]]", c) == "j-1"
    with pytest.raises(MacroError, match=r"\$nope"):
        expand("x = '$nope'", c)


def test_conditional_all() -> None:
    sql = "WHERE $__conditionalAll(`group` = '${worker}', $worker) AND 1"
    assert expand(sql, ctx(worker=ALL)) == "WHERE 1=1 AND 1"
    assert expand(sql, ctx(worker="")) == "WHERE 1=1 AND 1"
    assert expand(sql, ctx(worker="2,1")) == "WHERE `group` = '2,1' AND 1"
    nested = "$__conditionalAll(concat(toString(a), ',', toString(b)) = '${w}', ${w})"
    assert expand(nested, ctx(w="1,2")) == "concat(toString(a), ',', toString(b)) = '1,2'"


def test_unknown_macro_and_wrong_arguments_fail() -> None:
    with pytest.raises(MacroError, match="timeFilter"):
        expand("$__timeFilter(a, b)", ctx())
    with pytest.raises(MacroError, match=r"\$__nothing"):
        expand("$__nothing(x)", ctx())
    with pytest.raises(ValueError, match="timezone"):
        QueryContext(datetime(2026, 1, 1), T1)
