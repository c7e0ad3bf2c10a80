"""Minder on a live stream: one job's metrics in, scores, faults and alerts out.

Pure: samples are handed in, rows and messages handed back; the faust agent
(``rankwatch.streams.minder.worker``) only moves them.

Every ``stride_s`` seconds of stream time (once the job's newest sample is ``lag_s``
past the window's end, so late samples still count and a backlog replays exactly as
it ran; a job whose hosts all fall silent is no longer evaluated: silence is the hang
detector's business) the last ``window_s`` seconds of every host are put on a
1-second grid by timestamp (the last sample at or before each point, if at most
``max_gap_s`` old), normalised per metric by ``high`` and scored. Only
the hosts with a sample for every point are compared: a host that joined during the
window, fell silent or has a longer gap sits the window out (nothing is invented for
it), its continuity counts kept as they were.

``high`` is the largest value of the machines' median over the window (at least the
metric's idle level): a scale the typical machine sets, so that one machine's burst (a
starved rank catching up) cannot squash the others into a corner of [0, 1]. Pairwise
scoring clips to [0, 1] (the denoisers were trained there); residual scoring keeps
values above ``high``, or a host rising above a level every other host holds would
equal them after the clip.

Residual scoring (an option, ``docs/minder.md``, "Residual scoring on the live
stream"): per host and metric, the RMS over the window of its peer residual (value
minus the hosts' median) standardised by the host's own usual residual, learnt from
the stream (``residual.LiveBaselines``); the host is a candidate when the mean over
the metrics it is warm in exceeds ``threshold``.

Continuity is counted across evaluations per host (residual scoring) or per (metric,
host), the first metric in priority order that confirms a host naming it (pairwise). A
host's episode opens with one firing alert and closes with one resolved alert after
``resolve_after`` evaluations without confirmation (a host that stopped reporting is
not confirmed either; its resolved alert says so). See ``docs/minder.md``.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.schemas.tables import table_row
from rankwatch.streams.kit.versions import row_version
from rankwatch.streams.minder.blend import SCORE_CAP
from rankwatch.streams.minder.detector import FUSED, MinderConfig, MinderModel, metric_scores
from rankwatch.streams.minder.grid import align_on_times
from rankwatch.streams.minder.liveblend import LiveBlend
from rankwatch.streams.minder.peers import peer_deviation
from rankwatch.streams.minder.residual import LiveBaselines, window_summaries

NS = 1_000_000_000
# Below these levels a metric counts as idle: its bound never drops under them, so
# that the noise of an idle metric is not stretched to fill [0, 1].
IDLE_LEVELS = (
    # A process that shares its core with one CPU-bound neighbour is preempted once per
    # scheduler slice (about 3 ms: CFS's minimum granularity on 8+ CPUs, EEVDF's base
    # slice), some 300 times a second. Far below that, preemptions are the box's
    # background (an interrupt, a kernel thread, a neighbour waking) and say nothing
    # about the machine: a healthy rank preempted a few times a second more than its
    # peers once raised a false alarm here (docs/minder.md, "Idle levels").
    (re.compile(r"switches_ps$"), 300.0),
    (re.compile(r"(util|wait|iowait|_pct)$"), 10.0),  # percent
    (re.compile(r"_Bps$"), 1e5),  # bytes per second
    (re.compile(r"_ps$|_pps$"), 10.0),  # events per second
    (re.compile(r"bytes$"), 1e6),
)


FUSED_ROW = "fused"
"""The ``machine_scores`` metric of a host's fused residual score (blend: its score)."""
OWN_ROW = "own history"
PEERS_ROW = "peers"
"""Blend scoring's two halves in ``machine_scores``, each in the host's own unit."""


def covers(times: NDArray[np.int64], grid: NDArray[np.int64], max_age: int) -> bool:
    """Whether a host's samples (sorted) give every grid point one at most ``max_age``
    old."""
    idx = np.searchsorted(times, grid, side="right") - 1
    if times.size == 0 or idx[0] < 0:
        return False
    return bool((grid - times[idx] <= max_age).all())


def idle_level(name: str) -> float:
    return next((level for pattern, level in IDLE_LEVELS if pattern.search(name)), 1e-9)


@dataclass(frozen=True)
class OnlineConfig:
    window_s: int = 60
    stride_s: int = 60
    continuity: int = 4
    threshold: float = 3.0
    floor: float = 0.02
    lag_s: int = 2
    min_machines: int = 4
    """Fewer hosts than this: nothing to compare, no evaluation."""
    resolve_after: int = 3
    max_gap_s: int = 5
    """A host's sample stands for the grid points up to this long after it; a point
    with no sample that recent is missing and the host sits the window out."""
    scoring: str = "pairwise"
    """"pairwise" (the default): the paper's per-metric score, first confirming metric
    names the host; "residual": each host's peer residual against its own usual one,
    learnt from the stream, fused over metrics (``docs/minder.md``, "Residual scoring on
    the live stream"). Residual scoring is not the default: a phase every host goes
    through together (a checkpoint, an evaluation) makes every host fire
    (``docs/minder.md``, "Known limits of live residual scoring"); "blend": the offline
    default detector (``liveblend``), a host against its own admitted windows and
    against its peers, each in units of its own ``quantile`` (``threshold`` is not read:
    1 is the unit)."""
    quantile: float = 0.95
    """Blend scoring: each half's unit is the host's own quantile of its past scores."""
    blend_history: int = 90
    """Blend scoring: admitted windows per host its own reference is fit on, and recent
    windows the peer-metric rule reads."""
    fuse_metrics: int = 0
    """Residual scoring: how many metrics in priority order are fused (0: all)."""
    single_threshold: float = 0.0
    """Residual scoring: a host is also a candidate when one metric alone scores above
    this (0: never; only the fused mean counts)."""
    warmup: int = 4
    """Residual scoring: admitted windows before a host is scored in a metric."""
    lag: int = 2
    """Residual scoring: windows before a window's summary may enter the baseline."""
    history: int = 32
    """Residual scoring: admitted windows kept per host and metric."""
    normalise: bool = True
    """Scale each metric by the typical host's level (at least its idle level); False
    for values already in [0, 1] (a replayed labelled group)."""


@dataclass
class Episode:
    host: str
    first_seen_ns: int
    metric: str
    score: float
    alert_id: str
    misses: int = 0


@dataclass
class MonitorOutput:
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(table, []).append(row)


class JobMonitor:
    def __init__(self, job: str, config: OnlineConfig, model: MinderModel | None = None) -> None:
        self.job, self.config, self.model = job, config, model
        self.samples: dict[str, deque[tuple[int, Mapping[str, float]]]] = {}
        self.runs: dict[tuple[str, str], int] = {}
        self.episodes: dict[str, Episode] = {}
        self.next_end_ns: int | None = None
        self.newest_ns = 0
        self.late = 0
        self.baselines = self.fresh_baselines()
        self.blend = self.fresh_blend()
        self.generation = 0
        """The consumer group's generation of the worker's assignment (0: no group): in
        each row's version, so a later owner's rows win (``kit/versions.py``)."""
        self.unscored = ""
        """Why the latest window scored nothing ("" when it scored): said in the
        worker's status and log, so that a job Minder cannot judge is not silent."""

    def fresh_baselines(self) -> LiveBaselines:
        """Residual scoring's baselines, empty: every host warms up."""
        cfg = self.config
        return LiveBaselines(
            history=cfg.history,
            warmup=cfg.warmup,
            lag=cfg.lag,
            floor=cfg.floor,
            stride_ns=cfg.stride_s * NS,
        )

    def fresh_blend(self) -> LiveBlend:
        """Blend scoring's rings, empty: every host warms up."""
        cfg = self.config
        lag = max(cfg.lag, cfg.continuity - 1)  # a confirmed run's first window still pending
        return LiveBlend(
            history=cfg.blend_history, warmup=cfg.warmup, lag=lag, quantile=cfg.quantile
        )

    def add(self, host: str, ts_ns: int, metrics: Mapping[str, float]) -> None:
        if self.next_end_ns is not None and ts_ns < self.next_end_ns - self.config.window_s * NS:
            self.late += 1
            return
        self.samples.setdefault(host, deque()).append((ts_ns, metrics))
        self.newest_ns = max(self.newest_ns, ts_ns)
        if self.next_end_ns is None:
            # the first window ends on a stride boundary, a full window after the first sample
            stride = self.config.stride_s * NS
            self.next_end_ns = -(-(ts_ns + self.config.window_s * NS) // stride) * stride

    def evaluate(self) -> MonitorOutput:
        """Every window whose end (plus the lag) the stream has passed, oldest first."""
        out = MonitorOutput()
        lag = self.config.lag_s * NS
        while self.next_end_ns is not None and self.newest_ns >= self.next_end_ns + lag:
            self._evaluate_window(self.next_end_ns, out)
            self.next_end_ns += self.config.stride_s * NS
            self._trim(self.next_end_ns - self.config.window_s * NS)
        return out

    def _trim(self, keep_from_ns: int) -> None:
        for host, q in list(self.samples.items()):
            while len(q) > 1 and q[1][0] <= keep_from_ns:
                q.popleft()  # keep one sample before the window, to carry forward
            if q and q[-1][0] < keep_from_ns - self.config.window_s * NS:
                del self.samples[host]  # silent for a whole window: not compared

    def _window(self, end_ns: int) -> tuple[list[str], list[str], np.ndarray] | None:
        """The hosts that cover the window, the metrics they share, and their
        normalised x_MTK (NaN where a host's sample lacks a metric)."""
        start = end_ns - self.config.window_s * NS
        grid = start + NS * np.arange(1, self.config.window_s + 1, dtype=np.int64)
        max_age = self.config.max_gap_s * NS
        hosts, times, rows = [], [], []
        for h in sorted(self.samples):
            r = [(t, m) for t, m in self.samples[h] if t <= end_ns]
            t = np.array([t for t, _ in r], dtype=np.int64)
            if covers(t, grid, max_age):
                hosts.append(h)
                times.append(t)
                rows.append([m for _, m in r])
        if len(hosts) < self.config.min_machines:
            self.unscored = (
                f"{len(hosts)} of {len(self.samples)} machines sending metrics cover the"
                f" window; Minder compares machines with their peers and needs at least"
                f" {self.config.min_machines}"
            )
            return None
        shared = set.intersection(*(set(r[-1]) for r in rows))
        metrics = sorted(shared)
        if not metrics:
            self.unscored = "the machines share no metric name"
            return None
        known = set(self.model.metrics) if self.model is not None else set(metrics)
        if not known & shared:
            assert self.model is not None
            self.unscored = (
                f"the model knows none of the machines' metrics (model: "
                f"{', '.join(sorted(known)[:4])}...; machines: {', '.join(metrics[:4])}...):"
                f" train one on these metrics"
            )
            return None
        self.unscored = ""
        values = [np.array([[m.get(k, np.nan) for k in metrics] for m in r]) for r in rows]
        x = align_on_times(times, values, grid, max_age)
        return hosts, metrics, self._normalised(metrics, x)

    def _normalised(self, metrics: list[str], x_MTK: np.ndarray) -> np.ndarray:
        """Each metric over its unit (module docstring; blend: ``LiveBlend.high``)."""
        if not self.config.normalise:
            return x_MTK
        idle = np.array([idle_level(k) for k in metrics])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a metric missing everywhere
            median_TK = np.nanmedian(x_MTK, axis=0)
            level = np.nanmedian(median_TK, axis=0)  # the window's, robust to a burst
            typical = np.nan_to_num(np.nanmax(median_TK, axis=0))  # (K,)
        if self.config.scoring == "blend":
            return np.maximum(x_MTK / self.blend.high(metrics, level, idle), 0.0)
        high = np.maximum(typical, idle)
        if self.config.scoring == "residual":
            return np.maximum(x_MTK / high, 0.0)  # above the typical: kept
        return np.clip(x_MTK / high, 0.0, 1.0)

    def _model_for(self, metrics: list[str]) -> MinderModel:
        if self.model is None:
            return MinderModel(metrics=tuple(metrics))
        known = self.model
        return MinderModel(
            metrics=tuple(metrics),
            denoisers={k: v for k, v in known.denoisers.items() if k in metrics},
            priority=tuple(p for p in known.priority if p in metrics)
            + tuple(m for m in metrics if m not in known.priority),
            thresholds={k: v for k, v in known.thresholds.items() if k in metrics},
        )

    def _evaluate_window(self, end_ns: int, out: MonitorOutput) -> None:
        window = self._window(end_ns)
        if window is None:
            return
        hosts, metrics, x = window
        model = self._model_for(metrics)
        if self.config.scoring == "residual":
            self._evaluate_residual(end_ns, hosts, metrics, model, x, out)
            return
        if self.config.scoring == "blend":
            self._evaluate_blend(end_ns, hosts, metrics, x, out)
            return
        if self.config.scoring != "pairwise":
            raise ValueError(f"unknown scoring {self.config.scoring!r}")
        cfg = self.config
        detector = MinderConfig(window=cfg.window_s, stride=cfg.window_s, floor=cfg.floor)
        scores = metric_scores(x, model, detector)[:, 0, :]  # (K, M)
        named: dict[str, tuple[str, float]] = {}  # host -> (metric, score)
        for k in model.order():
            decided = bool(named)  # an earlier metric already named the faulty hosts
            metric = metrics[k]
            threshold = model.thresholds.get(metric, cfg.threshold)
            for m, host in enumerate(hosts):
                if np.isnan(scores[k, m]):
                    continue  # not compared in this metric: its count stays
                hit = bool(scores[k, m] > threshold)
                run = self.runs.get((metric, host), 0) + 1 if hit else 0
                self.runs[(metric, host)] = run
                if run >= cfg.continuity and not decided:
                    named[host] = (metric, float(scores[k, m]))
                score = float(scores[k, m])
                out.add(
                    "machine_scores",
                    table_row(
                        "machine_scores", job=self.job, host=host, time=end_ns,
                        metric=metric, score=score, candidate=int(hit),
                    ),
                )  # fmt: skip
        self._episodes(named, set(hosts), end_ns, out)

    def _residual_scores(
        self, hosts: list[str], metrics: list[str], x_MTK: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(M, K) each: every host's residual score per metric (NaN where it still
        warms up), and the window's residual summaries for the baselines."""
        r_MTK = np.stack([peer_deviation(x_MTK[:, :, k]) for k in range(len(metrics))], axis=2)
        med_MK, mad_MK = window_summaries(r_MTK)
        loc_MK, scale_MK = self.baselines.levels(hosts, metrics)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN: warming up, or lacking
            z = (r_MTK - loc_MK[:, None, :]) / scale_MK[:, None, :]
            s_MK = np.minimum(np.sqrt(np.mean(z * z, axis=1)), SCORE_CAP)  # NaN stays NaN
        return s_MK, med_MK, mad_MK

    def _evaluate_blend(
        self,
        end_ns: int,
        hosts: list[str],
        metrics: list[str],
        x_MTK: np.ndarray,
        out: MonitorOutput,
    ) -> None:
        """Blend scoring: the offline default detector with yardsticks from the
        stream (``liveblend``); a candidate above 1, the host's own unit."""
        cfg = self.config
        index = end_ns // (cfg.stride_s * NS)
        s_MK, med_MK, mad_MK = self._residual_scores(hosts, metrics, x_MTK)
        scores = self.blend.score(index, hosts, metrics, x_MTK, s_MK)
        named: dict[str, tuple[str, float]] = {}
        candidates: set[str] = set()
        for m in np.flatnonzero(np.isfinite(scores.score_M)).tolist():
            host, score = hosts[m], float(scores.score_M[m])
            hit = score > 1.0
            run = self.runs.get((FUSED, host), 0) + 1 if hit else 0
            self.runs[(FUSED, host)] = run  # a host not scored keeps its count
            if hit:
                candidates.add(host)
            if run >= cfg.continuity:
                named[host] = (scores.top[m], score)
            for name, half in ((OWN_ROW, scores.own_M[m]), (PEERS_ROW, scores.peer_M[m])):
                if not math.isnan(half):
                    out.add("machine_scores", self._score_row(host, end_ns, name, float(half), hit))
            out.add("machine_scores", self._score_row(host, end_ns, FUSED_ROW, score, hit))
        self._episodes(named, set(hosts), end_ns, out)
        self.baselines.observe(
            index, hosts, metrics, med_MK, mad_MK, candidates, set(self.episodes)
        )
        self.blend.observe(index, candidates, set(self.episodes))

    def _evaluate_residual(
        self,
        end_ns: int,
        hosts: list[str],
        metrics: list[str],
        model: MinderModel,
        x_MTK: np.ndarray,
        out: MonitorOutput,
    ) -> None:
        """Residual scoring: per host and metric, the RMS over the window of its peer
        residual standardised by its own baseline; the host's fused score is the mean
        over the fused metrics it is warm in."""
        cfg, base = self.config, self.baselines
        all_MK, med_MK, mad_MK = self._residual_scores(hosts, metrics, x_MTK)
        order = model.order()
        fused_k = np.array(sorted(order[: cfg.fuse_metrics] if cfg.fuse_metrics else order))
        s_MK = all_MK[:, fused_k]  # NaN where not scored
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN: warming up, or lacking
            fused_M = np.nanmean(s_MK, axis=1)  # over the metrics each host is warm in
        threshold = model.thresholds.get(FUSED, cfg.threshold)
        top_M = np.argmax(np.nan_to_num(s_MK, nan=-np.inf), axis=1)
        top_score_M = s_MK[np.arange(len(hosts)), top_M] if fused_k.size else fused_M
        hit_M = (fused_M > threshold) | (
            (cfg.single_threshold > 0) & (top_score_M > cfg.single_threshold)
        )
        named: dict[str, tuple[str, float]] = {}
        candidates: set[str] = set()
        fused_names = [metrics[k] for k in fused_k]
        scored_rows = s_MK.tolist()  # plain floats: the loop below runs once per host
        for m in np.flatnonzero(np.isfinite(fused_M)).tolist():
            host, fused, hit = hosts[m], float(fused_M[m]), bool(hit_M[m])
            run = self.runs.get((FUSED, host), 0) + 1 if hit else 0
            self.runs[(FUSED, host)] = run  # a host not scored keeps its count
            if hit:
                candidates.add(host)
            if run >= cfg.continuity:
                named[host] = (fused_names[int(top_M[m])], fused)
            for name, score in zip(fused_names, scored_rows[m], strict=True):
                if not math.isnan(score):  # warm in this metric
                    out.add("machine_scores", self._score_row(host, end_ns, name, score, hit))
            out.add("machine_scores", self._score_row(host, end_ns, FUSED_ROW, fused, hit))
        self._episodes(named, set(hosts), end_ns, out)
        index = end_ns // (cfg.stride_s * NS)
        base.observe(index, hosts, metrics, med_MK, mad_MK, candidates, set(self.episodes))

    def _score_row(
        self, host: str, end_ns: int, metric: str, score: float, hit: bool
    ) -> dict[str, Any]:
        return table_row(
            "machine_scores", job=self.job, host=host, time=end_ns,
            metric=metric, score=score, candidate=int(hit),
        )  # fmt: skip

    def _episodes(
        self,
        named: dict[str, tuple[str, float]],
        compared: set[str],
        end_ns: int,
        out: MonitorOutput,
    ) -> None:
        cfg = self.config
        for host, (metric, score) in named.items():
            ep = self.episodes.get(host)
            if ep is not None:
                ep.misses = 0
                continue
            first = end_ns - ((cfg.continuity - 1) * cfg.stride_s + cfg.window_s) * NS
            ep = Episode(
                host, first, metric, score, f"minder:{self.job}:{host}:{first // 1_000_000}"
            )
            self.episodes[host] = ep
            out.add("machine_faults", self._fault_row(ep, end_ns, None))
            out.alerts.append(self._alert(ep, end_ns, firing=True))
        for host, ep in list(self.episodes.items()):
            if host in named:
                continue
            ep.misses += 1
            if ep.misses >= cfg.resolve_after:
                del self.episodes[host]
                out.add("machine_faults", self._fault_row(ep, end_ns, end_ns))
                out.alerts.append(self._alert(ep, end_ns, firing=False, gone=host not in compared))

    def _fault_row(self, ep: Episode, now_ns: int, resolved_ns: int | None) -> dict[str, Any]:
        return table_row(
            "machine_faults",
            job=self.job,
            host=ep.host,
            time=now_ns,
            first_seen=ep.first_seen_ns,
            metric=ep.metric,
            score=ep.score,
            alert_id=ep.alert_id,
            resolved_at=resolved_ns,
            version=row_version(now_ns, generation=self.generation),
        )

    def _alert(self, ep: Episode, now_ns: int, firing: bool, gone: bool = False) -> dict[str, Any]:
        if self.config.scoring == "blend":
            summary = (
                f"machine {ep.host} of job {self.job} is unlike its own record and its peers"
                f" (score {ep.score:.1f}, where 1 is as odd as its odd windows used to be;"
                f" most in {ep.metric}) since {self.config.continuity} windows"
            )
        elif self.config.scoring == "residual":
            summary = (
                f"machine {ep.host} of job {self.job} has left its usual place among the "
                f"others (score {ep.score:.1f} over its metrics, most in {ep.metric}) "
                f"since {self.config.continuity} windows"
            )
        else:
            summary = (
                f"machine {ep.host} of job {self.job} drifts from the others in {ep.metric} "
                f"(score {ep.score:.1f}) since {self.config.continuity} windows"
            )
        return {
            "schema": "alerts",
            "version": 1,
            "alert_id": ep.alert_id,
            "job": self.job,
            "kind": "faulty_machine",
            "state": "firing" if firing else "resolved",
            "severity": "critical" if firing else "info",
            "ts_ns": now_ns,
            "summary": summary
            if firing
            else f"resolved{' (the machine stopped reporting)' if gone else ''}: {summary}",
            "evidence": {
                "host": ep.host,
                "metric": ep.metric,
                "score": round(ep.score, 3),
                "first_seen_ns": ep.first_seen_ns,
            },
        }
