"""Synthetic metric streams for the live Minder monitor's unit tests."""

from __future__ import annotations

import numpy as np

from rankwatch.streams.minder.online import NS, JobMonitor, OnlineConfig

T0 = 1_790_000_000 * NS


def phase_alerts(config: OnlineConfig) -> list[tuple[str, str]]:
    """8 identical hosts at full load, then 6 minutes idle together (a checkpoint, an
    evaluation phase), then full load again: the (state, host) of every alert raised."""
    rng = np.random.default_rng(1)
    monitor, alerts = JobMonitor("job", config), []
    for s in range(4800):
        idle = 2400 <= s < 2760
        for h in range(8):
            cpu = (5.0 if idle else 90.0) + rng.normal(0, 1.0)
            rx = (2e4 if idle else 1e8) + rng.normal(0, 1e4 if idle else 1e6)
            monitor.add(f"host{h}", T0 + s * NS, {"cpu_util": cpu, "net_rx_Bps": rx})
        alerts += [(a["state"], a["evidence"]["host"]) for a in monitor.evaluate().alerts]
    return alerts
