"""What every rankwatch board shares: the datasource, the ClickHouse query, the variables,
the dashboard defaults and the panel styles.

The boards are typed grafana-foundation-sdk builders. The SDK ships no query type for
the ClickHouse datasource plugin (grafana-clickhouse-datasource), so :class:`ClickHouseQuery`
is that query as the plugin stores it: raw SQL (``editorType: sql``) with the plugin's
macros, and the display format (``queryType`` for plugin v4, ``format`` for v3).
"""

from __future__ import annotations

import typing
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as model

PLUGIN = "grafana-clickhouse-datasource"
DATASOURCE = model.DataSourceRef(type_val=PLUGIN, uid="${datasource}")
"""Every panel and variable reads the datasource chosen in the ``datasource`` variable."""

TAGS = ["rankwatch"]
REFRESH = "30s"
DEFAULT_RANGE = ("now-6h", "now")

_FORMATS = {"timeseries": 0, "table": 1}
"""The plugin's Format enum (v3: TIMESERIES = 0, TABLE = 1); v4 reads ``queryType``."""


class ClickHouseQuery(cogvariants.Dataquery):
    """A raw-SQL query of the ClickHouse datasource plugin."""

    def __init__(self, raw_sql: str = "", query_type: str = "table", ref_id: str = "A") -> None:
        if query_type not in _FORMATS:
            raise ValueError(f"query type {query_type!r}: use one of {sorted(_FORMATS)}")
        self.raw_sql = raw_sql
        self.query_type = query_type
        self.ref_id = ref_id

    def to_json(self) -> dict[str, object]:
        return {
            "datasource": DATASOURCE.to_json(),
            "editorType": "sql",
            "format": _FORMATS[self.query_type],
            "queryType": self.query_type,
            "rawSql": self.raw_sql,
            "refId": self.ref_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> typing.Self:
        return cls(data.get("rawSql", ""), data.get("queryType", "table"), data.get("refId", "A"))


cogruntime.Runtime().register_dataquery_variant(
    cogruntime.DataqueryConfig(identifier=PLUGIN, from_json_hook=ClickHouseQuery.from_json)
)


class Query(cogbuilder.Builder[cogvariants.Dataquery]):
    """Builder of a :class:`ClickHouseQuery` (the SDK's panels take query builders)."""

    def __init__(self, sql: str, query_type: str = "table") -> None:
        self._internal = ClickHouseQuery(sql.strip(), query_type)

    def build(self) -> cogvariants.Dataquery:
        return self._internal


# -- variables ---------------------------------------------------------------------------

JOBS_SQL = """
SELECT DISTINCT job FROM (
    SELECT job FROM steps WHERE $__timeFilter(time)
    UNION ALL SELECT job FROM hangs WHERE $__timeFilter(time)
    UNION ALL SELECT job FROM machine_scores WHERE $__timeFilter(time)
    UNION ALL SELECT job FROM jobs
)
ORDER BY job
"""
"""Every job with data in the time range (or known to the jobs table)."""


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("ClickHouse").type(PLUGIN)


def query_variable(name: str, label: str, sql: str, include_all: bool = False) -> db.QueryVariable:
    """A variable filled by SQL, refreshed when the time range changes."""
    variable = (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(sql.strip())
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )
    if include_all:
        variable = variable.include_all(True)
    return variable


def job_variable() -> db.QueryVariable:
    return query_variable("job", "Job", JOBS_SQL)


def board(uid: str, title: str, description: str) -> db.Dashboard:
    """A dashboard with the shared defaults: UTC, tags, refresh, the datasource variable."""
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .timezone("utc")
        .time(*DEFAULT_RANGE)
        .refresh(REFRESH)
        .editable()
        .with_variable(datasource_variable())
        .links(
            [
                db.DashboardLink("rankwatch boards")
                .type(model.DashboardLinkType.DASHBOARDS)
                .tags(TAGS)
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            ]
        )
    )


def link(title: str, url: str) -> db.DashboardLink:
    """A data link (keeps the time range: ``${__url_time_range}`` is appended)."""
    sep = "&" if "?" in url else "?"
    return db.DashboardLink(title).url(f"{url}{sep}${{__url_time_range}}")


def board_url(uid: str, **variables: str) -> str:
    """The URL of another rankwatch board with its variables set (values may be macros)."""
    query = "&".join(f"var-{name}={value}" for name, value in variables.items())
    return f"/d/{uid}?{query}" if query else f"/d/{uid}"


def color_cells(cell_type: str = "color-background") -> model.DynamicConfigValue:
    """Table cells coloured by value (the heat of a grid)."""
    return model.DynamicConfigValue(
        id_val="custom.cellOptions", value={"type": cell_type, "mode": "gradient"}
    )


def heat_colors() -> db.FieldColor:
    return db.FieldColor().mode(model.FieldColorModeId.CONTINUOUS_YL_RD)


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


SLOWDOWN_THRESHOLDS = ((None, "green"), (1.03, "yellow"), (1.1, "orange"), (1.25, "red"))
"""S below 1.03 is noise (docs/whatif.md, "The figures"); 10% and 25% mark a serious straggler."""
