"""A :class:`MinderModel` as a flat dict of numpy arrays (what ``np.savez`` stores).

The shells write and read the file; this module only maps names to arrays.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.vae import VaeWeights


def model_to_arrays(model: MinderModel) -> dict[str, NDArray]:
    out: dict[str, NDArray] = {
        "metrics": np.array(model.metrics, dtype=str),
        "priority": np.array(model.priority, dtype=str),
        "threshold_names": np.array(list(model.thresholds), dtype=str),
        "threshold_values": np.array(list(model.thresholds.values()), dtype=np.float64),
        "peer_scale_names": np.array(list(model.peer_scale), dtype=str),
        "peer_scale_values": np.array(list(model.peer_scale.values()), dtype=np.float64),
    }
    for i, name in enumerate(model.metrics):
        if name in model.denoisers:
            out.update(model.denoisers[name].to_arrays(f"vae{i}."))
    if model.joint is not None:
        out.update(model.joint.to_arrays("joint."))
    return out


def model_from_arrays(arrays: Mapping[str, NDArray]) -> MinderModel:
    metrics = tuple(str(m) for m in arrays["metrics"])
    denoisers = {
        name: VaeWeights.from_arrays(arrays, f"vae{i}.")
        for i, name in enumerate(metrics)
        if f"vae{i}.window" in arrays
    }
    joint = VaeWeights.from_arrays(arrays, "joint.") if "joint.window" in arrays else None
    thresholds = {
        str(n): float(v)
        for n, v in zip(arrays["threshold_names"], arrays["threshold_values"], strict=True)
    }
    peer_scale = {
        str(n): float(v)
        for n, v in zip(
            arrays.get("peer_scale_names", ()), arrays.get("peer_scale_values", ()), strict=True
        )
    }
    return MinderModel(
        metrics=metrics,
        denoisers=denoisers,
        priority=tuple(str(p) for p in arrays["priority"]),
        thresholds=thresholds,
        joint=joint,
        peer_scale=peer_scale,
    )
