"""A job's state as one message, for the worker its partition moves to (pure).

With the embedded chDB store each ops worker owns its own store, so a worker that a
job's partition moves to (a worker added to the group, one leaving, one killed) cannot
read the job's history from the store (:mod:`~.recovery`). The owner therefore writes
what it holds of each job it changed to a compacted Kafka topic, ``<prefix>.jobstate``,
keyed by job, after every flush (everything the message describes is stored by then),
and the next owner restores from the newer of that message and its own store
(docs/sizing.md, "Moving jobs between workers"). The message is
:meth:`~.pipeline.Pipeline.history` of the job, exactly: the window's per-step
summaries and the slowdown detector's baselines as they are, not rebuilt, so the new
owner's numbers are those of an uninterrupted run. Schema: ``schemas/jobstate.v1``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankwatch.schemas.optypes import OPTYPES
from rankwatch.sim.ideal import StepSummary
from rankwatch.streams.ops.alerts import DIMENSIONS, Alert, StepMark
from rankwatch.streams.ops.blame import SPREAD, StepBlame
from rankwatch.streams.ops.pipeline import JobHistory


def state_message(job: str, history: JobHistory) -> dict[str, Any]:
    """The ``jobstate`` message of ``job`` (see jobstate.v1.schema.json). The straggler
    alerts' step marks travel in v1's fields: each step's S in ``slowdowns``; its blame,
    its cause and each dimension's two largest S_g as ``leaders`` rows (dimensions
    ``blame:<dimension>``, ``cause``, ``top:<dimension>`` and ``peer:<dimension>``)."""
    alert = history.last_alert
    return {
        "schema": "jobstate",
        "version": 1,
        "job": job,
        "layout": list(history.layout) if history.layout is not None else None,
        "closed": step_ranges(history.closed_steps),
        "first_seen_ns": history.first_seen_ns,
        "hosts": sorted(history.hosts),
        "coordinates": [[rank, *c] for rank, c in sorted(history.coordinates.items())],
        "stored_batches": sorted(list(b) for b in history.stored_batches),
        "window": [
            {
                "step": step,
                "count": _floats(s.count),
                "total": _floats(s.total),
                "median": _floats(s.median),
            }
            for step, s in sorted((history.summaries or {}).items())
        ],
        "slowdowns": [[step, _float(m.slowdown)] for step, m in sorted(history.marks.items())],
        "leaders": [
            row for step, m in sorted(history.marks.items()) for row in _mark_rows(step, m)
        ],
        "last_top": None,
        "last_alert": alert.message() if alert is not None else None,
        "detector": history.detector,
    }


def history_from(message: dict[str, Any]) -> JobHistory:
    """The :class:`JobHistory` a ``jobstate`` message describes (decoded and validated
    by the codec first). Raises ValueError (or KeyError, TypeError) on a message the
    schema lets through but that cannot be a job's state."""
    marks = _marks(message["slowdowns"], message["leaders"])
    alert = message["last_alert"]
    layout = message["layout"]
    return JobHistory(
        closed_steps=steps_of(message["closed"]),
        marks=marks,
        last_alert=_alert(alert) if alert is not None else None,
        first_seen_ns=message["first_seen_ns"],
        hosts=frozenset(message["hosts"]),
        layout=(int(layout[0]), int(layout[1])) if layout is not None else None,
        coordinates={
            int(r): (int(d), int(p), int(t), int(c)) for r, d, p, t, c in message["coordinates"]
        },
        stored_batches=frozenset((int(r), int(q), int(s)) for r, q, s in message["stored_batches"]),
        summaries={int(w["step"]): _summary(w) for w in message["window"]},
        detector=message["detector"],
    )


BLAME = "blame:"
CAUSE = "cause"
TOP = "top:"
PEER = "peer:"


def _mark_rows(step: int, mark: StepMark) -> list[dict[str, Any]]:
    s = _float(mark.slowdown)
    rows = [
        {"step": step, "dimension": f"{BLAME}{mark.blame.dimension}", "group": mark.blame.group,
         "slowdown": s},
        {"step": step, "dimension": CAUSE, "group": mark.cause, "slowdown": s},
    ]  # fmt: skip
    for dimension, top in sorted(mark.tops.items()):
        rows += [
            {"step": step, "dimension": f"{TOP}{dimension}", "group": g, "slowdown": _float(v)}
            for g, v in top
        ]
    for dimension, (g, v) in sorted(mark.peers.items()):
        rows.append({"step": step, "dimension": f"{PEER}{dimension}", "group": g,
                     "slowdown": _float(v)})  # fmt: skip
    return rows


def _marks(slowdowns: list[list[Any]], leaders: list[dict[str, Any]]) -> dict[int, StepMark]:
    """The alerts' step marks from v1's ``slowdowns`` and ``leaders`` (rows in the order
    :func:`_mark_rows` wrote them). A message of the version before holds each step's
    top group per dimension there instead: its steps come back blamed on nothing
    (spread), with their S."""
    blames: dict[int, StepBlame] = {}
    causes: dict[int, str] = {}
    tops: dict[int, dict[str, list[tuple[str, float]]]] = {}
    peers: dict[int, dict[str, tuple[str, float]]] = {}
    for row in leaders:
        step, dimension = int(row["step"]), str(row["dimension"])
        group = str(row["group"])
        if dimension.startswith(BLAME):
            blames[step] = StepBlame(_group(dimension[len(BLAME) :], group, SPREAD), group)
        elif dimension == CAUSE:
            causes[step] = group if group in ("compute", "network") else ""
        elif dimension.startswith(TOP):
            name = _group(dimension[len(TOP) :], group)
            tops.setdefault(step, {}).setdefault(name, []).append((group, _number(row["slowdown"])))
        elif dimension.startswith(PEER):
            name = dimension[len(PEER) :]
            if name not in ("stage", "dp_rank"):
                raise ValueError(f"bad alert mark {dimension!r} {group!r}")
            _group("worker", group)
            peers.setdefault(step, {})[name] = (group, _number(row["slowdown"]))
    out: dict[int, StepMark] = {}
    for step, value in slowdowns:
        n = int(step)
        top = {d: tuple(gv[:2]) for d, gv in tops.get(n, {}).items()}
        blame = blames.get(n, StepBlame(SPREAD, ""))
        out[n] = StepMark(_number(value), blame, causes.get(n, ""), top, peers.get(n, {}))
    return out


def _group(dimension: str, group: str, *also: str) -> str:
    """``dimension``, checked to name a blame dimension and ``group`` one of its groups
    (a worker is "dp,pp", a stage or DP rank a number; spread names none): the alerts
    split these, so a message that says otherwise is refused here, not there."""
    if dimension in also and group == "":
        return dimension
    parts = group.split(",")
    want = 2 if dimension == "worker" else 1
    if dimension not in DIMENSIONS or len(parts) != want or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad alert mark {dimension!r} {group!r}")
    return dimension


def newest_closed(history: JobHistory) -> int | None:
    """The job's newest closed step in ``history`` (None: none closed): which of two
    histories of a job is newer."""
    return max(history.closed_steps) if history.closed_steps else None


def step_ranges(steps: list[int]) -> list[list[int]]:
    """Step ids as inclusive [first, last] runs (closed steps are mostly consecutive)."""
    out: list[list[int]] = []
    for step in sorted(set(steps)):
        if out and out[-1][1] == step - 1:
            out[-1][1] = step
        else:
            out.append([step, step])
    return out


MAX_CLOSED_STEPS = 1 << 20
"""More closed steps than any assembly remembers (``closed_memory``): a message naming
more is not a job's state, and expanding it would take the worker's memory."""


def steps_of(ranges: list[list[int]]) -> list[int]:
    """The step ids of :func:`step_ranges`'s runs."""
    out: list[int] = []
    for first, last in ranges:
        if last < first or len(out) + last - first >= MAX_CLOSED_STEPS:
            raise ValueError(f"bad step range [{first}, {last}] (or over {MAX_CLOSED_STEPS})")
        out.extend(range(first, last + 1))
    return out


def _summary(entry: dict[str, Any]) -> StepSummary:
    """A window step's summary; one value per op type of this worker's vocabulary (a
    message from a worker with another vocabulary, or a damaged one, is refused here
    rather than failing the job's next analysis)."""
    arrays = [_array(entry[key]) for key in ("count", "total", "median")]
    if any(a.shape != (len(OPTYPES),) for a in arrays):
        shapes = [a.shape for a in arrays]
        raise ValueError(f"step {entry['step']}: summaries of shape {shapes}, not {len(OPTYPES)}")
    return StepSummary(count=arrays[0], total=arrays[1], median=arrays[2])


def _alert(message: dict[str, Any]) -> Alert:
    return Alert(
        alert_id=str(message["alert_id"]),
        job=str(message["job"]),
        state=str(message["state"]),
        severity=str(message["severity"]),
        ts_ns=int(message["ts_ns"]),
        summary=str(message["summary"]),
        evidence=dict(message["evidence"]),
    )


def _float(value: float) -> float | None:
    """JSON has no NaN: it travels as null."""
    return None if math.isnan(value) else float(value)


def _floats(values: np.ndarray) -> list[float | None]:
    return [_float(v) for v in values.tolist()]


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _array(values: list[float | None]) -> np.ndarray:
    return np.array([_number(v) for v in values], dtype=np.float64)
