"""GPU catalogue: peak dense BF16/FP16 tensor FLOP/s and memory bandwidth per model.

Figures are the vendor's data-sheet peaks (dense, without sparsity), not what a job
achieves: a scenario only uses their *ratio* to the job's own GPU, applied to the
job's measured op times (docs/scenarios.md, "Re-timing"). Each entry names its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """Peak dense tensor TFLOP/s (BF16, FP16 where the part has no BF16) and GB/s."""

    name: str
    tflops: float
    mem_gbps: float
    source: str


_NVIDIA = "https://www.nvidia.com/"
GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("V100", 125.0, 900.0, _NVIDIA + "en-us/data-center/v100/ (SXM2, FP16 tensor)"),
        Gpu("A100-40GB", 312.0, 1555.0, _NVIDIA + "en-us/data-center/a100/ (SXM, BF16)"),
        Gpu("A100", 312.0, 2039.0, _NVIDIA + "en-us/data-center/a100/ (80GB SXM, BF16)"),
        Gpu("H100-PCIe", 756.0, 2000.0, _NVIDIA + "en-us/data-center/h100/ (PCIe, BF16)"),
        Gpu("H100", 989.0, 3350.0, _NVIDIA + "en-us/data-center/h100/ (SXM, BF16 dense)"),
        Gpu("H200", 989.0, 4800.0, _NVIDIA + "en-us/data-center/h200/ (SXM, BF16 dense)"),
        Gpu("H20", 148.0, 4000.0, "NVIDIA HGX H20 product brief (BF16 dense, 96 GB HBM3)"),
        Gpu("L40S", 362.0, 864.0, _NVIDIA + "en-us/data-center/l40s/ (BF16 dense)"),
        Gpu("B200", 2250.0, 8000.0, _NVIDIA + "en-us/data-center/hgx/ (HGX B200, per GPU)"),
    )
}
"""Model name -> figures; names as ``gpu.model=`` takes them."""
