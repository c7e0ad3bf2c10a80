"""What a panel type needs from its query (the rules the SQL tests apply)."""

from __future__ import annotations

from rankwatch.grafana.checks import PanelQuery, flame_problems, problems


def panel(kind: str, needs: tuple[str, ...] = (), x: str = "") -> PanelQuery:
    return PanelQuery("b", "t", kind, "SELECT 1", needs, x)


def test_time_series_needs_time_first_and_numbers() -> None:
    ok = [("time", "DateTime('UTC')"), ("host", "LowCardinality(String)"), ("s", "Float64")]
    assert problems(panel("timeseries"), ok) == []
    assert problems(panel("timeseries"), ok[1:] + ok[:1])
    assert problems(panel("timeseries"), ok[:2])


def test_heatmap_needs_one_label_and_one_value() -> None:
    ok = [("time", "DateTime64(3, 'UTC')"), ("worker", "String"), ("S_w", "Float64")]
    assert problems(panel("heatmap"), ok) == []
    assert problems(panel("heatmap"), [*ok, ("other", "Float64")])


def test_stat_barchart_flamegraph_and_named_fields() -> None:
    assert problems(panel("stat"), [("S", "Nullable(Float64)")]) == []
    assert problems(panel("stat"), [("S", "String")])
    bars = [("optype", "String"), ("S_g", "Float64")]
    assert problems(panel("barchart", ("optype",), "optype"), bars) == []
    assert problems(panel("barchart", ("x",), "x"), bars)
    flame = [("level", "UInt64"), ("value", "UInt64"), ("self", "UInt64"), ("label", "String")]
    assert problems(panel("flamegraph"), flame) == []
    assert problems(panel("flamegraph"), flame[::-1])
    assert problems(panel("table", ("worker",)), [("w", "String")]) == ["no column 'worker'"]


def test_flame_nested_set() -> None:
    good = [
        {"level": 0, "value": 3, "self": 0, "label": "root"},
        {"level": 1, "value": 2, "self": 1, "label": "a"},
        {"level": 2, "value": 1, "self": 1, "label": "b"},
        {"level": 1, "value": 1, "self": 1, "label": "c"},
    ]
    assert flame_problems(good) == []
    assert flame_problems([good[0], good[2]])  # skips a level
    assert flame_problems([{**good[0], "value": 9}, *good[1:]])  # value != children + self
