"""The scenario table for the terminal (``rankwatch scenario --format text``)."""

from __future__ import annotations

from collections.abc import Sequence

from rankwatch.sim.scenario.calibrate import Calibration
from rankwatch.sim.scenario.network import LINKS
from rankwatch.sim.scenario.predict import ScenarioResult
from rankwatch.sim.scenario.reshape import describe_sizes


def format_table(results: Sequence[ScenarioResult], cal: Calibration) -> str:
    """Calibration summary, then one row per scenario: step time and speedup."""
    width = max([8, *(len(r.scenario.name) for r in results)])
    lines = [f"Job: {describe_sizes(cal.graph)}, {cal.cost_NSD.shape[1]} step(s) calibrated on."]
    for k, fit in enumerate(cal.links):
        bw = "unknown" if fit.bandwidth is None else f"{fit.bandwidth * 8 / 1e9:.3g} Gbit/s"
        lines.append(
            f"  {LINKS[k]}-host links: alpha {fit.alpha_s * 1e6:.3g} µs/hop, bandwidth {bw} "
            f"({fit.how})"
        )
    lines.append("  per op type: median measured cost")
    for f in cal.optypes:
        rate = f" on {f.link}-host links" if f.link else ""
        if f.bus_gbps is not None:
            rate += f", bus {f.bus_gbps:.3g} Gbit/s"
        if f.s_per_flop is not None:
            rate += f", {f.s_per_flop * 1e12:.3g} ps/FLOP"
        lines.append(f"    {f.optype:<28} {f.median_s * 1e3:9.3f} ms{rate}")
    lines += ["", f"{'scenario':<{width}}  {'step time (s)':>13}  {'speedup':>8}"]
    for r in results:
        lines.append(f"{r.scenario.name:<{width}}  {r.step_time_s:>13.6f}  {r.speedup:>8.3f}")
    return "\n".join(lines)
