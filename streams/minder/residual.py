"""Residual scoring: each machine against its peers *and* against its own history of
how it relates to them (``docs/minder.md``, "Residual scoring").

The paper's similarity asks "is this machine unlike the others now?" and answers with a
yardstick taken from the window itself (the spread of M distances). On the ASD servers
that fails twice over (``docs/minder.md``, "Why Minder scored low"): servers have
lasting offsets from one another in some metrics (a metric that is zero on four
servers and busy on two), which pairwise distances read as anomalies every window;
and six numbers give a poor spread. Residual scoring keeps the peer comparison and
asks "is this machine's distance from its peers unusual *for this machine*?":

- at each point, the machine's *peer residual* is its value minus the median of the
  machines present there (``peers.peer_deviation``): the load every machine shares
  (daily cycles, job phases) cancels;
- per machine and metric, the residual's usual level and spread are learnt from the
  train split (median and 1.4826 x MAD, at least ``floor``): a machine that always
  runs a little hotter than its peers is not an anomaly, one that departs from its
  own usual offset is;
- per window, a machine's score in a metric is the RMS of its standardised residual.

The scores of several metrics are then fused (``fuse``): the mean score over the
metrics most telling first (``priority``), since the faults of the data touch many
metrics at once and a mean lets no single noisy metric decide.

Machines are identified by their row: the train and the scored arrays must list the
same machines in the same order. Cost O(M x T) per metric.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.peers import peer_deviation, window_rms

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class OwnBaseline:
    """Per metric and machine, the usual peer residual and its spread (train split)."""

    loc_KM: F64
    scale_KM: F64


def fit_own_baseline(train_MTK: NDArray[np.floating], floor: float) -> OwnBaseline:
    """Median and 1.4826 x MAD of each machine's peer residual, per metric; a machine
    never seen in a metric gets location 0 and scale ``floor``."""
    k_all, m = train_MTK.shape[2], train_MTK.shape[0]
    loc = np.zeros((k_all, m))
    scale = np.full((k_all, m), floor, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: left at defaults
        for k in range(k_all):
            r = peer_deviation(train_MTK[:, :, k])
            med = np.nanmedian(r, axis=1)
            mad = np.nanmedian(np.abs(r - med[:, None]), axis=1)
            seen = ~np.isnan(med)
            loc[k, seen] = med[seen]
            scale[k, seen] = np.maximum(1.4826 * mad[seen], floor)
    return OwnBaseline(loc, scale)


def residual_scores(
    x_MT: NDArray[np.floating],
    starts: NDArray[np.int64],
    window: int,
    loc_M: F64,
    scale_M: F64,
) -> F64:
    """(N, M): RMS over each window of the machine's standardised peer residual; NaN
    where the machine misses a point of the window."""
    if loc_M.shape[0] != x_MT.shape[0]:
        raise ValueError(f"own baseline knows {loc_M.shape[0]} machines, {x_MT.shape[0]} given")
    z = (peer_deviation(x_MT) - loc_M[:, None]) / scale_M[:, None]
    return window_rms(z, starts, window)


def fuse(scores_KNM: F64, metrics_k: list[int]) -> F64:
    """(N, M): the mean score over the given metrics; NaN where any of them is NaN."""
    if not metrics_k:
        return np.full(scores_KNM.shape[1:], np.nan)
    return np.asarray(scores_KNM[metrics_k].mean(axis=0))


@dataclass
class HostRing:
    """One host's last admitted window summaries: rows oldest first, one column per
    metric it has reported (NaN where a window lacked that metric)."""

    metrics: list[str]
    meds: F64
    """(rows, K) each window's median peer residual."""
    mads: F64
    """(rows, K) the median absolute deviation around it inside the window."""

    def columns(self, metrics: list[str]) -> NDArray[np.int64]:
        """Column of each of ``metrics``, adding a NaN column for a metric never seen."""
        for name in metrics:
            if name not in self.metrics:
                self.metrics.append(name)
                pad = np.full((self.meds.shape[0], 1), np.nan)
                self.meds, self.mads = np.hstack([self.meds, pad]), np.hstack([self.mads, pad])
        return np.array([self.metrics.index(n) for n in metrics], dtype=np.int64)


@dataclass
class LiveBaselines:
    """Each host's usual peer residual per metric, learnt from the stream itself
    (``docs/minder.md``, "Residual scoring on the live stream").

    Per host a ring of its last ``history`` *admitted* window summaries, per metric:
    the window's median peer residual and the median absolute deviation around it
    inside the window. The usual level is the median of the window medians; the spread
    combines the spread between windows (1.4826 x MAD of the medians) and inside them
    (1.4826 x the median of the in-window MADs), at least ``floor``. Memory is bounded:
    2 x ``history`` floats per (host, metric), plus ``lag`` pending windows.

    A window's summary enters the ring ``lag`` windows late, and only if the host was
    not a candidate in it and has no open episode when it comes due; a host that
    becomes a candidate loses its pending summaries. So a fault, and the drift that
    led into it, never become the yardstick it is measured by. A (host, metric) is
    scored only once ``warmup`` summaries are in: a host that joins late gets its own
    warm-up. A host not seen for ``history`` windows is forgotten (it warms up again).
    """

    history: int = 32
    warmup: int = 4
    lag: int = 2
    floor: float = 0.02
    rings: dict[str, HostRing] = field(default_factory=dict)
    pending: dict[str, list[tuple[int, list[str], list[float], list[float]]]] = field(
        default_factory=dict
    )
    """host -> (window index, metrics, medians, MADs) not yet admitted, oldest first."""
    last_seen: dict[str, int] = field(default_factory=dict)
    """host -> index of the last window it was summarised in."""

    def levels(self, hosts: list[str], metrics: list[str]) -> tuple[F64, F64]:
        """(M, K) each: every host's usual level and spread of its peer residual per
        metric; NaN where it still warms up."""
        m, k = len(hosts), len(metrics)
        meds = np.full((m, self.history, k), np.nan)
        mads = np.full((m, self.history, k), np.nan)
        for i, host in enumerate(hosts):
            ring = self.rings.get(host)
            if ring is None:
                continue
            cols = ring.columns(metrics)
            rows = ring.meds.shape[0]
            meds[i, :rows] = ring.meds[:, cols]
            mads[i, :rows] = ring.mads[:, cols]
        warm = (~np.isnan(meds)).sum(axis=1) >= max(self.warmup, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: still warming up
            loc = np.nanmedian(meds, axis=1)
            between = 1.4826 * np.nanmedian(np.abs(meds - loc[:, None, :]), axis=1)
            within = 1.4826 * np.nanmedian(mads, axis=1)
        scale = np.maximum(np.hypot(between, within), self.floor)
        return np.where(warm, loc, np.nan), np.where(warm, scale, np.nan)

    def observe(
        self,
        index: int,
        hosts: list[str],
        metrics: list[str],
        med_MK: F64,
        mad_MK: F64,
        candidates: set[str],
        in_episode: set[str],
    ) -> None:
        """Window ``index`` was scored: queue its summaries, drop those of its
        candidates, admit the ones ``lag`` windows old."""
        for i, host in enumerate(hosts):
            self.last_seen[host] = index
            queue = self.pending.setdefault(host, [])
            if host in candidates:
                queue.clear()  # the onset of a possible fault: never a yardstick
                continue
            queue.append((index, list(metrics), med_MK[i].tolist(), mad_MK[i].tolist()))
        for host, queue in self.pending.items():
            while queue and queue[0][0] <= index - self.lag:
                _, names, med, mad = queue.pop(0)
                if host not in in_episode and host not in candidates:
                    self._admit(host, names, med, mad)
        for host in [h for h, i in self.last_seen.items() if i < index - self.history]:
            self.rings.pop(host, None), self.pending.pop(host, None), self.last_seen.pop(host)

    def _admit(self, host: str, names: list[str], med: list[float], mad: list[float]) -> None:
        ring = self.rings.setdefault(host, HostRing([], np.zeros((0, 0)), np.zeros((0, 0))))
        cols = ring.columns(names)
        row_med = np.full((1, len(ring.metrics)), np.nan)
        row_mad = np.full((1, len(ring.metrics)), np.nan)
        row_med[0, cols], row_mad[0, cols] = med, mad
        ring.meds = np.vstack([ring.meds, row_med])[-self.history :]
        ring.mads = np.vstack([ring.mads, row_mad])[-self.history :]

    def to_state(self) -> dict[str, Any]:
        """JSON-ready (NaN as None)."""
        return {
            "rings": {
                h: {"metrics": r.metrics, "meds": _nulls(r.meds), "mads": _nulls(r.mads)}
                for h, r in self.rings.items()
            },
            "pending": {
                h: [
                    [i, names, _nulls(np.asarray(med)), _nulls(np.asarray(mad))]
                    for i, names, med, mad in q
                ]
                for h, q in self.pending.items()
            },
            "last_seen": dict(self.last_seen),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.rings = {
            h: HostRing(
                list(r["metrics"]),
                _floats(r["meds"]).reshape(len(r["meds"]), len(r["metrics"])),
                _floats(r["mads"]).reshape(len(r["mads"]), len(r["metrics"])),
            )
            for h, r in state["rings"].items()
        }
        self.pending = {
            h: [
                (int(i), list(names), _floats(med).tolist(), _floats(mad).tolist())
                for i, names, med, mad in q
            ]
            for h, q in state["pending"].items()
        }
        self.last_seen = {h: int(i) for h, i in state["last_seen"].items()}


def _nulls(a: NDArray[np.floating]) -> list[Any]:
    """An array as nested lists, NaN as None (JSON has no NaN)."""
    out: list[Any] = np.asarray(a, dtype=object).tolist()
    return _none_for_nan(out)


def _none_for_nan(x: Any) -> Any:
    if isinstance(x, list):
        return [_none_for_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _floats(a: list[Any]) -> F64:
    return np.array(a, dtype=np.float64)  # None -> NaN


def window_summaries(r_MTK: F64) -> tuple[F64, F64]:
    """(M, K) each: per host and metric, the window's median peer residual and the
    median absolute deviation around it (NaN where a point is missing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: a metric a host lacks
        med = np.median(r_MTK, axis=1)
        mad = np.median(np.abs(r_MTK - med[:, None, :]), axis=1)
    return np.asarray(med), np.asarray(mad)
