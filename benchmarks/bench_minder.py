"""Benchmark of Minder's detection call, and (``--asd``) the ASD study.

Run from the repo root (BLAS single-threaded; ``--workers`` threads score metrics at once):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_minder.py \
        --machines 10000 --workers 2
    .venv/bin/python benchmarks/bench_minder.py --asd    # also the full ASD study (torch)

Speed case (docs/minder.md; the paper's 3.6 s per call, here for 10,000 machines): one
``detect`` call
over 15 minutes of 1-second data of ``--machines`` machines (generated: a shared
periodic load plus noise per machine, float32), 10 metrics, each with its own LSTM-VAE
(window 8, hidden 4, latent 8; trained for a few seconds on 100 healthy machines when
torch is installed, else random weights: the cost does not depend on their values),
detection windows of 60 s, continuity 4 windows, the paper's pairwise similarity
(above 1,024 machines against 128 reference machines, ``docs/minder.md``). Two cases:
*healthy* (no machine stands out, so every metric is tried: the worst case) and
*faulty* (one machine drifts in the top-priority metric). Timings: wall-clock median
and spread over ``--repeat`` runs after one warm-up, median CPU time of the process,
and the peak of memory allocated during one call (tracemalloc, which numpy reports
its arrays to), beside the input's own size.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import resource
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from rankwatch.streams.minder import MinderConfig, MinderModel, VaeWeights, detect

ASD = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "asd"
SHAPES = {
    "enc_w_ih": (16, 1),
    "enc_w_hh": (16, 4),
    "enc_b": (16,),
    "mu_w": (8, 4),
    "mu_b": (8,),
    "dec_w_ih": (16, 8),
    "dec_w_hh": (16, 4),
    "dec_b": (16,),
    "out_w": (1, 4),
    "out_b": (1,),
}


def fleet(machines: int, seconds: int, metrics: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(seconds)
    load = 0.5 + 0.3 * np.sin(2 * np.pi * t / 120.0)[None, :, None]
    noise = rng.standard_normal((machines, seconds, metrics), dtype=np.float32)
    return np.clip(load.astype(np.float32) + np.float32(0.03) * noise, 0, 1)


def denoiser(healthy: np.ndarray, seed: int = 0) -> tuple[VaeWeights, str]:
    """A VAE trained briefly on the healthy fleet when torch is there (so that the faulty
    case means something), else random weights (the same cost)."""
    try:
        from rankwatch.streams.minder.train import TrainConfig, train_model
    except ImportError:
        rng = np.random.default_rng(seed)
        arrays = {k: rng.normal(0, 0.5, s).astype(np.float32) for k, s in SHAPES.items()}
        return VaeWeights(8, arrays), "random"
    cfg = TrainConfig(epochs=3, max_windows=20_000, seed=seed)
    model = train_model(healthy[:100, :, :1], ("m",), cfg)
    return model.denoisers["m"], "trained 3 epochs on 100 healthy machines"


def model_for(metrics: int, weights: VaeWeights) -> MinderModel:
    names = tuple(f"metric{k}" for k in range(metrics))
    return MinderModel(metrics=names, denoisers={n: weights for n in names})


def timed(fn: Any, repeat: int) -> dict[str, float]:
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {
        "wall_median_s": round(statistics.median(wall), 3),
        "wall_min_s": round(min(wall), 3),
        "wall_max_s": round(max(wall), 3),
        "cpu_median_s": round(statistics.median(cpu), 3),
    }


def peak_mib(fn: Any) -> float:
    """Peak memory allocated (traced) during one call, MiB."""
    tracemalloc.start()
    try:
        fn()
        return round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
    finally:
        tracemalloc.stop()


def speed(repeat: int, machines: int, metrics: int, workers: int) -> dict[str, Any]:
    config = MinderConfig(window=60, stride=60, continuity=4, threshold=3.0, workers=workers)
    healthy = fleet(machines, 900, metrics)
    weights, how = denoiser(healthy)
    model = model_for(metrics, weights)
    faulty = healthy.copy()
    faulty[17, 300:, 0] = np.clip(faulty[17, 300:, 0] - 0.4, 0, 1)
    out: dict[str, Any] = {
        "machines": machines,
        "seconds": 900,
        "metrics": metrics,
        "workers": workers,
        "vae": how,
        "input_mib": round(healthy.nbytes / 2**20, 1),
    }
    for name, x in (("healthy", healthy), ("faulty", faulty)):
        out[name] = timed(lambda x=x: detect(x, model, config), repeat)
        det = detect(x, model, config)
        out[name]["reported"] = sorted({int(m) for m in np.nonzero(det.confirmed_NM)[1]})
        out[name]["peak_alloc_mib"] = peak_mib(lambda x=x: detect(x, model, config))
    return out


def live(repeat: int, machines: int, metrics: int) -> dict[str, Any]:
    """The live monitor's scoring of one 60-s window of every host (``--live``):
    residual scoring (the worker's default: peer residuals, every host's baseline level
    and spread from its ring of 32 admitted windows, the fused score, continuity, the
    ``machine_scores`` rows and the baseline update) against pairwise scoring of the
    same window. The window's samples are handed in on the grid: building it from the
    hosts' sample queues is the same for both and not timed."""
    from rankwatch.streams.minder.online import NS, JobMonitor, MonitorOutput, OnlineConfig

    x = fleet(machines, 60, metrics).astype(np.float64)
    hosts = [f"host{m:05d}" for m in range(machines)]
    names = [f"metric{k}" for k in range(metrics)]
    out: dict[str, Any] = {"machines": machines, "seconds": 60, "metrics": metrics}
    for scoring in ("residual", "pairwise"):
        monitor = JobMonitor("bench", OnlineConfig(scoring=scoring))
        monitor._window = lambda _end_ns: (hosts, names, x)  # type: ignore[method-assign]
        rng = np.random.default_rng(1)
        for i in range(34):  # every host's ring full (residual scoring)
            med = rng.normal(0, 0.01, (machines, metrics))
            mad = np.full((machines, metrics), 0.01)
            monitor.baselines.observe(i, hosts, names, med, mad, set(), set())

        def once(monitor: JobMonitor = monitor, end: list[int] = [40 * 60 * NS]) -> None:  # noqa: B006
            end[0] += 60 * NS
            monitor._evaluate_window(end[0], MonitorOutput())

        out[scoring] = timed(once, repeat)
    out["blend"] = live_blend(repeat, hosts, names, x)
    return out


def live_blend(repeat: int, hosts: list[str], names: list[str], x: np.ndarray) -> dict[str, Any]:
    """Blend scoring of the same window, every host warm (its own reference refit on a
    ring that changed, both units from 20+ scores): the window is scored 30 times first,
    each host's noise drawn afresh so that its rings fill as on a stream."""
    from rankwatch.streams.minder.online import NS, JobMonitor, MonitorOutput, OnlineConfig

    monitor = JobMonitor("bench", OnlineConfig(scoring="blend"))
    rng = np.random.default_rng(2)
    current = [x]
    monitor._window = lambda _end_ns: (hosts, names, current[0])  # type: ignore[method-assign]
    end = [40 * 60 * NS]

    def once() -> None:
        end[0] += 60 * NS
        current[0] = x + rng.normal(0, 0.01, x.shape)
        monitor._evaluate_window(end[0], MonitorOutput())

    for _ in range(30):
        once()
    return timed(once, repeat)


def asd_study(epochs: int) -> dict[str, Any]:
    from rankwatch.streams.minder.train import TrainConfig, evaluate_dir

    t0 = time.perf_counter()
    out = evaluate_dir(ASD, TrainConfig(epochs=epochs))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--machines", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=1, help="metrics scored at once")
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--asd", action="store_true", help="also the ASD study (needs torch)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--live", action="store_true", help="the live monitor's scoring of one window instead"
    )
    args = parser.parse_args()
    result: dict[str, Any] = (
        {"live": live(args.repeat, args.machines, args.metrics)}
        if args.live
        else {"speed": speed(args.repeat, args.machines, args.metrics, args.workers)}
    )
    if args.asd and ASD.is_dir():
        result["asd"] = asd_study(args.epochs)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
