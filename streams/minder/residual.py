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
    a candidate in none of the windows from it to then and has no open episode when it
    comes due: a fault, and the drift that led into it, never become the yardstick it
    is measured by. A (host, metric) is scored only once ``warmup`` summaries are in:
    a host that joins late gets its own warm-up. A host not seen for ``history``
    windows is forgotten (it warms up again).

    All hosts' rings live in two arrays (slot x ring row x metric), so that one window
    of 10,000 hosts is a few array operations, not 10,000 Python calls.
    """

    history: int = 32
    warmup: int = 4
    lag: int = 2
    floor: float = 0.02
    stride_ns: int = 0
    """The stride of the window grid the indices count (a window's index is its end //
    ``stride_ns``): rings stored under another stride do not fit (:meth:`restore`)."""
    metrics: list[str] = field(default_factory=list)
    """The ring's metric columns, in order of first appearance."""
    slots: dict[str, int] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    meds: F64 = field(init=False)
    """(slots, history, metrics) each admitted window's median peer residual; NaN: none."""
    mads: F64 = field(init=False)
    """(slots, history, metrics) the median absolute deviation inside that window."""
    writes: NDArray[np.int64] = field(init=False)
    """Per slot, windows admitted so far (the next ring row is this modulo ``history``)."""
    last_candidate: dict[str, int] = field(default_factory=dict)
    """host -> the last window it was a candidate in."""
    last_seen: dict[str, int] = field(default_factory=dict)
    """host -> the last window it was summarised in."""
    pending: list[tuple[int, list[str], list[str], F64, F64]] = field(default_factory=list)
    """(window index, hosts, metrics, medians, MADs) not yet admitted, oldest first."""

    def __post_init__(self) -> None:
        self.meds = np.zeros((0, self.history, 0))
        self.mads = np.zeros((0, self.history, 0))
        self.writes = np.zeros(0, dtype=np.int64)

    def levels(self, hosts: list[str], metrics: list[str]) -> tuple[F64, F64]:
        """(M, K) each: every host's usual level and spread of its peer residual per
        metric; NaN where it still warms up."""
        cols = self._columns(metrics)
        slots = np.array([self.slots.get(h, -1) for h in hosts], dtype=np.int64)
        known = slots >= 0
        meds = np.full((len(hosts), self.history, len(metrics)), np.nan)
        mads = np.full_like(meds, np.nan)
        meds[known] = self.meds[slots[known]][:, :, cols]
        mads[known] = self.mads[slots[known]][:, :, cols]
        warm = (~np.isnan(meds)).sum(axis=1) >= max(self.warmup, 1)
        loc = nanmedian_rows(meds)
        between = 1.4826 * nanmedian_rows(np.abs(meds - loc[:, None, :]))
        within = 1.4826 * nanmedian_rows(mads)
        scale = np.maximum(np.hypot(between, within), self.floor)
        return np.where(warm, loc, np.nan), np.where(warm, scale, np.nan)

    def ring(self, host: str, metric: str) -> list[float]:
        """The window medians in the host's ring for ``metric``, oldest first (NaN: a
        window that lacked it); empty for a host or metric never admitted."""
        slot = self.slots.get(host)
        if slot is None or metric not in self.metrics:
            return []
        w = int(self.writes[slot])
        rows = [(w - n) % self.history for n in range(min(w, self.history), 0, -1)]
        return [float(v) for v in self.meds[slot, rows, self.metrics.index(metric)]]

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
        """Window ``index`` was scored: queue its summaries, admit the ones ``lag``
        windows old whose host was no candidate since and has no open episode."""
        for host in hosts:
            self.last_seen[host] = index
        for host in candidates:
            self.last_candidate[host] = index
        self.pending.append((index, list(hosts), list(metrics), med_MK.copy(), mad_MK.copy()))
        while self.pending and self.pending[0][0] <= index - self.lag:
            w, names, cols, med, mad = self.pending.pop(0)
            keep = [
                i
                for i, h in enumerate(names)
                if self.last_candidate.get(h, -1) < w and h not in in_episode
            ]
            if keep:
                self._admit([names[i] for i in keep], cols, med[keep], mad[keep])
        gone = [h for h, i in self.last_seen.items() if i < index - max(self.history, self.lag)]
        for host in gone:
            del self.last_seen[host]
            self.last_candidate.pop(host, None)
            slot = self.slots.pop(host, None)
            if slot is not None:
                self.meds[slot] = self.mads[slot] = np.nan
                self.writes[slot] = 0
                self.free.append(slot)

    def _columns(self, metrics: list[str]) -> NDArray[np.int64]:
        """Ring column of each of ``metrics``, adding a NaN column for one never seen."""
        new = [m for m in dict.fromkeys(metrics) if m not in self.metrics]
        if new:
            self.metrics += new
            pad = np.full((*self.meds.shape[:2], len(new)), np.nan)
            self.meds = np.concatenate([self.meds, pad], axis=2)
            self.mads = np.concatenate([self.mads, pad.copy()], axis=2)
        index = {m: k for k, m in enumerate(self.metrics)}
        return np.array([index[m] for m in metrics], dtype=np.int64)

    def _slot(self, host: str) -> int:
        slot = self.slots.get(host)
        if slot is not None:
            return slot
        if not self.free:  # grow by half again: amortised O(1) per new host
            have = self.meds.shape[0]
            more = max(have // 2, 8)
            pad = np.full((more, self.history, len(self.metrics)), np.nan)
            self.meds = np.concatenate([self.meds, pad])
            self.mads = np.concatenate([self.mads, pad.copy()])
            self.writes = np.concatenate([self.writes, np.zeros(more, dtype=np.int64)])
            self.free = list(range(have + more - 1, have - 1, -1))  # lowest slot first
        slot = self.free.pop()
        self.slots[host] = slot
        return slot

    def _admit(self, hosts: list[str], metrics: list[str], med: F64, mad: F64) -> None:
        cols = self._columns(metrics)
        slots = np.array([self._slot(h) for h in hosts], dtype=np.int64)
        rows = self.writes[slots] % self.history
        self.meds[slots, rows] = np.nan
        self.mads[slots, rows] = np.nan
        self.meds[slots[:, None], rows[:, None], cols[None, :]] = med
        self.mads[slots[:, None], rows[:, None], cols[None, :]] = mad
        self.writes[slots] += 1

    def to_state(self) -> dict[str, Any]:
        """JSON-ready (NaN as None): each host's ring rows in storage order, with its
        write count (the medians do not depend on the order)."""
        return {
            "stride_ns": self.stride_ns,
            "metrics": list(self.metrics),
            "rings": {
                h: {
                    "writes": int(self.writes[s]),
                    "meds": _nulls(self.meds[s]),
                    "mads": _nulls(self.mads[s]),
                }
                for h, s in self.slots.items()
            },
            "pending": [
                [w, names, cols, _nulls(med), _nulls(mad)]
                for w, names, cols, med, mad in self.pending
            ],
            "last_seen": dict(self.last_seen),
            "last_candidate": dict(self.last_candidate),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Back to a stored state; ValueError if it does not fit this configuration
        (rings of another ``history``, or windows counted in another stride, whose
        pending ones would never come due): the caller then warms up afresh."""
        empty = not state["rings"] and not state["pending"]  # pairwise scoring's
        if not empty and state.get("stride_ns") != self.stride_ns:
            raise ValueError(
                f"stored windows count strides of {state.get('stride_ns')} ns, not {self.stride_ns}"
            )
        if any(len(r["meds"]) != self.history for r in state["rings"].values()):
            raise ValueError(f"stored rings are not {self.history} windows long")
        k = len(state["metrics"])
        self.metrics = list(state["metrics"])
        hosts = list(state["rings"])
        self.slots = {h: s for s, h in enumerate(hosts)}
        self.free = []
        shape = (len(hosts), self.history, k)
        self.meds = np.full(shape, np.nan)
        self.mads = np.full(shape, np.nan)
        self.writes = np.zeros(len(hosts), dtype=np.int64)
        for s, h in enumerate(hosts):
            ring = state["rings"][h]
            self.meds[s] = _floats(ring["meds"]).reshape(self.history, k)
            self.mads[s] = _floats(ring["mads"]).reshape(self.history, k)
            self.writes[s] = int(ring["writes"])
        self.pending = [
            (
                int(w),
                list(names),
                list(cols),
                _floats(med).reshape(len(names), len(cols)),
                _floats(mad).reshape(len(names), len(cols)),
            )
            for w, names, cols, med, mad in state["pending"]
        ]
        self.last_seen = {h: int(i) for h, i in state["last_seen"].items()}
        self.last_candidate = {h: int(i) for h, i in state["last_candidate"].items()}


def nanmedian_rows(a_MHK: F64) -> F64:
    """(M, K): the median over axis 1 leaving NaN out (NaN where all are): what
    ``np.nanmedian(a, axis=1)`` gives, without its masked-array path for short axes
    (ten times slower on 10,000 x 32 x 10)."""
    ordered = np.sort(a_MHK, axis=1)  # NaN sorts last
    n = (~np.isnan(a_MHK)).sum(axis=1, keepdims=True)
    lo = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0), axis=1)
    hi = np.take_along_axis(ordered, np.maximum(n // 2, 0) - (n == 0), axis=1)
    out = ((lo + hi) / 2)[:, 0, :]
    return np.where(n[:, 0, :] > 0, out, np.nan)


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
