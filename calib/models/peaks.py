"""Configured hardware peaks: the roofline's fixed rates, each with where the number comes from.

These are not measured by calib; the kernel model fits efficiencies against them, so their exact
value only sets the scale of the reported efficiency. They are named in the calibration file's
provenance as "configured: <source>".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from calib.errors import CalibError

# Peak math rates are dense (no 2:4 sparsity); "fp32" is the non-tensor-core rate that torch uses for
# float32 matmuls unless TF32 is enabled.
_HOPPER_FLOPS = {"fp8": 1978.9e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}


@dataclass
class GpuPeaks:
    """Peak rates of one GPU model (SI: FLOP/s, bytes/s, Hz, W)."""

    name: str
    flops_per_s: dict[str, float] = field(default_factory=dict)  # by dtype
    mem_bytes_per_s: float = 0.0
    max_sm_clock_hz: float = 0.0
    tdp_w: float = 0.0
    source: str = ""
    gpus_per_node: int = 8  # GPUs behind one NVSwitch fabric on the HGX/DGX board
    sm_count: int = 132  # streaming multiprocessors (H100/H200 SXM: 132): GEMM tiles run in waves of them

    def flops_for(self, dtype: str) -> float:
        d = normalize_dtype(dtype)
        if d in self.flops_per_s:
            return self.flops_per_s[d]
        return self.flops_per_s.get("bf16", max(self.flops_per_s.values()))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GpuPeaks:
        return cls(
            name=str(data["name"]),
            flops_per_s={str(k): float(v) for k, v in (data.get("flops_per_s") or {}).items()},
            mem_bytes_per_s=float(data.get("mem_bytes_per_s", 0.0)),
            max_sm_clock_hz=float(data.get("max_sm_clock_hz", 0.0)),
            tdp_w=float(data.get("tdp_w", 0.0)),
            source=str(data.get("source", "")),
            gpus_per_node=int(data.get("gpus_per_node", 8)),
            sm_count=int(data.get("sm_count", 132)),
        )


PEAKS: dict[str, GpuPeaks] = {
    "H200": GpuPeaks(
        "H200", dict(_HOPPER_FLOPS), 4.8e12, 1.98e9, 700.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM: 989 TFLOPS dense BF16, 4.8 TB/s HBM3e, 700 W); "
        "max SM clock 1980 MHz as NVML reports it on the test hosts (reference/gpu-machines.md); 132 SMs (SXM, as H100 SXM5)",
    ),
    "H100": GpuPeaks(
        "H100", dict(_HOPPER_FLOPS), 3.35e12, 1.98e9, 700.0,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 700 W, "
        "1980 MHz max boost, 132 SMs)",
    ),
}


def normalize_dtype(dtype: object) -> str:
    """One spelling per dtype: bf16, fp16, fp32, tf32, fp8 (anything else is returned lower-cased)."""
    s = str(dtype or "").lower().replace("torch.", "").replace("c10::", "")
    if "bfloat16" in s or s in ("bf16", "bfloat"):
        return "bf16"
    if s in ("fp16", "half", "float16", "c10::half") or "float16" in s:
        return "fp16"
    if "float8" in s or s.startswith("fp8") or "e4m3" in s or "e5m2" in s:
        return "fp8"
    if s in ("tf32",):
        return "tf32"
    if s in ("fp32", "float", "float32", "single"):
        return "fp32"
    return s


def peaks_for_gpu(gpu_name: str) -> GpuPeaks:
    """The configured peaks for an NVML GPU name such as 'NVIDIA H200' or 'NVIDIA H100 80GB HBM3'."""
    upper = gpu_name.upper()
    for key, peaks in PEAKS.items():
        if key in upper:
            return peaks
    known = ", ".join(PEAKS)
    raise CalibError(f"no configured peak rates for GPU {gpu_name!r} (calib knows {known}); the roofline needs them")
