"""What a scenario may change, and what the job ran on (docs/scenarios.md, "Settings").

A scenario is a flat mapping of dotted keys to values (``network.inter_gbps=400``);
:func:`parse_settings` checks them once, with messages that name the bad key. The
job's own hardware (:class:`Hardware`) is the baseline the settings are compared
with: a change of bandwidth needs the bandwidth the job measured at, unless it is
given as a ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from rankwatch.schemas.optypes import CODE
from rankwatch.sim.scenario.catalogue import GPUS


class ScenarioError(ValueError):
    """A scenario that cannot be applied to this job (unknown key, missing baseline...)."""


_FLOAT_KEYS = {
    "network.inter_gbps": "inter-host bandwidth per GPU, Gbit/s",
    "network.intra_gbps": "intra-host bandwidth per GPU, Gbit/s",
    "network.latency_us": "latency of one hop, µs (both link classes)",
    "network.inter_x": "inter-host bandwidth multiplier",
    "network.intra_x": "intra-host bandwidth multiplier",
    "gpu.tflops": "peak dense TFLOP/s",
    "gpu.mem_gbps": "memory bandwidth, GB/s",
    "gpu.speed": "multiplier of compute and memory speed",
}
_INT_KEYS = {
    "parallel.dp": "data-parallel size",
    "parallel.pp": "pipeline-parallel size",
    "parallel.tp": "tensor-parallel size",
    "microbatches": "microbatches per step",
}
_STR_KEYS = {"gpu.model": f"a catalogue GPU: {', '.join(GPUS)}"}
_BOOL_KEYS = {"no_stragglers": "every op at its ideal cost (no straggler)"}
KEYS: dict[str, str] = {**_FLOAT_KEYS, **_INT_KEYS, **_STR_KEYS, **_BOOL_KEYS}
"""Every settable key -> what it means (for the CLI's help and error messages)."""

Settings = Mapping[str, float | int | str | bool]


def parse_settings(raw: Mapping[str, object]) -> dict[str, float | int | str | bool]:
    """Typed, checked settings from raw values (strings from the command line or numbers)."""
    out: dict[str, float | int | str | bool] = {}
    for key, value in raw.items():
        if key not in KEYS:
            raise ScenarioError(f"unknown scenario key {key!r}; known: {', '.join(KEYS)}")
        out[key] = _typed(key, value)
    return out


def _typed(key: str, value: object) -> float | int | str | bool:
    text = str(value).strip()
    if key in _BOOL_KEYS:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ScenarioError(f"{key} must be true or false, not {text!r}")
    if key in _STR_KEYS:
        if text not in GPUS:
            raise ScenarioError(f"{key}={text!r} is not in the catalogue ({', '.join(GPUS)})")
        return text
    try:
        number = float(text)
    except ValueError:
        raise ScenarioError(f"{key} must be a number, not {text!r}") from None
    if key in _INT_KEYS:
        if number != int(number) or number < 1:
            raise ScenarioError(f"{key} must be an integer >= 1, not {text!r}")
        return int(number)
    low_ok = key == "network.latency_us"
    if not math.isfinite(number) or number < 0 or (number == 0 and not low_ok):
        raise ScenarioError(f"{key} must be a positive number, not {text!r}")
    return number


@dataclass(frozen=True)
class Hardware:
    """What the job ran on (``hardware:`` in the job metadata); None where unknown.

    ``bytes`` / ``flops``: per op type, what one op moves / computes (sizes make the
    alpha-beta fit and the roofline possible). ``collective``: an op type recorded
    under a name whose algorithm differs (the workload times its gradient all-reduce
    as ``grads-reduce-scatter``).
    """

    gpu: str | None = None
    tflops: float | None = None
    mem_gbps: float | None = None
    inter_gbps: float | None = None
    intra_gbps: float | None = None
    latency_us: float | None = None
    gpus_per_host: int = 8
    bytes: Mapping[str, float] = field(default_factory=dict)
    flops: Mapping[str, float] = field(default_factory=dict)
    collective: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object] | None) -> Hardware:
        """From the ``hardware:`` mapping of a job's metadata (None: nothing known)."""
        if not raw:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ScenarioError(f"hardware: unknown key(s) {unknown}; known: {sorted(known)}")
        values: dict[str, object] = {}
        for name, value in raw.items():
            values[name] = _hardware_value(name, value)
        return cls(**values)  # type: ignore[arg-type]

    def peak(self) -> tuple[float | None, float | None]:
        """(TFLOP/s, memory GB/s) of the job's GPU: given figures, else the catalogue's."""
        entry = GPUS.get(self.gpu) if self.gpu else None
        tflops = self.tflops if self.tflops is not None else (entry.tflops if entry else None)
        mem = self.mem_gbps if self.mem_gbps is not None else (entry.mem_gbps if entry else None)
        return tflops, mem


def _hardware_value(name: str, value: object) -> object:
    if name == "gpu":
        if str(value) not in GPUS:
            raise ScenarioError(
                f"hardware.gpu {value!r} is not in the catalogue ({', '.join(GPUS)})"
            )
        return str(value)
    if name in ("bytes", "flops", "collective"):
        if not isinstance(value, Mapping) or not set(value) <= set(CODE):
            raise ScenarioError(f"hardware.{name} must map op types to values, not {value!r}")
        if name == "collective":
            return {str(k): _algorithm(str(v)) for k, v in value.items()}
        return {str(k): _positive(f"hardware.{name}.{k}", v) for k, v in value.items()}
    if name == "gpus_per_host":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScenarioError(f"hardware.gpus_per_host must be an integer >= 1, not {value!r}")
        return value
    return _positive(f"hardware.{name}", value, zero_ok=name == "latency_us")


def _positive(what: str, value: object, zero_ok: bool = False) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ScenarioError(f"{what} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero_ok):
        raise ScenarioError(f"{what} must be a positive number, not {value!r}")
    return number


ALGORITHMS = ("all-reduce", "all-gather", "reduce-scatter", "p2p")


def _algorithm(name: str) -> str:
    if name not in ALGORITHMS:
        raise ScenarioError(f"hardware.collective: {name!r} is not one of {', '.join(ALGORITHMS)}")
    return name
