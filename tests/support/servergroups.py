"""Small server groups in the ASD file format, for the Minder command's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_group(root: Path, servers: int = 6) -> Path:
    """``servers`` servers of three metrics on one shared cycle; on omi-3, metric m2
    drops by 0.4 over test points 80-129, the only labelled points."""
    rng = np.random.default_rng(0)
    for s in range(servers):
        t = np.arange(600)
        base = 0.5 + 0.3 * np.sin(t / 12.0)[:, None]
        x = np.clip(base + 0.02 * rng.standard_normal((600, 3)), 0, 1).astype(np.float32)
        label = np.zeros(200, dtype=np.uint8)
        test = x[400:].copy()
        if s == 2:
            test[80:130, 1] -= 0.4
            label[80:130] = 1
        np.savez(root / f"omi-{s + 1}.npz", train=x[:400], test=test, test_label=label)
    return root
