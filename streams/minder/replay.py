"""A labelled server group replayed through the live monitor (``online.JobMonitor``),
as the worker would see it: the servers are hosts known by name, the train split is
the stream's history (the residual baselines warm up on it, with no labels and no
train/test distinction), then the test split; one grid point is one second of
stream time. What the monitor reports at each window is mapped back onto the offline
windows of the test split, so the live path is scored with the same event-level
measures as the offline detectors (``docs/minder.md``, "The live path on ASD").

Legend: M servers, T points, K metrics, N windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.online import NS, JobMonitor, OnlineConfig
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import Group


def replay_group(
    group: Group,
    hosts: Sequence[str],
    config: OnlineConfig,
    window: int,
    stride: int,
    model: MinderModel | None = None,
) -> NDArray[np.bool_]:
    """(N, M): whether the live monitor reported each server at each offline test
    window (``window_starts(T, window, stride)``). The group's values are already in
    [0, 1] (no per-window normalisation) and its short gaps already bridged (a point
    with no sample is missing)."""
    cfg = replace(config, window_s=window, stride_s=stride, lag_s=0, max_gap_s=0, normalise=False)
    monitor = JobMonitor("replay", cfg, model)
    train_t, test_t = group.train_MTK.shape[1], group.test_MTK.shape[1]
    # offline window n covers test points n*stride .. n*stride + window - 1; the live
    # window ending at a stride boundary E covers E - window + 1 .. E
    base = (-(-(train_t + window) // stride) + 1) * stride - (window - 1)
    starts = window_starts(test_t, window, stride)
    by_end = {base + int(s) + window - 1: n for n, s in enumerate(starts)}
    reported = np.zeros((starts.size, len(hosts)), dtype=bool)
    index = {h: m for m, h in enumerate(hosts)}
    for split, first in ((group.train_MTK, base - train_t), (group.test_MTK, base)):
        for t in range(split.shape[1]):
            now = first + t
            for m, host in enumerate(hosts):
                row = split[m, t]
                if not np.isnan(row).all():
                    monitor.add(host, now * NS, dict(zip(group.metrics, row.tolist(), strict=True)))
            before = monitor.next_end_ns
            monitor.evaluate()
            if monitor.next_end_ns == before or before is None:
                continue
            n = by_end.get(before // NS)
            if n is None:
                continue  # a train-split window
            for host, episode in monitor.episodes.items():
                if episode.misses == 0:  # named in this window (a new or a going episode)
                    reported[n, index[host]] = True
    return reported
