"""The per-step, per-rank slowdown signals, from the ``rank_steps`` summaries (pure).

docs/detection.md, section 3, explains each one. In short, for one rank and step, with
``prev_end`` its previous step end:

- ``t_step = end - prev_end``; ``t_inter = begin - prev_end`` (CPU work between steps);
  ``v_inter = t_inter / t_step``; ``v_minority = (end - begin - covered) /
  (t_step - t_inter)``: the share of the step no timed op covered.
- throughput = samples / t_step.
- FLOP/s = declared FLOPs / (time of those op types less the GC pauses inside them).
- bus bandwidth = bytes x factor / time, with the NCCL factors: all-reduce
  ``2(n-1)/n``, all-gather and reduce-scatter ``(n-1)/n``, point-to-point 1. The time
  of a collective is that of the group member that waited least (the last to arrive
  waits for no one: its time is the transfer), so a straggler's peers, which wait for
  it inside the collective, do not look like a slow link.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankwatch.schemas.optypes import bus_factor

NS = 1e9


@dataclass(frozen=True)
class RankStep:
    """One rank's summary of one step, with who sent it."""

    job: str
    rank: int
    host: str
    dp_rank: int
    pp_rank: int
    item: Mapping[str, Any]
    """The ``rank_steps`` item of the ops v2 message."""

    @property
    def step(self) -> int:
        return int(self.item["step"])


@dataclass(frozen=True)
class Signals:
    """One rank's signals in one step (the ``signals`` message less its envelope)."""

    job: str
    step: int
    rank: int
    host: str
    dp_rank: int
    pp_rank: int
    start_ns: int
    t_step: float
    t_inter: float
    v_inter: float
    v_minority: float
    throughput: float | None
    flops_per_s: float | None
    busbw: float | None
    gc_s: float
    gc_count: int
    data_wait_s: float
    issue_p50_us: float | None
    issue_p99_us: float | None

    @property
    def v_hidden(self) -> float:
        """The part of ``v_inter`` that no data wait or GC pause explains."""
        if self.t_step <= 0:
            return 0.0
        return max(0.0, self.t_inter - self.data_wait_s - self.gc_s) / self.t_step

    @property
    def gc_share(self) -> float:
        return self.gc_s / self.t_step if self.t_step > 0 else 0.0

    @property
    def data_share(self) -> float:
        return self.data_wait_s / self.t_step if self.t_step > 0 else 0.0


def flops_per_s(ops: Iterable[Mapping[str, Any]]) -> float | None:
    """Declared FLOPs over the time of the op types that declared them, GC left out."""
    flops, time_ns = 0.0, 0
    for op in ops:
        if op.get("flops"):
            flops += op["flops"]
            time_ns += op["time_ns"] - op.get("gc_ns", 0)
    return flops * NS / time_ns if flops and time_ns > 0 else None


def _group_key(rs: RankStep, optype: str, algo: str) -> tuple[Any, ...]:
    """Which ranks take part in one collective: a data-parallel collective joins the
    ranks of one stage; point-to-point has no group to compare with."""
    if algo == "p2p":
        return (optype, "rank", rs.rank)
    return (optype, "stage", rs.pp_rank)


def group_times(steps: Sequence[RankStep]) -> dict[tuple[Any, ...], int]:
    """Per collective group of one step: the least time any member spent in it."""
    best: dict[tuple[Any, ...], int] = {}
    for rs in steps:
        for op in rs.item["ops"]:
            if "bytes" in op:
                key = _group_key(rs, op["optype"], op["algo"])
                t = op["time_ns"]
                best[key] = min(best.get(key, t), t)
    return best


def busbw(rs: RankStep, least: Mapping[tuple[Any, ...], int]) -> float | None:
    """Bus bandwidth of this rank's collectives (bytes / s), timed by their groups."""
    moved, time_ns = 0.0, 0
    for op in rs.item["ops"]:
        if "bytes" not in op:
            continue
        moved += op["bytes"] * bus_factor(op["algo"], op["group"])
        time_ns += least.get(_group_key(rs, op["optype"], op["algo"]), op["time_ns"])
    return moved * NS / time_ns if moved and time_ns > 0 else None


def signals_of(rs: RankStep, least: Mapping[tuple[Any, ...], int]) -> Signals:
    item = rs.item
    begin, end = item["begin_ns"], item["end_ns"]
    prev = item.get("prev_end_ns")
    prev = begin if prev is None or prev > begin else prev
    t_step = (end - prev) / NS
    t_inter = (begin - prev) / NS
    inner = end - begin
    minority = max(0, inner - item["covered_ns"])
    samples = item.get("samples", 0)
    issue = item.get("issue")
    return Signals(
        job=rs.job,
        step=rs.step,
        rank=rs.rank,
        host=rs.host,
        dp_rank=rs.dp_rank,
        pp_rank=rs.pp_rank,
        start_ns=begin,
        t_step=t_step,
        t_inter=t_inter,
        v_inter=t_inter / t_step if t_step > 0 else 0.0,
        v_minority=minority / inner if inner > 0 else 0.0,
        throughput=samples / t_step if samples and t_step > 0 else None,
        flops_per_s=flops_per_s(item["ops"]),
        busbw=busbw(rs, least),
        gc_s=item.get("gc_ns", 0) / NS,
        gc_count=int(item.get("gc_count", 0)),
        data_wait_s=item.get("data_wait_ns", 0) / NS,
        issue_p50_us=issue["p50_ns"] / 1e3 if issue else None,
        issue_p99_us=issue["p99_ns"] / 1e3 if issue else None,
    )


def step_signals(steps: Sequence[RankStep]) -> list[Signals]:
    """Every rank's signals of one step (the same job and step), by rank."""
    least = group_times(steps)
    return [signals_of(rs, least) for rs in sorted(steps, key=lambda r: r.rank)]
