"""Measured vs simulated slowdown on the real workload (the paper's appendix, on CPU).

Run from the repo root (needs torch; ~10-20 s per job on 2 cores):

    .venv/bin/python benchmarks/validate_whatif.py [--levels 15 40 100] [--repeats 3]

Per straggler level (extra matmuls in rank 0's forward) and repeat, one gloo PP 2 x
DP 2 job (1F1B, 4 microbatches) alternating the straggler on and off; what is
measured and simulated is described in ``rankwatch.validation``.
Prints one JSON line per level as it finishes, then the whole report with the spread
(median, min, max) over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from rankwatch.validation import one_job

GAP = ("measured_mean", "dilution", "imbalance", "launch", "others_slowed", "undiluted",
       "undiluted_over_imbalance")  # fmt: skip
"""Where the gap between simulated and measured comes from (``validation.decompose``)."""


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[15, 40, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="analysed steps per job")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--every", type=int, default=2, help="straggler on/off period")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel size (PP is 2)")
    parser.add_argument("--hidden", type=int, default=128, help="model width")
    args = parser.parse_args()
    report: dict[str, Any] = {"config": vars(args), "levels": {}}
    for level in args.levels:
        runs = [
            one_job(level, args.steps, args.warmup, args.every, seed, args.dp, args.hidden)
            for seed in range(args.repeats)
        ]
        report["levels"][str(level)] = {
            "measured": spread([r["measured"] for r in runs]),
            "simulated": spread([r["simulated"] for r in runs]),
            "error": spread([r["error"] for r in runs]),
            "simulated_over_clean": spread([r["simulated_over_clean"] for r in runs]),
            **{k: spread([r[k] for r in runs]) for k in GAP},
            "replay_error": max(r["replay_error"] for r in runs),
            "top_workers": [r["top_worker"] for r in runs],
            "runs": runs,
        }
        print(json.dumps({level: report["levels"][str(level)]["runs"]}), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
