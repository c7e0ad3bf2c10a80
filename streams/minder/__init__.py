"""Minder, the faulty-machine detector (``docs/minder.md``): a pure numpy core.

No I/O, no clock, no torch in the core: the stream worker and the CLI feed it arrays
and read arrays back. Modules: ``grid`` (alignment, gap filling, normalisation), ``vae``
(LSTM-VAE forward pass from exported weights), ``similarity``, ``continuity``,
``peers`` (peer scoring), ``residual`` (residual scoring, fusing metrics),
``priority`` (metric order from labelled windows), ``detector`` (the four together),
``series`` (servers' splits on one timeline),
``baseline`` (Mahalanobis), ``evaluation`` (window, point and event scores),
``study`` and ``holdout`` (the two evaluation protocols), ``online`` (the live
monitor: one alert per faulty-machine episode).

Shell: ``worker`` (the faust agent: metrics in, scores, faults and alerts out),
``files`` (labelled server groups read from disk), ``train`` (offline training with
torch; the worker runs the exported weights in numpy).
"""

from rankwatch.streams.minder.detector import (
    Detection,
    MinderConfig,
    MinderModel,
    calibrate_thresholds,
    detect,
    metric_scores,
)
from rankwatch.streams.minder.grid import align_to_grid, bounds_of, fill_gaps, normalise
from rankwatch.streams.minder.vae import VaeWeights

__all__ = [
    "Detection",
    "MinderConfig",
    "MinderModel",
    "VaeWeights",
    "align_to_grid",
    "bounds_of",
    "calibrate_thresholds",
    "detect",
    "fill_gaps",
    "metric_scores",
    "normalise",
]

SHELL = ("worker", "files", "train")
