"""Panel styles, one function per panel type: the defaults every rankwatch board uses.

Each takes the title, the SQL (a constant from :mod:`rankwatch.grafana.queries`) and the
few things that differ per panel; sizes are in grid units (24 wide).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import barchart as barchart_
from grafana_foundation_sdk.builders import common as common_
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_
from grafana_foundation_sdk.builders import stat as stat_
from grafana_foundation_sdk.builders import table as table_
from grafana_foundation_sdk.builders import timeseries as timeseries_
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model

from rankwatch.grafana.common import (
    DATASOURCE,
    SLOWDOWN_THRESHOLDS,
    Query,
    color_cells,
    heat_colors,
    thresholds,
)

HEIGHT = 8


def timeseries(
    title: str, sql: str, description: str, unit: str = "none", width: int = 12
) -> timeseries_.Panel:
    """A time series: the query returns ``time`` first, then one column per series (or a
    string label column the plugin pivots into series)."""
    return (
        timeseries_.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "timeseries"))
        .unit(unit)
        .span(width)
        .height(HEIGHT)
        .line_width(2)
        .show_points(common_model.VisibilityMode.AUTO)
        .span_nulls(True)
        .legend(
            common_.VizLegendOptions()
            .display_mode(common_model.LegendDisplayMode.LIST)
            .placement(common_model.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )


def stat(
    title: str,
    sql: str,
    description: str,
    unit: str = "none",
    width: int = 6,
    steps: Sequence[tuple[float | None, str]] = ((None, "blue"),),
) -> stat_.Panel:
    """One number (the first row's numeric columns)."""
    return (
        stat_.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "table"))
        .unit(unit)
        .decimals(3)
        .span(width)
        .height(4)
        .thresholds(thresholds(*steps))
        .color_mode(common_model.BigValueColorMode.BACKGROUND)
        .graph_mode(common_model.BigValueGraphMode.NONE)
        .reduce_options(common_.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def table(
    title: str,
    sql: str,
    description: str,
    width: int = 24,
    height: int = HEIGHT,
    links: Sequence[db.DashboardLink] = (),
) -> table_.Panel:
    """A table; ``links`` become data links on every cell (row values via
    ``${__data.fields.<column>}``)."""
    panel = (
        table_.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "table"))
        .span(width)
        .height(height)
        .show_header(True)
    )
    if links:
        panel = panel.data_links(list(links))
    return panel


def barchart(
    title: str,
    sql: str,
    description: str,
    x_field: str,
    width: int = 8,
    steps: Sequence[tuple[float | None, str]] = SLOWDOWN_THRESHOLDS,
) -> barchart_.Panel:
    """Horizontal bars per group, coloured by thresholds (by default the slowdown's)."""
    return (
        barchart_.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "table"))
        .x_field(x_field)
        .orientation(common_model.VizOrientation.HORIZONTAL)
        .show_value(common_model.VisibilityMode.AUTO)
        .span(width)
        .height(HEIGHT)
        .thresholds(thresholds(*steps))
        .color_scheme(db.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
    )


def grid(
    title: str,
    sql: str,
    description: str,
    row: str,
    column: str,
    value: str,
    links: Sequence[db.DashboardLink] = (),
) -> table_.Panel:
    """A heat grid: a long (row, column, value) result pivoted by Grafana's
    "grouping to matrix" transformation into a table with coloured cells."""
    return (
        table(title, sql, description, width=12, height=10, links=links)
        .with_transformation(
            model.DataTransformerConfig(
                id_val="groupingToMatrix",
                options={"rowField": row, "columnField": column, "valueField": value},
            )
        )
        .override_by_regexp(
            "^[0-9]+$",  # the value columns (one per stage); the row label keeps integers,
            # so a data link's ${__data.fields[0]} reads "2", not "2.000"
            [color_cells(), model.DynamicConfigValue(id_val="decimals", value=3)],
        )
        .color_scheme(heat_colors())
    )


def heatmap(title: str, sql: str, description: str, width: int = 12) -> heatmap_.Panel:
    """Pre-bucketed heatmap: ``time``, a label column (one row of cells per label) and the
    value; no calculation by Grafana."""
    return (
        heatmap_.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "timeseries"))
        .calculate(False)
        .color(
            heatmap_.HeatmapColorOptions()
            .mode(heatmap_model.HeatmapColorMode.SCHEME)
            .scheme("YlOrRd")
            .scale(heatmap_model.HeatmapColorScale.LINEAR)
            .fill("dark-orange")
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .rows_frame(heatmap_.RowsHeatmapOptions().layout(common_model.HeatmapCellLayout.AUTO))
        .y_axis(heatmap_.YAxisConfig().axis_label("worker (dp,stage)"))
        .cell_values(heatmap_.CellValues().decimals(3))
        .span(width)
        .height(10)
    )


def flamegraph(title: str, sql: str, description: str, width: int = 24) -> db.Panel:
    """Grafana's flame graph panel (the SDK has no typed builder for it): the query returns
    the nested set ``level, value, self, label`` in depth-first order."""
    return (
        db.Panel()
        .type("flamegraph")
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(Query(sql, "table"))
        .options({"showFlameGraphOnly": False})
        .span(width)
        .height(12)
    )
