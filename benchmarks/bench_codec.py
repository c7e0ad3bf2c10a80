"""Decoding and encoding op batches: ops v2 JSON against ops v3 frames, per message size.

Run from the repo root:

    .venv/bin/python benchmarks/bench_codec.py

For batches of 39 (an SE rank's step), 182 (the generated job's) and 2,000 records:
encoded bytes per record, and the best and median of 7 runs of ``decode_ops`` and of
``encode_ops`` (the codec's, numpy), µs per message. Figures: benchmarks/README.md,
"ops v3 frames and batched steps". Then every other kind's example message (the
heartbeats, stacks and metrics the workers read; the steps, alerts and signals they
write): ``decode`` and ``encode``, each validated, µs per message ("Every message
checked by a compiled check first").
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from rankwatch.schemas.codec import decode, decode_ops, encode, encode_ops
from rankwatch.schemas.examples import example, example_batch
from rankwatch.schemas.registry import KINDS


def _runs(f: Callable[[], Any], loops: int, repeat: int = 7) -> dict[str, float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(loops):
            f()
        out.append((time.perf_counter() - t0) / loops * 1e6)
    return {"best_us": round(min(out), 1), "median_us": round(statistics.median(out), 1)}


def main() -> None:
    report = {}
    for n in (39, 182, 2000):
        batch = example_batch(n, steps_done=((3, n),))
        for version in (2, 3):
            data = encode_ops(batch, version=version)
            loops = max(300, 30_000 // n)
            report[f"v{version}, {n} records"] = {
                "bytes_per_record": round(len(data) / n, 1),
                "decode": _runs(lambda d=data: decode_ops(d), loops),
                "encode": _runs(
                    lambda b=batch, v=version: encode_ops(b, version=v), max(50, loops // 4)
                ),
            }
    for kind in KINDS:
        if kind == "ops":
            continue
        message = example(kind)
        data = orjson.dumps(message)
        report[kind] = {
            "bytes": len(data),
            "decode": _runs(lambda k=kind, d=data: decode(k, d), 2000),
            "encode": _runs(lambda k=kind, m=message: encode(k, m), 2000),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
