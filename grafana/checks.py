"""What each panel needs from its query, and the panels' queries read back from a board.

Used by the tests that run every panel's SQL against real tables: a panel type needs
certain columns (a time series a ``time`` column first, the flame graph its nested set
...), and a panel's links and transformations name columns that must exist. Pure.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_NUMERIC = re.compile(r"^(U?Int\d+|Float\d+|Decimal.*)$")
_TEXT = re.compile(r"^(String|FixedString.*|Enum\d*\(.*)$")
_FIELD_REF = re.compile(r"\$\{__data\.fields\.(\w+)\}")


@dataclass(frozen=True)
class PanelQuery:
    board: str
    title: str
    type: str
    sql: str
    needs: tuple[str, ...]
    """Columns the panel names outside its query: links, x field, transformations."""
    x_field: str = ""
    """A bar chart's category column."""


def base_type(ch_type: str) -> str:
    """``LowCardinality(Nullable(String))`` -> ``String``."""
    for wrapper in ("LowCardinality(", "Nullable("):
        while ch_type.startswith(wrapper):
            ch_type = ch_type[len(wrapper) : -1]
    return ch_type


def is_numeric(ch_type: str) -> bool:
    return bool(_NUMERIC.match(base_type(ch_type)))


def is_text(ch_type: str) -> bool:
    return bool(_TEXT.match(base_type(ch_type)))


def is_time(ch_type: str) -> bool:
    return base_type(ch_type).startswith("DateTime")


def panel_queries(model: dict[str, Any]) -> list[PanelQuery]:
    """Every panel target of a dashboard model, with the columns the panel refers to."""
    out = []
    for panel in model.get("panels", []):
        needs = set(_FIELD_REF.findall(repr(panel.get("fieldConfig", {}))))
        x_field = (panel.get("options") or {}).get("xField")
        if x_field:
            needs.add(x_field)
        for t in panel.get("transformations") or []:
            if t["id"] == "groupingToMatrix":
                needs.update(t["options"][k] for k in ("rowField", "columnField", "valueField"))
        for target in panel.get("targets", []):
            out.append(
                PanelQuery(
                    model["uid"],
                    panel["title"],
                    panel["type"],
                    target["rawSql"],
                    tuple(sorted(needs)),
                    x_field or "",
                )
            )
    return out


def variable_queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, SQL) of the dashboard's query variables."""
    return [
        (v["name"], v["query"])
        for v in model.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    ]


def problems(panel: PanelQuery, columns: Sequence[tuple[str, str]]) -> list[str]:
    """What is wrong with ``columns`` ((name, ClickHouse type) in order) for the panel."""
    names = [name for name, _ in columns]
    out = [f"no column {n!r}" for n in panel.needs if n not in names]
    numeric = [n for n, t in columns if is_numeric(t)]
    if panel.type in ("timeseries", "heatmap"):
        if not columns or columns[0][0] != "time" or not is_time(columns[0][1]):
            out.append("the first column must be `time`, a DateTime")
        labels = [n for n, t in columns[1:] if not is_numeric(t)]
        if any(not is_text(t) for n, t in columns[1:] if n in labels):
            out.append(f"non-numeric columns must be text labels: {labels}")
        if not numeric:
            out.append("no numeric column to plot")
        if panel.type == "heatmap" and (len(labels) != 1 or len(numeric) != 1):
            out.append("a heatmap needs one label column (the rows) and one value column")
    elif panel.type == "stat":
        if not numeric or len(numeric) != len(columns):
            out.append("a stat shows numeric columns only")
    elif panel.type == "barchart":
        x = panel.x_field
        if not any(n == x and is_text(t) for n, t in columns):
            out.append(f"the x field {x!r} must be a text column")
        if not [n for n in numeric if n != x]:
            out.append("no numeric column for the bars")
    elif panel.type == "flamegraph":
        expected = ["level", "value", "self", "label"]
        if names != expected:
            out.append(f"the flame graph needs exactly {expected}, got {names}")
        elif not (all(is_numeric(t) for _, t in columns[:3]) and is_text(columns[3][1])):
            out.append("level, value, self must be numbers and label text")
    elif not columns:
        out.append("no columns")
    return out


def flame_problems(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A nested set is depth first: one root, each level at most one below the previous
    row, and a node's value at least the sum of its children's plus its self."""
    out = []
    levels = [int(r["level"]) for r in rows]
    if not levels or levels[0] != 0 or levels.count(0) != 1:
        out.append("one root at level 0 first")
    for prev, cur in itertools.pairwise(levels):
        if cur > prev + 1:
            out.append(f"level jumps from {prev} to {cur}")
    for i, row in enumerate(rows):
        children = 0
        for other in rows[i + 1 :]:
            if other["level"] <= row["level"]:
                break
            if other["level"] == row["level"] + 1:
                children += other["value"]
        if row["value"] != children + row["self"]:
            out.append(f"{row['label']}: value {row['value']} != children + self")
    return out
