"""Expand a panel's SQL the way Grafana and the ClickHouse datasource plugin do, so that
tests and the report can run a board's exact query against ClickHouse.

Two stages, in the plugin's order:

1. In the browser (the plugin's ``applyTemplateVariables``): ``$__conditionalAll(cond,
   $var)`` becomes ``cond``, or ``1=1`` when ``$var`` is All or empty; then Grafana's
   template service replaces ``$var``, ``${var}`` and ``[[var]]`` with the plugin's
   formatter: a multi-value list becomes ``'a','b'``, a single value goes in as it is
   (unquoted: the SQL writes the quotes).
2. In the plugin's backend (Go, ``pkg/macros``): ``$__timeFilter(c)`` is
   ``c >= toDateTime(<from s>) AND c <= toDateTime(<to s>)``, ``$__timeInterval(c)`` is
   ``toStartOfInterval(toDateTime(c), INTERVAL <n> second)`` with n the panel interval in
   whole seconds (at least 1), ``$__interval_s`` is n, ``$__fromTime``/``$__toTime`` are
   ``toDateTime(<s>)``, the ``_ms`` forms use ``fromUnixTimestamp64Milli(<ms>)``, and
   ``$__dateFilter(c)`` compares ``toDate('YYYY-MM-DD')``. Arguments are the text
   between the parentheses (no nesting), split on commas and trimmed.

Pure: the time range and variables are passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

ALL = "$__all"
"""The value Grafana gives a variable set to All."""

VariableValue = str | Sequence[str]


@dataclass(frozen=True)
class QueryContext:
    """What Grafana sends with a panel query: the time range, interval and variables."""

    time_from: datetime
    time_to: datetime
    interval_s: float = 1.0
    variables: Mapping[str, VariableValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.time_from.tzinfo is None or self.time_to.tzinfo is None:
            raise ValueError("the time range must be timezone-aware")


class MacroError(ValueError):
    """A macro with the wrong arguments, or a variable the context does not define."""


def expand(sql: str, ctx: QueryContext) -> str:
    """``sql`` as ClickHouse receives it from the plugin."""
    return expand_backend(expand_frontend(sql, ctx), ctx)


# -- the browser side --------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_CONDITIONAL_ALL = "$__conditionalAll("


def expand_frontend(sql: str, ctx: QueryContext) -> str:
    sql = _conditional_all(sql, ctx)

    def replace(match: re.Match[str]) -> str:
        name = match[1] or match[2] or match[3]
        if name.startswith("__"):
            return _builtin(name, ctx) or match[0]  # backend macros stay for stage 2
        if name not in ctx.variables:
            raise MacroError(f"variable ${name} is not defined")
        return _format(ctx.variables[name])

    return _VARIABLE.sub(replace, sql)


def _conditional_all(sql: str, ctx: QueryContext) -> str:
    """Innermost-last, like the plugin: it scans from the last occurrence backwards."""
    index = sql.rfind(_CONDITIONAL_ALL)
    while index != -1:
        args = _balanced_args(sql, index + len(_CONDITIONAL_ALL) - 1)
        if len(args) != 2:
            raise MacroError(f"$__conditionalAll needs 2 arguments: {sql[index : index + 80]}")
        condition, variable = args
        name = re.search(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+", variable)
        phrase = condition
        if name:
            value = ctx.variables.get(name[0], "")
            text = ",".join(value) if not isinstance(value, str) else value
            if text in ("", ALL):
                phrase = "1=1"
        sql = sql.replace(f"{_CONDITIONAL_ALL}{condition},{variable})", phrase, 1)
        index = sql.rfind(_CONDITIONAL_ALL)
    return sql


def _balanced_args(sql: str, open_index: int) -> list[str]:
    """The comma-separated arguments of the parenthesis opening at ``open_index``."""
    depth, start, args = 0, open_index + 1, []
    for i in range(open_index, len(sql)):
        ch = sql[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i])
                return args
        elif ch == "," and depth == 1:
            args.append(sql[start:i])
            start = i + 1
    return []


def _format(value: VariableValue) -> str:
    if isinstance(value, str):
        return value
    return "'" + "','".join(value) + "'"


def _builtin(name: str, ctx: QueryContext) -> str | None:
    """Grafana's own variables (the browser fills them)."""
    seconds = max(ctx.interval_s, 0.001)
    values = {
        "__interval": f"{seconds:g}s",
        "__interval_ms": str(round(seconds * 1000)),
        "__from": str(_ms(ctx.time_from)),
        "__to": str(_ms(ctx.time_to)),
    }
    return values.get(name)


# -- the plugin's backend ----------------------------------------------------------------


def _seconds(t: datetime) -> int:
    return int(t.timestamp())


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _date(t: datetime) -> str:
    return f"toDate('{t.astimezone(UTC):%Y-%m-%d}')"


def _one(args: list[str], name: str) -> str:
    if len(args) != 1:
        raise MacroError(f"$__{name}: expected 1 argument, received {len(args)}")
    return args[0]


def _interval_s(ctx: QueryContext) -> int:
    return int(max(ctx.interval_s, 1))


_Macro = Callable[[list[str], QueryContext], str]

_MACROS: dict[str, _Macro] = {
    "fromTime": lambda a, c: f"toDateTime({_seconds(c.time_from)})",
    "toTime": lambda a, c: f"toDateTime({_seconds(c.time_to)})",
    "fromTime_ms": lambda a, c: f"fromUnixTimestamp64Milli({_ms(c.time_from)})",
    "toTime_ms": lambda a, c: f"fromUnixTimestamp64Milli({_ms(c.time_to)})",
    "timeFilter": lambda a, c: (
        f"{_one(a, 'timeFilter')} >= toDateTime({_seconds(c.time_from)}) AND "
        f"{a[0]} <= toDateTime({_seconds(c.time_to)})"
    ),
    "timeFilter_ms": lambda a, c: (
        f"{_one(a, 'timeFilter_ms')} >= fromUnixTimestamp64Milli({_ms(c.time_from)}) AND "
        f"{a[0]} <= fromUnixTimestamp64Milli({_ms(c.time_to)})"
    ),
    "dateFilter": lambda a, c: (
        f"{_one(a, 'dateFilter')} >= {_date(c.time_from)} AND {a[0]} <= {_date(c.time_to)}"
    ),
    "timeInterval": lambda a, c: (
        f"toStartOfInterval(toDateTime({_one(a, 'timeInterval')}), "
        f"INTERVAL {_interval_s(c)} second)"
    ),
    "timeInterval_ms": lambda a, c: (
        f"toStartOfInterval(toDateTime64({_one(a, 'timeInterval_ms')}, 3), "
        f"INTERVAL {max(round(c.interval_s * 1000), 1)} millisecond)"
    ),
    "interval_s": lambda a, c: str(_interval_s(c)),
}


def expand_backend(sql: str, ctx: QueryContext) -> str:
    # Longest names first, so $__timeFilter never eats the start of $__timeFilter_ms.
    for name in sorted(_MACROS, key=len, reverse=True):
        pattern = re.compile(r"\$__" + name + r"\b(?:\((.*?)\))?")

        def replace(match: re.Match[str], name: str = name) -> str:
            args = [a.strip() for a in match[1].split(",")] if match[1] is not None else []
            return _MACROS[name](args, ctx)

        sql = pattern.sub(replace, sql)
    leftover = re.search(r"\$__\w+", sql)
    if leftover:
        raise MacroError(f"{leftover[0]} is not a macro of the ClickHouse plugin")
    return sql
