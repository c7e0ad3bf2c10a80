"""GPU metrics through NVML (``nvidia-ml-py``, module ``pynvml``), only when importable.

Per device i: utilisation, memory used, SM clock, power, temperature, PCIe and
NVLink throughput. Any call the driver refuses is skipped for that device from then
on; a host without the module or without a GPU simply has no GPU metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GpuSampler:
    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml
        self.handles: list[Any] = []
        self._broken: set[tuple[int, str]] = set()
        self._nvlink_bytes: dict[tuple[int, str], tuple[int, float]] = {}
        if self.nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found, unused-ignore]

                pynvml.nvmlInit()
                self.nvml = pynvml
            except Exception:  # no module, no driver, no device: no GPU metrics
                return
        try:
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:
            self.handles = []

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _probes(self, h: Any) -> dict[str, Callable[[], float]]:
        n = self.nvml
        return {
            "util": lambda: float(n.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_util": lambda: float(n.nvmlDeviceGetUtilizationRates(h).memory),
            "mem_used_bytes": lambda: float(n.nvmlDeviceGetMemoryInfo(h).used),
            "sm_clock_mhz": lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "pcie_tx_Bps": lambda: (
                n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) * 1024.0
            ),
            "pcie_rx_Bps": lambda: (
                n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
            ),
        }

    def sample(self, now_ns: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, h in enumerate(self.handles):
            for name, probe in self._probes(h).items():
                if (i, name) in self._broken:
                    continue
                try:
                    out[f"gpu{i}_{name}"] = probe()
                except Exception:
                    self._broken.add((i, name))
            out.update(self._nvlink(i, h, now_ns))
        return out

    def _nvlink(self, i: int, h: Any, now_ns: int) -> dict[str, float]:
        """NVLink bytes per second from the cumulative throughput field values."""
        n = self.nvml
        out: dict[str, float] = {}
        for name, field in (
            ("tx", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
            ("rx", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
        ):
            key = (i, f"nvlink_{name}")
            if key in self._broken or not hasattr(n, field):
                continue
            try:
                value = n.nvmlDeviceGetFieldValues(h, [getattr(n, field)])[0]
                if value.nvmlReturn != 0:
                    raise RuntimeError("field not supported")
                kib = float(value.value.ullVal)
            except Exception:
                self._broken.add(key)
                continue
            prev = self._nvlink_bytes.get(key)
            self._nvlink_bytes[key] = (now_ns, kib)
            if prev is not None and now_ns > prev[0] and kib >= prev[1]:
                out[f"gpu{i}_nvlink_{name}_Bps"] = (
                    (kib - prev[1]) * 1024.0 / ((now_ns - prev[0]) / 1e9)
                )
        return out
