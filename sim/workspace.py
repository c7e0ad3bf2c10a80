"""Scratch memory a caller may lend the simulator, to reuse between steps.

The simulator's time tables are its largest arrays (tens of MB for a 1,024-GPU step).
Freshly allocated, each call pays for the kernel mapping and zeroing their pages,
which costs about as much as the simulation itself. A stream worker analysing one
step after another keeps one :class:`Workspace` (per thread) for all its jobs and passes
it in: it then holds what the largest pass needs, not the sum over jobs. Results never
depend on it, only the time does.
"""

from __future__ import annotations

import math

import numpy as np


class Workspace:
    """Named scratch arrays: one buffer per name, reallocated only when a call needs more
    room than it has or another dtype (a smaller call gets a view of the same buffer).

    Not thread-safe: one per thread. The memory held is bounded by the largest call.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def empty(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An array of that shape and dtype with undefined contents (like ``np.empty``)."""
        size = math.prod(shape)
        buffer = self._arrays.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != np.dtype(dtype):
            self._arrays.pop(name, None)  # freed before its successor is made
            buffer = np.empty(size, dtype=dtype)
            self._arrays[name] = buffer
        return buffer[:size].reshape(shape)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())
