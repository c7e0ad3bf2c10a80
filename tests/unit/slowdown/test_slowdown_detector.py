"""Baselines, hysteresis and one alert per episode; the diagnosis names the cause."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rankwatch.streams.slowdown.detector import DetectorConfig, SlowdownDetector
from rankwatch.streams.slowdown.diagnosis import StragglerAlert, WhatIf, diagnose
from rankwatch.streams.slowdown.signals import Signals

HEALTHY = Signals(
    job="j",
    step=0,
    rank=0,
    host="h",
    dp_rank=0,
    pp_rank=0,
    start_ns=0,
    t_step=0.1,
    t_inter=0.001,
    v_inter=0.01,
    v_minority=0.05,
    throughput=320.0,
    flops_per_s=1e11,
    busbw=1e9,
    gc_s=0.0005,
    gc_count=1,
    data_wait_s=0.0,
    issue_p50_us=None,
    issue_p99_us=None,
)


JOB_WARM = DetectorConfig().job_warmup + 5
"""Healthy steps before a fault for the job's throughput to be judged."""
OPEN = DetectorConfig().open_after
"""Anomalous steps in a row that open an episode."""


def step(n: int, ranks: int = 4, **slow: Any) -> list[Signals]:
    """Step ``n`` of a 4-rank job; ``slow`` maps rank -> field overrides."""
    out = []
    for r in range(ranks):
        s = replace(HEALTHY, step=n, rank=r, dp_rank=r % 2, pp_rank=r // 2, start_ns=n * 10**8)
        out.append(replace(s, **slow.get(f"r{r}", {})))
    return out


def run(detector: SlowdownDetector, steps: list[list[Signals]]) -> list[Any]:
    alerts = []
    for signals in steps:
        alerts += detector.observe(signals)[1]
    return alerts


def test_healthy_job_never_alerts() -> None:
    assert run(SlowdownDetector(), [step(n) for n in range(50)]) == []


def test_one_episode_one_alert_naming_the_rank() -> None:
    slow = {"r1": {"flops_per_s": 3e10}}
    steps = [step(n) for n in range(10)]
    steps += [step(n, **slow) for n in range(10, 10 + OPEN + 5)]
    steps += [step(n) for n in range(10 + OPEN + 5, 10 + OPEN + 15)]
    alerts = run(SlowdownDetector(), steps)
    fired = 10 + OPEN - 1  # the OPEN-th anomalous step in a row
    assert [(a.kind, a.state, a.step, a.ranks) for a in alerts] == [
        ("flops-drop", "firing", fired, (1,)),
        ("flops-drop", "resolved", fired + 8, (1,)),  # the third normal one
    ]
    assert alerts[0].alert_id == alerts[1].alert_id == f"flops-drop:j:{fired}"
    message = alerts[0].message()
    assert message["version"] == 2 and message["evidence"]["value"] == 3e10
    assert message["evidence"]["baseline"] == 1e11


def test_flapping_does_not_open_an_episode() -> None:
    slow = {"r1": {"flops_per_s": 3e10}}
    steps = [step(n) for n in range(10)]
    steps += [step(n, **slow) if n % OPEN else step(n) for n in range(10, 40)]  # OPEN - 1 in a row
    assert run(SlowdownDetector(), steps) == []


def test_the_fault_does_not_become_its_own_baseline() -> None:
    slow = {"r1": {"busbw": 5e7}, "r3": {"busbw": 5e7}}  # a slow link under one DP group
    steps = [step(n) for n in range(10)] + [step(n, **slow) for n in range(10, 100)]
    alerts = run(SlowdownDetector(), steps)
    assert [(a.kind, a.state, a.ranks) for a in alerts] == [("bandwidth-drop", "firing", (1, 3))]


def test_a_signal_swinging_between_two_levels_keeps_both_in_its_baseline() -> None:
    """Loopback all-reduce bandwidth on shared cores sits near 400 or near 40 MB/s, in
    runs of a few steps (a healthy study run raised bandwidth-drop when only the high
    level counted): the low level, seen often outside an episode, is normal."""
    low = {"r3": {"busbw": 3.5e7}}
    high = {"r3": {"busbw": 4e8}}
    steps = [step(n, **high) for n in range(5)]
    steps += [step(n, **(low if n % 5 < 3 else high)) for n in range(5, 40)]  # 3 low, 2 high
    longer = range(40, 41 + OPEN)
    steps += [step(n, **low) for n in longer]  # then a low run long enough to open
    assert run(SlowdownDetector(), steps) == []
    # the same long run after only high steps is a drop
    only_high = [step(n, **high) for n in range(40)] + [step(n, **low) for n in longer]
    assert [a.kind for a in run(SlowdownDetector(), only_high)] == ["bandwidth-drop"]


def test_shares_alert_above_floor_and_baseline() -> None:
    d = SlowdownDetector(DetectorConfig())
    steps = [step(n) for n in range(10)]
    at = 10 + OPEN
    steps += [step(n, r2={"gc_s": 0.02}) for n in range(10, at)]  # 20% of 0.1 s
    steps += [step(n, r0={"data_wait_s": 0.03}) for n in range(at, at + OPEN)]
    steps += [
        step(n, r3={"t_inter": 0.04, "v_inter": 0.4}) for n in range(at + OPEN, at + 2 * OPEN)
    ]
    kinds = {(a.kind, a.ranks) for a in run(d, steps) if a.state == "firing"}
    assert kinds == {("gc-pauses", (2,)), ("dataloader-bound", (0,)), ("void-high", (3,))}


def _rows(steps: list[list[Signals]], detector: SlowdownDetector) -> list[dict[str, Any]]:
    rows = []
    for signals in steps:
        open_now, _ = detector.observe(signals)
        for s in signals:
            rows.append({**vars(s), "anomalies": open_now.get(s.rank, [])})
    return rows


def test_diagnosis_names_cause_and_ranks() -> None:
    compute = [step(n) for n in range(10)]
    compute += [step(n, r1={"flops_per_s": 3e10, "t_step": 0.2}) for n in range(10, 13 + OPEN)]
    d = diagnose("j", _rows(compute, SlowdownDetector()))
    assert (d.cause, d.ranks) == ("straggler compute", [1])
    assert "FLOP/s: 100 GFLOP/s -> 30 GFLOP/s (0.3x)" in d.text()
    slow = {f"r{r}": {"busbw": 5e7} for r in range(4)}
    network = [step(n) for n in range(10)] + [step(n, **slow) for n in range(10, 13 + OPEN)]
    d = diagnose("j", _rows(network, SlowdownDetector()))
    assert (d.cause, d.ranks, d.everyone) == ("everyone-slow network", [0, 1, 2, 3], True)


def test_diagnosis_without_signals_falls_back_on_the_whatif() -> None:
    rows = _rows([step(n) for n in range(10)], SlowdownDetector())
    assert diagnose("j", rows).cause == "healthy"
    assert diagnose("j", rows, WhatIf(1.3, 10, "worker 1,0")).cause == "stragglers"


def test_a_cause_wins_over_its_symptoms() -> None:
    """GC pauses on rank 2 that also slow rank 0's and 2's compute (shared cores): GC,
    even though flops-drop is open on more rank-steps."""
    gc_run = [step(n) for n in range(10)]
    slow = {"gc_s": 0.02, "flops_per_s": 3e10}
    gc_run += [
        step(n, r0={"flops_per_s": 3e10}, r2=slow if n < 11 + OPEN else {"flops_per_s": 3e10})
        for n in range(10, 19 + OPEN)
    ]
    d = diagnose("j", _rows(gc_run, SlowdownDetector()))
    assert (d.cause, d.ranks) == ("GC", [2])
    assert any(line.startswith("also open: flops-drop") for line in d.lines)


def _issue_stalls(until: int) -> list[list[Signals]]:
    """Steps 0 to ``until`` - 1: p99 issue latency 20 µs on every rank, and 500 µs on
    rank 2 from step 10 on."""
    healthy = {f"r{r}": {"issue_p99_us": 20.0} for r in range(4)}
    stalled = {**healthy, "r2": {"issue_p99_us": 500.0}}
    return [step(n, **(stalled if n >= 10 else healthy)) for n in range(until)]


def test_issue_stalls_are_judged_only_when_asked() -> None:
    """Off by default (docs/detection.md, section 3: the signal did not follow the
    faults on an H100); on, a p99 four times its baseline and 100 µs over it opens an
    episode like any other kind."""
    steps = _issue_stalls(13 + OPEN)
    assert run(SlowdownDetector(), steps) == []
    alerts = run(SlowdownDetector(DetectorConfig(issue_stall=True)), steps)
    assert [(a.kind, a.state, a.ranks) for a in alerts] == [("issue-stall", "firing", (2,))]


def test_an_issue_stall_taken_over_from_a_worker_that_judged_it_resolves() -> None:
    """A job handed over mid-episode by a worker with ``issue_stall`` on, to one with it
    off: the alert does not stay firing for ever."""
    before = SlowdownDetector(DetectorConfig(issue_stall=True))
    run(before, _issue_stalls(11 + OPEN))
    state = before.state("j")
    assert state is not None and [a["kind"] for a in state["alerts"]] == ["issue-stall"]
    after = SlowdownDetector()
    after.load("j", state)
    alerts = run(after, _issue_stalls(12 + OPEN)[11 + OPEN :])
    assert [(a.kind, a.state) for a in alerts] == [("issue-stall", "resolved")]
    assert all(t["kind"] != "issue-stall" for t in after.state("j")["tracks"])  # type: ignore[index]


def _noisy(n: int, rank: int, factor: float = 1.0) -> dict[str, Any]:
    """A rank's FLOP/s on a shared host: a factor of noise around 1e10 (from 0.6 to 1.6,
    a fixed pattern so the test is exact), times ``factor``."""
    pattern = (1.0, 0.6, 1.4, 0.8, 1.6, 0.7, 1.2, 0.9, 1.5, 1.1)
    return {"flops_per_s": 1e10 * pattern[(n + rank) % len(pattern)] * factor}


def test_a_dip_inside_the_ranks_own_noise_band_is_not_an_anomaly() -> None:
    """Under half the usual FLOP/s, for longer than opens an episode, is under the 0.55
    ratio but within two robust deviations of this noisy rank's history (its lower edge
    is at 0.46e10): a quiet-GPU ratio is not a shared host's noise band. A drop to a
    fifth is outside it."""
    base = [step(n, r2=_noisy(n, 2)) for n in range(30)]
    dip = [step(n, r2={"flops_per_s": 0.5e10}) for n in range(30, 31 + OPEN)]
    after = [step(n, r2=_noisy(n, 2)) for n in range(31 + OPEN, 45 + OPEN)]
    assert run(SlowdownDetector(), base + dip + after) == []
    drop = [step(n, r2=_noisy(n, 2, 0.2)) for n in range(30, 33 + OPEN)]
    assert [(a.kind, a.state, a.ranks) for a in run(SlowdownDetector(), base + drop)] == [
        ("flops-drop", "firing", (2,))
    ]


def test_a_symptom_is_not_alerted_beside_its_cause() -> None:
    """GC pauses on rank 2 lower its FLOP/s; a slow link of rank 3 lowers the compute of
    rank 1, its pipeline neighbour; either way the job's throughput drops: one alert, for
    the cause, while the rows still carry every open episode."""
    faults = {
        "gc-pauses": {"r2": {"gc_s": 0.03, "flops_per_s": 2e10}},
        "bandwidth-drop": {"r3": {"busbw": 1e7}, "r1": {"flops_per_s": 2e10}},
    }
    for cause, ranks in faults.items():
        fault = {f"r{r}": {"throughput": 100.0, **ranks.get(f"r{r}", {})} for r in range(4)}
        steps = [step(n) for n in range(JOB_WARM)]
        steps += [step(n, **fault) for n in range(JOB_WARM, JOB_WARM + OPEN + 3)]
        detector = SlowdownDetector()
        assert [a.kind for a in run(detector, steps)] == [cause]
        open_now, _ = detector.observe(step(JOB_WARM + OPEN + 3, **fault))
        flagged = {k for kinds in open_now.values() for k in kinds}
        assert {"flops-drop", "throughput-drop"} <= flagged  # diagnose reads the rows


def test_the_jobs_throughput_alerts_when_no_rank_says_why() -> None:
    steps = [step(n) for n in range(JOB_WARM)]
    slower = {f"r{r}": {"throughput": 100.0} for r in range(4)}
    steps += [step(n, **slower) for n in range(JOB_WARM, JOB_WARM + OPEN + 3)]
    assert [(a.kind, a.ranks) for a in run(SlowdownDetector(), steps)] == [
        ("throughput-drop", (-1,))
    ]


def test_the_jobs_throughput_is_not_judged_against_its_first_steps() -> None:
    """A job's first steps run at no level it keeps (a busy held-out run: 5 steps near
    270 samples/s, then 135 for the rest, was alerted for 180 steps): its throughput is
    judged only once ``job_warmup`` steps make its baseline."""
    fast = {f"r{r}": {"throughput": 700.0} for r in range(4)}
    steps = [step(n, **fast) for n in range(5)] + [step(n) for n in range(5, 60)]
    assert run(SlowdownDetector(), steps) == []
    assert [a.kind for a in run(SlowdownDetector(DetectorConfig(job_warmup=5)), steps)] == [
        "throughput-drop"
    ]


def test_a_fast_spell_does_not_become_the_jobs_yardstick() -> None:
    """Thirty steps at over twice the job's usual speed (a busy host's spare core), then back
    to it: against the last 20 steps the return reads as a drop; against the job's last
    ``job_window`` healthy steps it is the job's usual speed."""
    fast = {f"r{r}": {"throughput": 700.0} for r in range(4)}
    steps = [step(n) for n in range(80)] + [step(n, **fast) for n in range(80, 110)]
    steps += [step(n) for n in range(110, 140)]
    assert run(SlowdownDetector(), steps) == []
    short = DetectorConfig(job_window=20)
    assert [a.kind for a in run(SlowdownDetector(short), steps)] == ["throughput-drop"]


def test_what_every_rank_feels_at_once_is_not_one_ranks_fault() -> None:
    """A load on the shared host slows every rank's compute together (the healthy study
    runs' FLOP/s false alarms): no rank's flops-drop is alerted, for each fell no more
    than its peers did; the job's throughput says it, and the rows keep every rank's
    episode, so the diagnosis is "everyone-slow compute". A rank that falls further
    still is named."""
    every = {f"r{r}": {"flops_per_s": 3e10, "throughput": 100.0} for r in range(4)}
    steps = [step(n) for n in range(JOB_WARM)]
    steps += [step(n, **every) for n in range(JOB_WARM, JOB_WARM + OPEN + 3)]
    detector = SlowdownDetector()
    assert [(a.kind, a.ranks) for a in run(detector, steps)] == [("throughput-drop", (-1,))]
    assert diagnose("j", _rows(steps, SlowdownDetector())).cause == "everyone-slow compute"
    further = {**every, "r2": {"flops_per_s": 0.6e10, "throughput": 100.0}}
    steps = [step(n) for n in range(10)] + [step(n, **further) for n in range(10, 13 + OPEN)]
    assert [(a.kind, a.ranks) for a in run(SlowdownDetector(), steps)] == [("flops-drop", (2,))]


def test_a_slow_half_of_the_job_is_still_judged_against_the_other_half() -> None:
    """Two ranks of four slowed (DP rank 1 in both stages): each one's peers' median is
    the healthy ranks', so the drop stands; in a two-rank job the peer is the other
    rank. A whole slow stage is under no peer doing its work: the straggler rule
    (which compares stages) names it, not flops-drop, and diagnose takes its alert."""
    dp1 = {"r1": {"flops_per_s": 3e10}, "r3": {"flops_per_s": 3e10}}
    steps = [step(n) for n in range(10)] + [step(n, **dp1) for n in range(10, 13 + OPEN)]
    assert [(a.kind, a.ranks) for a in run(SlowdownDetector(), steps)] == [("flops-drop", (1, 3))]
    two = [step(n, ranks=2) for n in range(10)]
    two += [step(n, ranks=2, r1={"flops_per_s": 3e10}) for n in range(10, 13 + OPEN)]
    assert [(a.kind, a.ranks) for a in run(SlowdownDetector(), two)] == [("flops-drop", (1,))]
    stage = {"r2": {"flops_per_s": 3e10}, "r3": {"flops_per_s": 3e10}}
    steps = [step(n) for n in range(10)] + [step(n, **stage) for n in range(10, 13 + OPEN)]
    detector = SlowdownDetector()
    assert run(detector, steps) == []
    alert = StragglerAlert("stage", "1", "compute", [2, 3], ["h"], True)
    assert diagnose("j", _rows(steps, SlowdownDetector()), straggler=alert).ranks == [2, 3]


def test_a_rank_back_among_its_peers_is_not_slow() -> None:
    """A rank that ran alone on a core for the job's first steps (4x its stage peer's
    FLOP/s) and then shares one like its peer has fallen against its own past, but not
    against the rank doing its work: no alert (a busy tuning run's false alarm)."""
    early = [step(n, r1={"flops_per_s": 4e11}) for n in range(12)]
    later = [step(n) for n in range(12, 40)]
    assert run(SlowdownDetector(), early + later) == []


def test_the_peer_verdict_travels_with_the_state() -> None:
    """A worker taking the job over mid-episode goes on with the same alert, once."""
    slow = {"r1": {"flops_per_s": 3e10}}
    split = 11 + OPEN
    steps = [step(n) for n in range(10)] + [step(n, **slow) for n in range(10, split)]
    first = SlowdownDetector()
    assert [a.kind for a in run(first, steps)] == ["flops-drop"]
    second = SlowdownDetector()
    second.load("j", first.state("j") or {})
    more = [step(n, **slow) for n in range(split, split + 4)]
    more += [step(n) for n in range(split + 4, split + 9)]
    assert [(a.kind, a.state) for a in run(second, more)] == [("flops-drop", "resolved")]


def test_a_rank_falling_alone_against_its_past_is_not_in_its_rows() -> None:
    """What the rows hold is what diagnose and the boards read: the episode of a rank
    back level with its stage peer is not there (diagnose said "straggler compute" of
    a healthy job), the job-wide fall is, on every rank."""
    early = [step(n, r1={"flops_per_s": 4e11}) for n in range(12)]
    rows = _rows(early + [step(n) for n in range(12, 40)], SlowdownDetector())
    assert not any(r["anomalies"] for r in rows)
    every = {f"r{r}": {"flops_per_s": 3e10} for r in range(4)}
    rows = _rows(
        [step(n) for n in range(10)] + [step(n, **every) for n in range(10, 13 + OPEN)],
        SlowdownDetector(),
    )
    assert {r["rank"] for r in rows if "flops-drop" in r["anomalies"]} == {0, 1, 2, 3}


def test_rows_of_a_restored_detector_are_those_of_an_uninterrupted_one() -> None:
    """Restored from its stored rows mid-episode (a rank standing out, and a job-wide
    fall that stands for no rank alone), the detector goes on with the same rows and
    alerts as one that never stopped."""
    alone = {"r1": {"flops_per_s": 3e10}}
    every = {f"r{r}": {"busbw": 5e7} for r in range(4)}
    for fault in (alone, every):
        steps = [step(n) for n in range(10)] + [step(n, **fault) for n in range(10, 30)]
        whole = SlowdownDetector()
        seen = [whole.observe(s) for s in steps]
        before = SlowdownDetector()
        stored = [(s, before.observe(s)[0]) for s in steps[:22]]
        firing = [a.message() for _, alerts in seen[:22] for a in alerts if a.state == "firing"]
        after = SlowdownDetector()
        after.restore(stored[-15:], firing)
        assert [after.observe(s) for s in steps[22:]] == seen[22:]
