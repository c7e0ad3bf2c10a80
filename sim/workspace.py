"""Scratch memory a caller may lend the simulator, to reuse between steps.

The simulator's time tables are its largest arrays (tens of MB for a 1,024-GPU step).
Freshly allocated, each call pays for the kernel mapping and zeroing their pages,
which costs about as much as the simulation itself. A stream worker analysing one
step after another keeps a :class:`Workspace` per job (and thread) and passes it in;
results never depend on it, only the time does.
"""

from __future__ import annotations

import numpy as np


class Workspace:
    """Named scratch arrays: one per name, reallocated only when its shape or dtype changes.

    Not thread-safe: one per thread. The memory held is bounded by the largest call.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def empty(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An array of that shape and dtype with undefined contents (like ``np.empty``)."""
        array = self._arrays.get(name)
        if array is None or array.shape != shape or array.dtype != np.dtype(dtype):
            array = np.empty(shape, dtype=dtype)
            self._arrays[name] = array
        return array

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())
