"""What kind of slowdown a job has, in one screen (pure; ``rankwatch diagnose JOB``).

Input: the job's ``rank_signals`` rows (each with the kinds whose episode was open on
that rank at that step), when the what-if ran its recent slowdown, and its latest
straggler alert. A straggler alert is the verdict when there is one: its rule compared
the group with its peers, over the job's noise, for a window of steps, and named the
worker (ranks, hosts) to cordon; on main a count of open rank-steps said "straggler
network (bandwidth-drop on ranks 2,3)" for rank 3's compute. Otherwise the cause is the
first kind of :data:`CAUSES` that had an episode open: an earlier kind can produce the
later ones as symptoms (a long GC pause on a shared host slows its neighbours' compute;
a busy step leaves collectives waiting), never the other way round. Counting rank-steps
instead named "straggler compute" for one GC run out of five in the held-out study
(``benchmarks/README.md``).
``throughput-drop`` is a symptom, never a cause: alone it says "slower, and none of the
signals says why". With no signal open, a what-if slowdown of 1.10 or more names
stragglers. The numbers compare the flagged rank-steps with the same ranks' others.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CAUSES: tuple[tuple[str, str], ...] = (  # causes before their symptoms
    ("dataloader-bound", "input pipeline"),
    ("gc-pauses", "GC"),
    ("issue-stall", "issue stalls"),
    ("void-high", "hidden CPU work"),
    ("bandwidth-drop", "network"),
    ("flops-drop", "compute"),
)
"""(alert kind, cause), in the order a diagnosis tries them."""
HOST_SIDE = frozenset(("dataloader-bound", "gc-pauses", "issue-stall", "void-high"))
"""Kinds whose time the what-if counts as the op they land in (a GC pause inside a
forward is forward time): the real cause of a straggler they are open on."""
STRAGGLER_AT = 1.10
"""What-if slowdown from which stragglers are named when no signal is open."""

_FIGURES: dict[str, tuple[str, str, float]] = {
    "dataloader-bound": ("data_wait_s", "data-loader wait per step", 1e3),
    "gc-pauses": ("gc_s", "GC pauses per step", 1e3),
    "issue-stall": ("issue_p99_us", "issue latency p99", 1.0),
    "void-high": ("t_inter", "time between steps", 1e3),
    "bandwidth-drop": ("busbw", "bus bandwidth", 1e-6),
    "flops-drop": ("flops_per_s", "FLOP/s", 1e-9),
}
_UNITS = {1e3: "ms", 1.0: "us", 1e-6: "MB/s", 1e-9: "GFLOP/s"}


def host_cause(kinds: set[str] | frozenset[str]) -> str:
    """The cause named by the first host-side kind of ``kinds`` ("": none is)."""
    return next((cause for k, cause in CAUSES if k in HOST_SIDE and k in kinds), "")


@dataclass(frozen=True)
class WhatIf:
    """The what-if engine's recent view of the job (from the ``steps`` table)."""

    slowdown: float
    steps: int
    top: str = ""
    """Its most frequent top attribution, e.g. ``worker 1,0``."""


@dataclass(frozen=True)
class StragglerAlert:
    """The job's latest straggler alert (the alerts table): the group it blames, where
    and why. Its rule already weighed peers, noise and persistence, so it outranks a
    count of the rank-steps whose episodes were open."""

    dimension: str
    group: str
    cause: str
    ranks: list[int]
    hosts: list[str]
    firing: bool


NAMES = {"worker": "worker", "stage": "stage", "dp_rank": "DP rank"}
_KIND_OF = {"compute": "flops-drop", "network": "bandwidth-drop"} | {c: k for k, c in CAUSES}


@dataclass
class Diagnosis:
    job: str
    cause: str
    kind: str
    ranks: list[int] = field(default_factory=list)
    everyone: bool = False
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.lines)


def diagnose(
    job: str,
    rows: Sequence[Mapping[str, Any]],
    whatif: WhatIf | None = None,
    straggler: StragglerAlert | None = None,
) -> Diagnosis:
    ranks_all = sorted({int(r["rank"]) for r in rows})
    counts: dict[str, dict[int, int]] = {}
    for row in rows:
        for kind in row["anomalies"]:
            per = counts.setdefault(kind, {})
            per[int(row["rank"])] = per.get(int(row["rank"]), 0) + 1
    first = next(((k, cause) for k, cause in CAUSES if k in counts), None)
    head = _head(job, rows, ranks_all, whatif)
    if straggler is not None:
        return _of_straggler(job, rows, head, counts, straggler)
    if first is not None:
        kind, cause = first
        ranks = sorted(counts[kind])
        everyone = ranks == ranks_all and len(ranks_all) > 1
        d = Diagnosis(job, _name(cause, everyone), kind, ranks, everyone)
        d.lines = [*head, _verdict(d), *_figures(rows, kind, ranks), *_others(counts, kind)]
        return d
    if whatif is not None and whatif.slowdown >= STRAGGLER_AT:
        d = Diagnosis(job, "stragglers", "straggler")
        d.lines = [*head, f"cause: stragglers (what-if {whatif.top or 'spread'})"]
        return d
    slower = "throughput-drop" in {k for r in rows for k in r.get("anomalies", ())}
    d = Diagnosis(job, "slower, cause unseen" if slower else "healthy", "none")
    d.lines = [*head, f"cause: {d.cause} (no slowdown signal open)"]
    return d


def _of_straggler(
    job: str,
    rows: Sequence[Mapping[str, Any]],
    head: list[str],
    counts: Mapping[str, Mapping[int, int]],
    alert: StragglerAlert,
) -> Diagnosis:
    cause = f"straggler {alert.cause}" if alert.cause in ("compute", "network") else alert.cause
    d = Diagnosis(job, cause or "straggler", "straggler", sorted(alert.ranks))
    plural = "ranks" if len(d.ranks) > 1 else "rank"
    where = f"{plural} {','.join(map(str, d.ranks))}" if d.ranks else "its ranks unknown"
    if alert.hosts:
        where += f" on {', '.join(alert.hosts)}"
    state = "firing" if alert.firing else "resolved"
    verdict = f"cause: {d.cause} ({NAMES.get(alert.dimension, alert.dimension)} {alert.group}"
    verdict += f", {where}; straggler alert {state})"
    kind = _KIND_OF.get(alert.cause, "")
    figures = _figures(rows, kind, d.ranks) if kind in counts else []
    d.lines = [*head, verdict, *figures, *_others(counts, "")]
    return d


def _name(cause: str, everyone: bool) -> str:
    if cause in ("compute", "network"):
        return f"everyone-slow {cause}" if everyone else f"straggler {cause}"
    return cause


def _verdict(d: Diagnosis) -> str:
    plural = "ranks" if len(d.ranks) > 1 else "rank"
    who = "every rank" if d.everyone else f"{plural} {','.join(map(str, d.ranks))}"
    return f"cause: {d.cause} ({d.kind} on {who})"


def _head(
    job: str, rows: Sequence[Mapping[str, Any]], ranks: list[int], whatif: WhatIf | None
) -> list[str]:
    steps = sorted({int(r["step"]) for r in rows})
    lines = [f"job {job}: {len(steps)} steps, {len(ranks)} ranks with slowdown signals"]
    if not rows:
        lines = [
            f"job {job}: no slowdown signals stored (its ops carry no step summaries: hooks"
            " before ops v2, or a replayed trace): the verdict rests on the what-if"
        ]
    slow = [r for r in rows if r["anomalies"]]
    calm = [r for r in rows if not r["anomalies"]]
    if slow and calm:
        before = statistics.median(r["t_step"] for r in calm)
        after = statistics.median(r["t_step"] for r in slow)
        lines.append(
            f"step time {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms where a signal is open"
        )
    if whatif is not None:
        lines.append(
            f"what-if: slowdown {whatif.slowdown:.3f} over {whatif.steps} steps"
            + (f", most blamed {whatif.top}" if whatif.top else "")
        )
    return lines


def _figures(rows: Sequence[Mapping[str, Any]], kind: str, ranks: list[int]) -> list[str]:
    column, label, scale = _FIGURES[kind]
    mine = [r for r in rows if int(r["rank"]) in ranks and r.get(column) is not None]
    bad = [r[column] for r in mine if kind in r["anomalies"]]
    good = [r[column] for r in mine if kind not in r["anomalies"]]
    if not bad or not good:
        return []
    b, g = statistics.median(bad), statistics.median(good)
    ratio = f" ({b / g:.3g}x)" if g else ""
    unit = _UNITS[scale]
    return [f"{label}: {g * scale:.3g} {unit} -> {b * scale:.3g} {unit}{ratio} on those ranks"]


def _others(counts: Mapping[str, Mapping[int, int]], chosen: str) -> list[str]:
    rest = [f"{k} ({sum(v.values())} rank-steps)" for k, v in counts.items() if k != chosen]
    return [f"also open: {', '.join(sorted(rest))}"] if rest else []
