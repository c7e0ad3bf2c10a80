"""The hooks' CUDA-event path (``rankwatch.hooks.cuda``) on a real GPU: needs torch with
CUDA, so it runs on a machine that has one, not in CI (whose unit tests drive the timer
with stand-in events).

    python benchmarks/check_cuda_timer.py          # prints JSON; exit status 1 if a check fails

What it checks, each against an independent reading:
- op durations against torch's own events recorded just inside the timed op;
- op start and end times, on the host clock, inside the host's readings taken before
  the launch and after a synchronize (the anchoring);
- ``collect`` does not wait for a kernel still running, and returns it once done;
- issue latencies (GPU start minus CPU launch) are never negative;
- the op records encode to an ops message the codec reads back.
And what it measures: the host time the timer adds per op on the training thread, and
the drift of the anchor (host clock against GPU clock) over the run.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from typing import Any

import torch

from rankwatch.hooks.cuda import CudaTimer, stream_lookup
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import encode_ops
from rankwatch.hooks.tracker import NOOP, RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.codec import decode_ops
from rankwatch.streams.slowdown.signals import RankStep, step_signals

MS = 1_000_000


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    ident = Identity(job="gpu-check", host="gpu", rank=0, dp_rank=0, pp_rank=0)
    rw = RankWatch(ident, SinkTransport(lambda kind, value: None), start=False)
    a = torch.randn(8192, 8192, device="cuda")
    (a @ a).sum().item()  # warm up cuBLAS before the anchor
    timer = CudaTimer(rw, torch.cuda)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    checks: dict[str, bool] = {}

    rw.step_begin(0)
    torch.cuda._sleep(50_000_000)  # ~25 ms of work ahead: the timed ops queue behind it, so
    # the events' GPU times hold no host-side gaps between their records
    launches, refs = [], []
    for i, n in enumerate((1024, 2048, 4096, 8192)):
        inner = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launches.append(rw.clock.read())
        with timer.op("forward-compute", mb=i):
            inner[0].record()
            a[:n, :n] @ a[:n, :n]
            inner[1].record()
        refs.append(inner)
    launches.append(rw.clock.read())
    with timer.op("backward-compute", mb=0):
        torch.cuda._sleep(200_000_000)  # a kernel that spins for ~0.1 s
    t0 = time.perf_counter()
    pending = timer.collect()
    report["collect_while_busy_s"] = time.perf_counter() - t0
    checks["collect does not wait for a running kernel"] = (
        pending >= 1 and report["collect_while_busy_s"] < 0.01
    )
    torch.cuda.synchronize()
    synced = rw.clock.read()
    checks["collect returns the kernel once done"] = timer.collect() == 0
    records = rw.buffer.take()[0]
    shift = rw.clock.shift_ns
    starts = [r[6] - shift for r in records]
    ends = [r[6] + r[7] - shift for r in records]
    durations_ms = [r[7] / MS for r in records]
    ref_ms = [s.elapsed_time(e) for s, e in refs]
    report["durations_ms"] = [round(d, 4) for d in durations_ms]
    report["torch_event_ms"] = [round(d, 4) for d in ref_ms]
    # the timer's events sit just outside the reference pair: a little longer, never shorter
    checks["durations match torch's events"] = all(
        r <= d <= r * 1.02 + 0.05 for d, r in zip(durations_ms, ref_ms, strict=False)
    )
    checks["the ~0.1-s kernel measures over 20 ms"] = durations_ms[-1] > 20
    slack = 100_000  # 0.1 ms for the anchor's own reading
    checks["starts follow their launches on the host clock"] = all(
        s >= launch - slack for s, launch in zip(starts, launches, strict=True)
    )
    checks["ends precede the synchronize on the host clock"] = all(
        e <= synced + slack for e in ends
    )
    checks["ops do not overlap on one stream"] = all(
        ends[i] <= starts[i + 1] + slack for i in range(len(ends) - 1)
    )
    report["issue_latency_us"] = [round(ns / 1000, 1) for ns in rw.notes.issue_ns]
    checks["issue latencies are not negative"] = all(ns >= 0 for ns in rw.notes.issue_ns)
    batch = decode_ops(encode_ops(ident, records, batch_seq=0, sent_ns=time.time_ns()))
    checks["the records encode and decode"] = len(batch) == len(records)

    checks["the timer records on the current stream"] = _records_on_current_stream(timer)
    report["host_us_per_op"] = _host_cost_per_op(rw, timer)
    report["host_us_per_call"] = _primitive_costs(rw, timer)
    report["anchor_drift_us"] = _drift_us(timer)
    report["training_step"] = _training_step_cost(ident)
    checks["a training step's ops all recorded"] = report["training_step"].pop("all_recorded")
    report["long_steps"] = long = _long_steps(ident)
    report["issue_latency"] = _issue_latencies(ident)
    report["issue_latency_device_bound"] = _issue_latencies(ident, batch=64)
    report["void"] = _voids(ident)
    checks["ops running past their step's end are sent with it"] = (
        long["late"] == 0 and long["published"] == 8
    )
    per_step = long["issue_latencies_per_step"]
    checks["an op recorded after its step's end counts in that step's issue latencies"] = (
        per_step == [2, 2, 2, 2]
    )
    report["checks"] = checks
    print(json.dumps(report, indent=2))
    return 0 if all(checks.values()) else 1


def _host_cost_per_op(rw: RankWatch, timer: CudaTimer, n: int = 2000) -> dict[str, float]:
    """Training-thread µs per tiny op launched bare, inside ``timer.op`` with completed
    events reused, with new events every op, and with events that look the current
    stream up themselves (``Event.record()``, as before ``stream_lookup``); steps of 100
    ops, each followed by the timer's ``collect`` (the step end's, counted too). Median of
    5 rounds of ``n``, the kinds in turn: the differences are what the timer costs a
    step."""
    x = torch.zeros(16, device="cuda")
    lookup = timer._stream
    kinds = ("bare", "timed", "timed, new events", "timed, Event.record()")
    rounds: dict[str, list[float]] = {kind: [] for kind in kinds}

    def steps(kind: str, ops: int) -> None:
        for first in range(0, ops, 100):
            for _ in range(min(100, ops - first)):
                if kind == "bare":
                    x.add_(1.0)
                else:
                    with timer.op("optimizer"):
                        x.add_(1.0)
            if kind != "bare":
                timer.collect()

    for _ in range(5):
        for kind, times in rounds.items():
            timer.MAX_FREE_EVENTS = 0 if kind == "timed, new events" else CudaTimer.MAX_FREE_EVENTS
            timer._stream = None if kind == "timed, Event.record()" else lookup
            timer._free.clear()
            steps(kind, 200)  # warm: completed events in the pool, where reused
            torch.cuda.synchronize()
            timer.collect()
            t0 = time.perf_counter()
            steps(kind, n)
            times.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
            timer.collect()
            rw.buffer.take()
    timer._stream = lookup
    return {kind: round(statistics.median(v), 2) for kind, v in rounds.items()}


def _records_on_current_stream(timer: CudaTimer) -> bool:
    """The stream the timer's events go to is torch's current one, on the default stream
    and inside ``torch.cuda.stream(side)``, before, during and after the switch."""
    assert timer._stream is not None
    side = torch.cuda.Stream()
    seen = [timer._stream() == torch.cuda.current_stream()]
    with torch.cuda.stream(side):
        seen.append(timer._stream() == side == torch.cuda.current_stream())
    seen.append(timer._stream() == torch.cuda.current_stream() != side)
    return all(seen)


def _primitive_costs(rw: RankWatch, timer: CudaTimer, n: int = 2000) -> dict[str, float]:
    """Training-thread µs of each call a timed op makes, on its own (median of 5 rounds
    of ``n`` calls): where the timer's cost per op goes, and what no timer built on
    torch's events can go under."""
    x = torch.zeros(16, device="cuda")
    done = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for event in done:
        event.record()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    lookup = stream_lookup(torch.cuda)
    assert lookup is not None
    calls: dict[str, Any] = {
        "stream_lookup()": lookup,
        "Event.record(stream_lookup())": lambda: done[0].record(lookup()),
        "launch x.add_": lambda: x.add_(1.0),
        "Event.record()": done[0].record,
        "Event.record(stream)": lambda: done[0].record(stream),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "new Event": lambda: torch.cuda.Event(enable_timing=True),
        "Event.query() done": done[1].query,
        "Event.elapsed_time": lambda: done[0].elapsed_time(done[1]),
        "clock.read()": rw.clock.read,
        "rw.next_seq": lambda: rw.next_seq("optimizer"),
        "rw.emit": lambda: rw.emit("optimizer", 0, 1, 2),
    }
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5):
        for name, call in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            out[name].append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
            rw.buffer.take()
    return {name: round(statistics.median(v), 2) for name, v in out.items()}


class _Published:
    """A sink for the hooks' messages: the op records published, those published after
    the message that said their step was done (late records), and the steps' summaries
    (``rank_steps``)."""

    def __init__(self) -> None:
        self.records, self.late, self.done = 0, 0, set[int]()
        self.rank_steps: list[dict[str, Any]] = []

    def __call__(self, kind: str, value: bytes) -> None:
        if kind == "ops":
            batch = decode_ops(value)
            self.records += len(batch)
            self.late += sum(s in self.done for s in batch.step.tolist())
            self.done.update(s for s, _ in batch.steps_done)
            self.rank_steps.extend(batch.rank_steps)


def _train_step(
    rw: RankWatch,
    timer: CudaTimer,
    net: tuple[Any, Any, Any],
    step: int,
    *,
    timed: bool = True,
    fault: str = "healthy",
) -> float:
    """One step of the small transformer, ms to the device's end: every microbatch's
    forward and backward and the optimizer timed (17 ops; none when not ``timed``), with
    ``fault``: a stray ``torch.cuda.synchronize()`` after every backward, or a 20-ms host
    stall after the fourth forward. The step ends before the synchronize, as in a loop
    that does not wait for the device."""
    model, opt, x = net
    t0 = time.perf_counter()
    if timed:
        rw.step_begin(step)
    for mb in range(x.shape[0]):
        with timer.op("forward-compute", mb=mb) if timed else NOOP:
            loss = model(x[mb]).float().pow(2).mean()
        if fault == "host stall 20 ms" and mb == 3:
            time.sleep(0.02)
        with timer.op("backward-compute", mb=mb) if timed else NOOP:
            loss.backward()
        if fault == "stray synchronize":
            torch.cuda.synchronize()
    with timer.op("optimizer") if timed else NOOP:
        opt.step()
        opt.zero_grad(set_to_none=True)
    if timed:
        rw.step_end()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _training_step_cost(ident: Identity, rounds: int = 5, steps: int = 10) -> dict[str, Any]:
    """Step time of a small bf16 transformer (4 encoder layers, d 1024, 8 microbatches of
    8 x 512 tokens a step, AdamW) trained bare and with every microbatch's forward and
    backward and the optimizer timed by the hooks (17 ops a step; the publisher thread
    running, frames to a sink): median ms per step of each kind, ``rounds`` rounds of
    ``steps`` steps in turn after a warm-up. What the timer costs a real step, where the
    host's launches and the GPU's work overlap."""
    net = _small_transformer()
    sink = _Published()
    rw = RankWatch(ident, SinkTransport(sink))
    timer = CudaTimer(rw, torch.cuda)
    for step in range(3):
        _train_step(rw, timer, net, step)
    times: dict[str, list[float]] = {"bare": [], "timed": []}
    step = 3
    for _ in range(rounds):
        for kind, kept in times.items():
            for _ in range(steps):
                kept.append(_train_step(rw, timer, net, step, timed=kind == "timed"))
                step += 1
    rw.close()
    bare, timed = statistics.median(times["bare"]), statistics.median(times["timed"])
    return {
        "bare_ms": round(bare, 3),
        "timed_ms": round(timed, 3),
        "overhead_pct": round(100 * (timed / bare - 1), 2),
        "bare_ms_range": [round(min(times["bare"]), 3), round(max(times["bare"]), 3)],
        "timed_ms_range": [round(min(times["timed"]), 3), round(max(times["timed"]), 3)],
        "records_published": sink.records,
        "records_late": sink.late,
        "all_recorded": sink.records == 17 * (3 + rounds * steps) and not sink.late,
    }


def _small_transformer(batch: int = 8) -> tuple[Any, Any, Any]:
    """(model, optimizer, 8 microbatches of ``batch`` sequences) of the training-step
    checks. At 8 the host's launches take longer than the device's work (host-bound);
    at 64 the device's work does (device-bound: launches queue up ahead of it)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, batch, 512, 1024, device="cuda", dtype=torch.bfloat16)
    return model, opt, x


def _issue_latencies(
    ident: Identity, steps: int = 12, batch: int = 8
) -> dict[str, dict[str, float]]:
    """What the ``issue-stall`` signal reads (per step: p50 and p99 of GPU start minus CPU
    launch over the step's timed ops, docs/detection.md) in the small transformer's
    step (``batch``: host- or device-bound), healthy and with the two faults the signal
    is meant for (``_train_step``). Medians over ``steps`` steps after 3 warm-up steps,
    µs, and the median step time, ms."""
    net = _small_transformer(batch)
    out: dict[str, dict[str, float]] = {}
    for fault in ("healthy", "stray synchronize", "host stall 20 ms"):
        rw = RankWatch(ident, SinkTransport(lambda kind, value: None), start=False)
        timer = CudaTimer(rw, torch.cuda)
        times = [_train_step(rw, timer, net, step, fault=fault) for step in range(3 + steps)]
        # no publisher thread and no close (which would send them): the notes of every
        # step but the last, whose end may still wait for the device
        notes = [n for n in rw.buffer.take_all()[2] if n["step"] >= 3 and n["issue"]]
        out[fault] = {
            "issue_p50_us": round(statistics.median(n["issue"]["p50_ns"] for n in notes) / 1e3, 1),
            "issue_p99_us": round(statistics.median(n["issue"]["p99_ns"] for n in notes) / 1e3, 1),
            "step_ms": round(statistics.median(times[3:]), 2),
            "steps": len(notes),
        }
    return out


def _voids(ident: Identity, steps: int = 12) -> dict[str, dict[str, float]]:
    """What ``void-high`` reads (docs/detection.md, section 3: the step's time no timed op
    covers) in the host-bound transformer step, healthy and with the 20-ms host stall,
    from the ``rank_steps`` summaries the publisher writes: medians over ``steps`` steps
    after 3 warm-up steps of ``max(v_hidden, v_minority)`` and of the step time."""
    net = _small_transformer()
    out: dict[str, dict[str, float]] = {}
    for fault in ("healthy", "host stall 20 ms"):
        sink = _Published()
        rw = RankWatch(ident, SinkTransport(sink))
        timer = CudaTimer(rw, torch.cuda)
        for step in range(3 + steps):
            _train_step(rw, timer, net, step, fault=fault)
        rw.close()
        items = [i for i in sink.rank_steps if i["step"] >= 3]
        ranks = [RankStep(ident.job, 0, ident.host, 0, 0, i) for i in items]
        signals = [s for rs in ranks for s in step_signals([rs])]
        out[fault] = {
            "void": round(statistics.median(max(s.v_hidden, s.v_minority) for s in signals), 3),
            "step_ms": round(1e3 * statistics.median(s.t_step for s in signals), 2),
            "steps": len(signals),
        }
    return out


def _long_steps(ident: Identity, steps: int = 4) -> dict[str, Any]:
    """Steps of ~0.3 s whose last op (the optimizer, a spinning kernel) is still running
    on the device at ``step_end`` (no synchronize before it, as in a loop that never
    waits for the device): longer than the hooks' batching window, so each step's
    message leaves at its end. How many of the 2 ops a step are published, and how many
    after the message that said their step was done (late records), and how many issue
    latencies each step's summary counts (its 2 ops')."""
    sink = _Published()
    rw = RankWatch(ident, SinkTransport(sink))
    timer = CudaTimer(rw, torch.cuda)
    x = torch.zeros(16, device="cuda")
    for step in range(steps):
        rw.step_begin(step)
        with timer.op("forward-compute", mb=0):
            x.add_(1.0)
        with timer.op("optimizer"):
            torch.cuda._sleep(600_000_000)
        rw.step_end()
        torch.cuda.synchronize()
        time.sleep(0.05)  # the publisher's round: the step's message leaves
    rw.close()
    counted = {item["step"]: (item.get("issue") or {}).get("n", 0) for item in sink.rank_steps}
    issues = [counted.get(step, 0) for step in range(steps)]
    return {"published": sink.records, "late": sink.late, "issue_latencies_per_step": issues}


def _drift_us(timer: CudaTimer) -> float:
    """Host time of a fresh event by the anchor, less the host clock read when it
    completed on an idle device: how far the two clocks moved apart since the anchor."""
    torch.cuda.synchronize()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    event.synchronize()
    host = timer.rw.clock.read()
    return round((timer.host_ns(event) - host) / 1000, 1)


def drift_study(seconds: float, every: float, reanchor_at: float) -> dict[str, Any]:
    """(seconds since a fresh anchor, drift µs) every ``every`` s for ``seconds``, the
    device idle between readings: how the device's clock moves against the host's, and
    how far the anchor's host times are off once a second anchor at ``reanchor_at`` s
    has measured the rate (``python3 benchmarks/check_cuda_timer.py --drift 180``)."""
    ident = Identity(job="gpu-check", host="gpu", rank=0, dp_rank=0, pp_rank=0)
    rw = RankWatch(ident, SinkTransport(lambda kind, value: None), start=False)
    timer = CudaTimer(rw, torch.cuda)
    began, out = time.monotonic(), []
    while time.monotonic() - began < seconds:
        time.sleep(every)
        if not timer.rate_measured and time.monotonic() - began >= reanchor_at:
            timer.anchor()
        out.append((round(time.monotonic() - began, 1), _drift_us(timer)))
    return {"rate_ppm": round((timer.rate - 1) * 1e6, 3), "drift_us": out}


def busy_anchor_study(seconds: float, every: float = 5.0, depth: int = 3) -> dict[str, Any]:
    """The anchor where the device is never idle: a loop that never waits for it keeps
    ``depth`` steps of spinning kernels (4 of ~10 ms a step) queued, so every step end
    finds ops pending. One timer times the ops and renews its anchor at its step ends
    (10 s, then every 30 s); another, made at the same moment, never renews (as the
    timer did before it anchored on its own stream). Every ``every`` s a probe event on
    a third, idle stream: its host time by each timer's anchor, less the host clock read
    as it completed. Also: how long each renewal kept the host waiting, and the ops'
    records (all there, in order, none overlapping, durations alike)
    (``python3 benchmarks/check_cuda_timer.py --busy-anchor 90``)."""
    ident = Identity(job="gpu-check", host="gpu", rank=0, dp_rank=0, pp_rank=0)
    rw = RankWatch(ident, SinkTransport(lambda kind, value: None), start=False)
    timer = CudaTimer(rw, torch.cuda, anchor_every_s=30.0)
    frozen = CudaTimer(
        RankWatch(ident, SinkTransport(lambda kind, value: None), start=False),
        torch.cuda,
        anchor_every_s=1e9,
        first_anchor_s=1e9,
    )
    probe_stream = torch.cuda.Stream()
    began, next_probe, step, records = time.monotonic(), every, 0, []
    waits, probes, marks = [], [], []
    while time.monotonic() - began < seconds:
        if len(marks) >= depth:
            marks.pop(0).synchronize()  # the queue stays `depth` steps deep, never empty
        anchored = timer._anchor_raw
        rw.step_begin(step)
        for mb in range(4):
            with timer.op("forward-compute", mb=mb):
                torch.cuda._sleep(20_000_000)
        rw.step_end()
        if timer._anchor_raw != anchored:
            at = round(time.monotonic() - began, 1)
            waits.append((at, len(timer.pending), timer.anchor_wait_ns / 1000))
        marks.append(torch.cuda.Event())
        marks[-1].record()
        records += rw.buffer.take()[0]
        step += 1
        if time.monotonic() - began >= next_probe:
            next_probe += every
            at = round(time.monotonic() - began, 1)
            probes.append((at, *_probe_us(probe_stream, timer, frozen)))
    torch.cuda.synchronize()
    timer.collect(reanchor=False)  # the last steps' ops, before close sends them away
    records += rw.buffer.take()[0]
    rw.close()
    first = min(r[6] for r in records)
    return {
        "steps": step,
        "rate_ppm": round((timer.rate - 1) * 1e6, 3),
        "renewals_s_pending_wait_us": waits,
        "probe_s_renewed_frozen_window_us": probes,
        "records": _records_check(records, 4 * step, first),
    }


def _probe_us(stream: Any, *timers: CudaTimer) -> list[float]:
    """An event on idle ``stream``: its host time by each timer, less the host clock
    read once it completed (µs each), then how long that took (µs)."""
    clock = timers[0].rw.clock
    event = torch.cuda.Event(enable_timing=True)
    t0 = clock.read()
    event.record(stream)
    event.synchronize()
    host = clock.read()
    return [round((t.host_ns(event) - host) / 1000, 1) for t in timers] + [(host - t0) / 1000]


def _records_check(records: list[Any], expected: int, origin: int) -> dict[str, Any]:
    """Whether every op is recorded, in order on the stream, none overlapping the next
    by more than 5 µs (each overlap: when, s after ``origin``, and by how many µs), and
    the durations off their median by more than 5% (s, ms)."""
    spans = sorted((r[6], r[6] + r[7]) for r in records)
    durations = sorted(r[7] for r in records)
    median = durations[len(durations) // 2] if durations else 0
    overlaps = [
        (round((b[0] - origin) / 1e9, 2), round((a[1] - b[0]) / 1000, 1))
        for a, b in itertools.pairwise(spans)
        if a[1] > b[0] + 5_000
    ]
    odd = [
        (round((start - origin) / 1e9, 2), round((end - start) / 1e6, 3))
        for start, end in spans
        if abs(end - start - median) > 0.05 * median
    ]
    return {
        "recorded": len(records),
        "expected": expected,
        "overlapping": overlaps,
        "median_ms": round(median / 1e6, 3),
        "durations_off_5pct": odd,
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--drift":
        print(json.dumps(drift_study(float(sys.argv[2]), every=5.0, reanchor_at=10.0)))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--busy-anchor":
        print(json.dumps(busy_anchor_study(float(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
