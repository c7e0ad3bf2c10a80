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
class LiveBaselines:
    """Each host's usual peer residual per metric, learnt from the stream itself
    (``docs/minder.md``, "Residual scoring on the live stream").

    Per (host, metric) a ring of the last ``history`` *admitted* window summaries: the
    window's median peer residual and the median absolute deviation around it inside
    the window. The usual level is the median of the window medians; the spread
    combines the spread between windows (1.4826 x MAD of the medians) and inside them
    (1.4826 x the median of the in-window MADs), at least ``floor``. Memory is bounded:
    2 x ``history`` floats per (host, metric).

    A window's summary enters the ring ``lag`` windows late, and only if the host was
    not a candidate in it and has no open episode when it comes due; a host that
    becomes a candidate loses its pending summaries. So a fault, and the drift that
    led into it, never become the yardstick it is measured by. A (host, metric) is
    scored only once ``warmup`` summaries are in: a host that joins late gets its own
    warm-up.
    """

    history: int = 32
    warmup: int = 4
    lag: int = 2
    floor: float = 0.02
    rings: dict[str, dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    """host -> metric -> (window medians, in-window MADs), oldest first."""
    pending: dict[str, list[tuple[int, dict[str, tuple[float, float]]]]] = field(
        default_factory=dict
    )
    """host -> (window index, metric -> (median, MAD)) not yet admitted, oldest first."""
    last_seen: dict[str, int] = field(default_factory=dict)
    """host -> index of the last window it was summarised in."""

    def baseline(self, host: str, metric: str) -> tuple[float, float] | None:
        """(level, spread) of the host's peer residual in ``metric``; None while it
        warms up."""
        ring = self.rings.get(host, {}).get(metric)
        if ring is None or len(ring[0]) < self.warmup:
            return None
        meds, mads = np.asarray(ring[0]), np.asarray(ring[1])
        loc = float(np.median(meds))
        between = 1.4826 * float(np.median(np.abs(meds - loc)))
        within = 1.4826 * float(np.median(mads))
        return loc, max(float(np.hypot(between, within)), self.floor)

    def observe(
        self,
        index: int,
        summaries: dict[str, dict[str, tuple[float, float]]],
        candidates: set[str],
        in_episode: set[str],
    ) -> None:
        """Window ``index`` was scored: queue its summaries (host -> metric -> (median,
        MAD)), drop those of its candidates, admit the ones ``lag`` windows old."""
        for host, per_metric in summaries.items():
            self.last_seen[host] = index
            queue = self.pending.setdefault(host, [])
            if host in candidates:
                queue.clear()  # the onset of a possible fault: never a yardstick
                continue
            queue.append((index, per_metric))
        for host, queue in self.pending.items():
            while queue and queue[0][0] <= index - self.lag:
                _, per_metric = queue.pop(0)
                if host in in_episode or host in candidates:
                    continue
                rings = self.rings.setdefault(host, {})
                for metric, (med, mad) in per_metric.items():
                    meds, mads = rings.setdefault(metric, ([], []))
                    meds.append(med)
                    mads.append(mad)
                    del meds[: -self.history], mads[: -self.history]
        for host in [h for h, i in self.last_seen.items() if i < index - self.history]:
            # gone for a whole history: a host that comes back warms up again
            self.rings.pop(host, None), self.pending.pop(host, None), self.last_seen.pop(host)

    def to_state(self) -> dict[str, Any]:
        return {
            "rings": {h: {k: [a, b] for k, (a, b) in r.items()} for h, r in self.rings.items()},
            "pending": {h: [[i, s] for i, s in q] for h, q in self.pending.items()},
            "last_seen": dict(self.last_seen),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.rings = {
            h: {k: (list(map(float, a)), list(map(float, b))) for k, (a, b) in r.items()}
            for h, r in state["rings"].items()
        }
        self.pending = {
            h: [(int(i), {k: (float(v[0]), float(v[1])) for k, v in s.items()}) for i, s in q]
            for h, q in state["pending"].items()
        }
        self.last_seen = {h: int(i) for h, i in state["last_seen"].items()}


def window_summaries(r_MTK: F64) -> tuple[F64, F64]:
    """(M, K) each: per host and metric, the window's median peer residual and the
    median absolute deviation around it (NaN where a point is missing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: a metric a host lacks
        med = np.median(r_MTK, axis=1)
        mad = np.median(np.abs(r_MTK - med[:, None, :]), axis=1)
    return np.asarray(med), np.asarray(mad)
