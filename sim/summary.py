"""A readable account of an :class:`Analysis`: the numbers, and what they mean."""

from __future__ import annotations

import math

from rankwatch.sim.analysis import DIMENSIONS, WORTH_ATTRIBUTING, Analysis

_DOMINANT = 0.5
"""A fix that removes at least this share of the slowdown is called the main cause."""

_DIM_WORDS = {"optype": "op type", "dp_rank": "DP rank", "stage": "pipeline stage"}


def describe(a: Analysis) -> str:
    """Several short paragraphs for the terminal (``rankwatch whatif --format text``)."""
    lines = [
        f"Job: DP {a.dp_size} x PP {a.pp_size}, {a.steps.size} step(s) analysed "
        f"(steps {a.steps.min()}..{a.steps.max()}), all against ideal costs from the whole "
        "trace (offline).",
        "",
        f"Slowdown S = {a.slowdown:.3f}: steps took {_pct(a.slowdown - 1)} longer than they "
        f"would with no straggler (mean simulated step {a.simulated_S.mean():.3f} s, "
        f"ideal {a.ideal_S.mean():.3f} s).",
        f"Waste W = {a.waste:.3f}: {_pct(a.waste)} of the GPU time went to waiting on stragglers.",
        f"Launch slowdown = {a.launch_slowdown:.3f}: recorded steps ({a.base_S.mean():.3f} s) "
        f"are {_pct(a.launch_slowdown - 1)} longer than simulated; that is CPU-side launch "
        "delay the simulation leaves out.",
        f"Replaying the recorded times through the model is off by at most "
        f"{a.replay_error * 1e6:.2f} µs (the model is consistent with the trace).",
        "",
    ]
    if a.slowdown < WORTH_ATTRIBUTING:
        lines.append(
            f"S is below {WORTH_ATTRIBUTING}: there is little slowdown to explain, so the "
            "attributions below are mostly noise."
        )
    lines.append("Attribution (S_g: the slowdown if only group g kept its real durations):")
    for dim in DIMENSIONS:
        lines.append(_attribution_line(a, dim))
    lines += ["", *_verdict(a)]
    return "\n".join(lines)


def _attribution_line(a: Analysis, dim: str) -> str:
    top = list(a.attribution(dim).items())[:3]
    shown = ", ".join(f"{g} {s:.3f} ({_share(a, s)} of it)" for g, s in top)
    return f"  by {_DIM_WORDS[dim]}: {shown}"


def _verdict(a: Analysis) -> list[str]:
    workers = ", ".join(f"dp {d} stage {p}" for d, p in a.top_workers)
    lines = [
        f"Worker issue M_W = {_fmt(a.m_w)}: fixing only the worst {len(a.top_workers)} "
        f"worker(s) ({workers}) would remove {_pct(a.m_w)} of the slowdown.",
        f"Stage partitioning M_S = {_fmt(a.m_s)}: fixing only the last pipeline stage would "
        f"remove {_pct(a.m_s)} of the slowdown.",
    ]
    return [*lines, *_findings(a, workers)]


def _findings(a: Analysis, workers: str) -> list[str]:
    """One line per cause that the figures support (several may hold at once)."""
    if a.slowdown < WORTH_ATTRIBUTING:
        return ["Finding: no significant straggling."]
    out = []
    if a.m_s >= _DOMINANT:
        out.append(
            f"Finding: the last pipeline stage explains {_pct(a.m_s)} of the slowdown: "
            "rebalance layers across stages (e.g. fewer layers on the last one)."
        )
    if a.m_w >= _DOMINANT:
        out.append(
            f"Finding: a few workers explain {_pct(a.m_w)} of the slowdown: look at "
            f"{workers} (a slow machine or link); consider cordoning them."
        )
    ranks = a.attribution("dp_rank")
    spread = sum(s_g >= 1 + 0.25 * (a.slowdown - 1) for s_g in ranks.values()) / len(ranks)
    top_optype = next(iter(a.attribution("optype")))
    if a.m_w < _DOMINANT and a.m_s < 0.9 and spread >= 0.5:
        # With a dominant stage split, every DP rank carries the heavy stage, so the spread
        # speaks only for the part the stage split leaves unexplained.
        part = (
            f"the other {_pct(1 - a.m_s)} of the slowdown" if a.m_s >= _DOMINANT else "the slowdown"
        )
        not_split = "" if a.m_s >= _DOMINANT else " or the stage split"
        out.append(
            f"Finding: {_pct(spread)} of the DP ranks each explain a quarter of the slowdown "
            f"or more, and {top_optype} is the op type most to blame: {part} is spread "
            f"over the job, not one machine{not_split}; uneven work per microbatch "
            "(e.g. sequence lengths) is a common cause: balance it."
        )
    if not out:
        out.append(
            f"Finding: no single group explains most of the slowdown; {top_optype} is the "
            "op type most to blame."
        )
    return out


def _share(a: Analysis, s_g: float) -> str:
    if a.slowdown <= 1:
        return "n/a"
    return _pct((s_g - 1) / (a.slowdown - 1))


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3f}"
