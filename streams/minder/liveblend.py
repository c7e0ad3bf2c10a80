"""The default detector on the live stream (``blend``), its yardsticks learnt from the
stream itself (``docs/minder.md``, "The default detector, live").

Offline, ``blend`` learns from a train split: each machine's own window means (its
history), which metrics move with the peers, and each half's per-machine unit. Live
there is no split; what the stream has shown stands in for it:

- **Own history**: per host a ring of its last ``history`` *admitted* window means (a
  window enters ``lag`` windows late, and only if the host has no open episode then:
  a confirmed fault never becomes its own yardstick; :meth:`LiveBlend.observe`).
  The reference is ``baseline.fit_reference`` over the ring, with the same spread floor
  as offline; its shrinkage toward the diagonal is at least K / n (K metrics, n
  windows), since a covariance of fewer windows than metrics is singular and would
  read every new direction as a fault.
- **Peer metrics**: ``blend.explained_share`` over the window means of every host for
  the last ``history`` windows, aligned by window (kept as running sums): the metrics
  the peers' median explains at least half of, as ``still_peers`` reads the scored
  data offline, but from the past only.
- **Peer half**: the live residual score (``residual.LiveBaselines``) averaged over the
  peer metrics.
- **One unit**: each half over the host's own ``quantile`` of that half's scores in its
  admitted windows. Offline the unit is the machine's quantile over its train windows
  scored against a reference fit on them (in sample); live each window was scored
  before it entered the ring (out of sample), which is what a later window meets.

A half scores once ``warmup`` admitted windows are in its reference and at least
1 / (1 - ``quantile``) scores (20 at 0.95) in its unit; a host with one half scored is
scored by it, as offline. Memory per host: ``history`` x K floats of admitted means,
the same again of recent means and peer deviations, 2 x ``history`` scores; per
window, one K x K fit per host whose ring changed.

Legend: M hosts, T grid points, K metrics, H ring windows.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.baseline import Reference, fit_reference, mahalanobis
from rankwatch.streams.minder.blend import (
    FLOOR,
    PEER_SHARE,
    SCORE_CAP,
    UNIT_FLOOR,
    job_phase,
    moves,
)
from rankwatch.streams.minder.peers import peer_deviation

F64 = NDArray[np.float64]
SHRINKAGE = 0.1
"""The offline reference's shrinkage toward the diagonal (``baseline.fit_reference``)."""


@dataclass
class HostRings:
    """One host's admitted windows: their metric means (columns: ``LiveBlend.metrics``)
    and the score each half gave them before they were admitted."""

    means: F64
    """(history, K) ring rows; NaN where empty or the host lacked the metric."""
    own: deque[float]
    peer: deque[float]
    writes: int = 0
    cached: tuple[tuple[tuple[int, ...], int], Reference, F64] | None = None
    """The reference last fit on the ring (keyed by the metric columns and ``writes``)
    and each metric's spread under it: refit only when a window was admitted or the
    metrics changed."""


@dataclass(frozen=True)
class BlendScores:
    """One window's scores, per host in the order given (NaN: not scored)."""

    score_M: F64
    own_M: F64
    peer_M: F64
    top: list[str]
    """Per host, the metric it departs most in: the peer metric of the largest residual
    score where the peer half is the larger, else the metric of the largest standardised
    deviation from its own history."""
    peer_metrics: list[str]


@dataclass
class PeerSums:
    """Running sums over the recent windows, per (host, metric column), of what
    ``explained_share`` pools: the count, the sum and the sum of squares of the window
    means, and the sum of squared peer deviations."""

    n: dict[str, F64] = field(default_factory=dict)
    """host -> (4, K) [count, sum, sum of squares, sum of squared peer deviations]."""

    def add(
        self,
        hosts: list[str],
        cols: NDArray[np.int64],
        k_all: int,
        means: F64,
        devs: F64,
        sign: float,
    ) -> None:
        for m, host in enumerate(hosts):
            acc = self.n.get(host)
            if acc is None or acc.shape[1] < k_all:
                grown = np.zeros((4, k_all))
                if acc is not None:
                    grown[:, : acc.shape[1]] = acc
                self.n[host] = acc = grown
            ok = np.isfinite(means[m]) & np.isfinite(devs[m])
            c = cols[ok]
            acc[0, c] += sign
            acc[1, c] += sign * means[m, ok]
            acc[2, c] += sign * means[m, ok] ** 2
            acc[3, c] += sign * devs[m, ok] ** 2

    def share(self, cols: NDArray[np.int64], level_K: F64) -> F64:
        """(len(cols),): the pooled share of each metric's movement the peers explain;
        NaN where it does not move or fewer than 3 hosts have it."""
        own = np.zeros(cols.size)
        dev = np.zeros(cols.size)
        count = np.zeros(cols.size)
        hosts = np.zeros(cols.size)
        for acc in self.n.values():
            inside = cols < acc.shape[1]  # a metric newer than the host's sums: no data yet
            block = np.zeros((4, cols.size))
            block[:, inside] = acc[:, cols[inside]]
            n, s1, s2, sd = block
            have = n > 0.5
            own += np.where(have, s2 - s1 * s1 / np.maximum(n, 1.0), 0.0)
            dev += np.where(have, sd, 0.0)
            count += np.where(have, n, 0.0)
            hosts += have
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            total, residual = own / count, dev / count
        ok = (hosts >= 3) & moves(total, level_K)
        return np.where(ok, 1.0 - residual / np.where(ok, total, 1.0), np.nan)


@dataclass
class LiveBlend:
    history: int = 90
    warmup: int = 8
    lag: int = 2
    quantile: float = 0.95
    floor: float = FLOOR
    metrics: list[str] = field(default_factory=list)
    """The rings' metric columns, in order of first appearance."""
    rings: dict[str, HostRings] = field(default_factory=dict)
    recent: deque[tuple[int, list[str], NDArray[np.int64], F64, F64]] = field(default_factory=deque)
    """(window index, hosts, metric columns, means, peer deviations) of the last
    ``history`` windows, candidates left out: what the peer-metric rule reads."""
    sums: PeerSums = field(default_factory=PeerSums)
    pending: deque[tuple[int, list[str], NDArray[np.int64], F64, F64, F64, set[str]]] = field(
        default_factory=deque
    )
    """(window index, hosts, metric columns, means, own scores, peer scores, hosts with
    an open episode at any decision since) not yet admitted."""
    last_seen: dict[str, int] = field(default_factory=dict)
    scales: dict[str, float] = field(default_factory=dict)
    """Per metric, the highest level the typical host has held in the job so far."""

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be within (0, 1), not {self.quantile}")
        if self.history < self.unit_scores():
            raise ValueError(
                f"a ring of {self.history} windows never holds the {self.unit_scores()} "
                f"scores a {self.quantile} quantile needs"
            )

    def unit_scores(self) -> int:
        """How many past scores a unit needs: ``warmup``, and 1 / (1 - quantile) (the
        0.95 quantile of four scores is their largest; in the lab a host whose unit was
        four scores old fired on its first windows)."""
        return max(self.warmup, 1, math.ceil(1.0 / (1.0 - self.quantile) - 1e-9))

    def high(self, metrics: list[str], typical_K: F64, idle_K: F64) -> F64:
        """(K,): each metric's unit, a stable one: the highest typical level so far (at
        least the idle level), as a fleet's history is scaled offline. The window's own
        typical level (the pairwise and residual scorings' unit) moves with the job: in
        an idle phase it shrinks to the idle level, every host's noise grows tenfold
        against its learnt spread, and every host fires."""
        for k, level in zip(metrics, typical_K.tolist(), strict=True):
            if math.isfinite(level) and level > self.scales.get(k, 0.0):
                self.scales[k] = level
        return np.maximum([self.scales.get(k, 0.0) for k in metrics], idle_K)

    def score(
        self,
        index: int,
        hosts: list[str],
        metrics: list[str],
        x_MTK: NDArray[np.floating],
        residual_MK: NDArray[np.floating],
    ) -> BlendScores:
        """Score window ``index`` (``x``: the hosts' normalised values on its grid,
        ``residual``: each host's live residual score per metric, NaN while warming)
        and queue it for admission (:meth:`observe`)."""
        x = np.asarray(x_MTK, dtype=np.float64)
        cols = self._columns(metrics)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a metric a host lacks
            means_MK = np.clip(x.mean(axis=1), -SCORE_CAP, SCORE_CAP)  # squares stay finite
        peer_k = self._peer_metrics(cols, means_MK)
        r = np.asarray(residual_MK, dtype=np.float64)[:, peer_k]
        own_M = np.full(len(hosts), np.nan)
        peer_raw = np.full(len(hosts), np.nan)
        own_raw = np.full(len(hosts), np.nan)
        peer_M = np.full(len(hosts), np.nan)
        top: list[str] = []
        for m, host in enumerate(hosts):
            ring = self.rings.get(host)
            own_raw[m], worst = self._own(ring, cols, means_MK[m])
            if r.shape[1] and np.isfinite(r[m]).any():
                peer_raw[m] = float(np.nanmean(r[m]))
            own_M[m] = own_raw[m] / self._unit(ring.own if ring else None)
            peer_M[m] = peer_raw[m] / self._unit(ring.peer if ring else None)
            if not math.isnan(peer_M[m]) and not own_M[m] >= peer_M[m]:
                top.append(metrics[peer_k[int(np.nanargmax(r[m]))]])
            else:
                top.append(metrics[worst] if worst >= 0 else "")
        if job_phase(own_M > 1.0, np.isfinite(own_M)):
            own_M[:] = np.nan  # the whole job moved off its history: the peers decide
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # neither half: NaN
            score_M = np.nanmean(np.stack([own_M, peer_M]), axis=0)
        devs = peer_deviation(means_MK)  # per metric, each host's mean minus the hosts' median
        self.recent.append((index, list(hosts), cols, means_MK, devs))
        self.sums.add(list(hosts), cols, len(self.metrics), means_MK, devs, 1.0)
        while self.recent and self.recent[0][0] <= index - self.history:
            _, h, c, mk, dk = self.recent.popleft()
            self.sums.add(h, c, len(self.metrics), mk, dk, -1.0)
        if index % self.history == 0:
            self._rebuild_sums()  # adding and taking away for weeks would drift
        self.pending.append((index, list(hosts), cols, means_MK, own_raw, peer_raw, set()))
        return BlendScores(score_M, own_M, peer_M, top, [metrics[k] for k in peer_k])

    def observe(self, index: int, candidates: set[str], in_episode: set[str]) -> None:
        """Window ``index`` was decided: admit the windows ``lag`` old whose host had
        no open episode at any decision since they were scored; forget hosts unseen for
        a ring.

        A candidate window that no episode confirmed *is* admitted: the unit is a
        quantile of the admitted scores, and leaving out every window above it would
        censor the ring at the unit, which could then only fall (a healthy host fired
        within minutes so). A fault is kept out by its episode: with ``lag`` at least
        continuity - 1, a confirmed run's first window is still pending when the
        episode opens, and its last is decided while the episode is still open.
        Candidates are left out of the peer-metric rule's windows at once: a faulty
        host that leaves the group would otherwise make the metric it leaves in look
        like no peer metric, and blind the peer half to itself."""
        if self.pending and self.pending[-1][0] == index:
            for host in self.pending[-1][1]:
                self.last_seen[host] = index
        out = candidates | in_episode
        if self.recent and self.recent[-1][0] == index and out:
            i, hosts, cols, means, devs = self.recent[-1]
            self.sums.add(hosts, cols, len(self.metrics), means, devs, -1.0)
            keep = [m for m, h in enumerate(hosts) if h not in out]
            kept, devs = means[keep], peer_deviation(means[keep])  # the median without them
            self.recent[-1] = (i, [hosts[m] for m in keep], cols, kept, devs)
            self.sums.add(self.recent[-1][1], cols, len(self.metrics), kept, devs, 1.0)
        for entry in self.pending:
            entry[6].update(in_episode)
        while self.pending and self.pending[0][0] <= index - self.lag:
            _, hosts, cols, means, own, peer, faulty = self.pending.popleft()
            for m, host in enumerate(hosts):
                if host not in faulty:
                    self._admit(host, cols, means[m], float(own[m]), float(peer[m]))
        for host in [h for h, i in self.last_seen.items() if i < index - self.history]:
            del self.last_seen[host]
            self.rings.pop(host, None)
            self.sums.n.pop(host, None)

    def _rebuild_sums(self) -> None:
        self.sums = PeerSums()
        for _, hosts, cols, means, devs in self.recent:
            self.sums.add(hosts, cols, len(self.metrics), means, devs, 1.0)

    def _admit(
        self, host: str, cols: NDArray[np.int64], means: F64, own: float, peer: float
    ) -> None:
        ring = self.rings.get(host)
        if ring is None:
            h = self.history
            ring = HostRings(
                np.full((h, len(self.metrics)), np.nan), deque(maxlen=h), deque(maxlen=h)
            )
            self.rings[host] = ring
        if ring.means.shape[1] < len(self.metrics):
            pad = np.full((self.history, len(self.metrics) - ring.means.shape[1]), np.nan)
            ring.means = np.concatenate([ring.means, pad], axis=1)
        row = ring.writes % self.history
        ring.means[row] = np.nan
        ring.means[row, cols] = means
        ring.writes += 1
        if not math.isnan(own):
            ring.own.append(own)
        if not math.isnan(peer):
            ring.peer.append(peer)

    def _own(
        self, ring: HostRings | None, cols: NDArray[np.int64], mean_K: F64
    ) -> tuple[float, int]:
        """The host's distance from its own admitted windows, and the position (in
        ``cols``) of the metric it departs most in; NaN (and -1) while fewer than
        ``warmup`` complete windows are in. Only the metrics its ring has at least
        ``warmup`` values of, and this window has, count: a metric that appears later
        joins once it has a history, instead of blinding the half until then."""
        need = max(self.warmup, 2)
        if ring is None:
            return math.nan, -1
        inside = cols < ring.means.shape[1]
        values = np.full((self.history, cols.size), np.nan)
        values[:, inside] = ring.means[:, cols[inside]]
        use = np.flatnonzero((np.isfinite(values).sum(axis=0) >= need) & np.isfinite(mean_K))
        if use.size == 0:
            return math.nan, -1
        key = (tuple(cols[use].tolist()), ring.writes)
        if ring.cached is None or ring.cached[0] != key:
            past = values[:, use]
            past = past[np.isfinite(past).all(axis=1)]
            if past.shape[0] < need:
                return math.nan, -1
            ref = self.reference(past)
            spread = np.sqrt(np.maximum(np.diag(np.linalg.pinv(ref.precision_KK)), 1e-300))
            ring.cached = (key, ref, spread)
        _, ref, spread = ring.cached
        now = mean_K[use]
        worst = int(use[int(np.argmax(np.abs(now - ref.mean_K) / spread))])
        return min(float(mahalanobis(now[None, :], ref)[0]), SCORE_CAP), worst

    def reference(self, past_HK: F64) -> Reference:
        shrinkage = min(1.0, max(SHRINKAGE, past_HK.shape[1] / past_HK.shape[0]))
        return fit_reference(past_HK, shrinkage=shrinkage, floor=self.floor)

    def _unit(self, scores: deque[float] | None) -> float:
        """The host's own ``quantile`` of a half's past scores, at least ``UNIT_FLOOR``
        (NaN: fewer than :meth:`unit_scores` of them)."""
        if scores is None or len(scores) < self.unit_scores():
            return math.nan
        return max(
            float(np.quantile(np.fromiter(scores, dtype=np.float64), self.quantile)), UNIT_FLOOR
        )

    def _peer_metrics(self, cols: NDArray[np.int64], means_MK: F64) -> list[int]:
        """Positions (in the window's metrics) of those the peers' median explains at
        least ``PEER_SHARE`` of over the recent windows."""
        if len(self.recent) < max(self.warmup, 2):
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            level = np.nan_to_num(np.nanmax(np.abs(means_MK), axis=0))
        share = np.nan_to_num(self.sums.share(cols, level), nan=-1.0)
        return [k for k in range(cols.size) if share[k] >= PEER_SHARE]

    def _columns(self, metrics: list[str]) -> NDArray[np.int64]:
        new = [m for m in dict.fromkeys(metrics) if m not in self.metrics]
        self.metrics += new
        index = {m: k for k, m in enumerate(self.metrics)}
        return np.array([index[m] for m in metrics], dtype=np.int64)

    def to_state(self) -> dict[str, Any]:
        """JSON-ready (NaN as None; no score is infinite, ``SCORE_CAP``). The peer
        deviations and sums are rebuilt from ``recent``'s means. Its size grows with
        hosts x ``history`` x K (about 40 MB of JSON at 1,000 hosts, 8 metrics, full
        rings), and the worker stores it with every window: a cost that blend scoring
        pays and the worker's snapshots were not built for (not yet measured in the
        worker)."""
        return {
            "history": self.history,
            "metrics": list(self.metrics),
            "rings": {
                h: {
                    "means": _nulls(r.means),
                    "own": list(r.own),
                    "peer": list(r.peer),
                    "writes": r.writes,
                }
                for h, r in self.rings.items()
            },
            "recent": [[i, h, c.tolist(), _nulls(mk)] for i, h, c, mk, _ in self.recent],
            "pending": [
                [i, h, c.tolist(), _nulls(mk), _nulls(o), _nulls(p), sorted(f)]
                for i, h, c, mk, o, p, f in self.pending
            ],
            "last_seen": dict(self.last_seen),
            "scales": dict(self.scales),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Back to a stored state; ValueError where its rings are of another length."""
        if int(state["history"]) != self.history:
            raise ValueError(
                f"stored rings are {state['history']} windows long, not {self.history}"
            )
        h = self.history
        self.metrics = list(state["metrics"])
        self.rings = {}
        for host, r in state["rings"].items():
            means = _floats(r["means"]).reshape(h, -1) if r["means"] else np.full((h, 0), np.nan)
            self.rings[host] = HostRings(
                means, deque(r["own"], maxlen=h), deque(r["peer"], maxlen=h), int(r["writes"])
            )
        self.recent, self.sums = deque(), PeerSums()
        for i, hosts, c, mk in state["recent"]:
            cols = np.array(c, dtype=np.int64)
            means = _floats(mk).reshape(len(hosts), cols.size)
            devs = peer_deviation(means)  # as it was computed from these means
            self.recent.append((int(i), list(hosts), cols, means, devs))
            self.sums.add(list(hosts), cols, len(self.metrics), means, devs, 1.0)
        self.pending = deque(
            (
                int(i),
                list(hosts),
                np.array(c, dtype=np.int64),
                _floats(mk).reshape(len(hosts), len(c)),
                _floats(o),
                _floats(p),
                set(f),
            )
            for i, hosts, c, mk, o, p, f in state["pending"]
        )
        self.last_seen = {k: int(v) for k, v in state["last_seen"].items()}
        self.scales = {k: float(v) for k, v in state["scales"].items()}


def _nulls(a: NDArray[np.floating]) -> list[Any]:
    """An array as nested lists, NaN as None (JSON has no NaN)."""
    values = np.asarray(a, dtype=object)
    values[np.isnan(np.asarray(a, dtype=np.float64))] = None
    out: list[Any] = values.tolist()
    return out


def _floats(a: list[Any]) -> F64:
    return np.array(a, dtype=np.float64)  # None -> NaN
