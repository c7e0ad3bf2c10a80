"""Continuity: a machine is reported only after it stays a candidate long enough.

A glitch makes a machine stand out for a window or two; a failing machine keeps
standing out. Counting consecutive candidate windows per machine separates them.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Bool = NDArray[np.bool_]


def run_lengths(candidates_NM: Bool, carried_M: NDArray[np.int64] | None = None) -> NDArray:
    """Per window and machine, how many consecutive windows up to and including this one
    the machine was a candidate; ``carried_M`` continues a count from earlier windows."""
    n, m = candidates_NM.shape
    out = np.zeros((n, m), dtype=np.int64)
    count = np.zeros(m, dtype=np.int64) if carried_M is None else carried_M.copy()
    for i in range(n):
        count = (count + 1) * candidates_NM[i]
        out[i] = count
    return out


def confirm(candidates_NM: Bool, windows: int) -> Bool:
    """True where a machine has been a candidate for ``windows`` consecutive windows."""
    if windows <= 1:
        return candidates_NM.astype(bool)
    return run_lengths(candidates_NM) >= windows
