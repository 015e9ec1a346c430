"""The environment every launched process gets, and facts about the host recorded in manifests."""

from __future__ import annotations

import os
import platform
import socket
import sys

# NVLink multicast (NVLS) is switched off everywhere: on the shared hosts a program that uses it can
# take the GPUs out of service, so every process calib launches carries these.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    # NVML numbers GPUs in PCI bus order; make CUDA do the same so CUDA_VISIBLE_DEVICES indices
    # name the same GPUs that the telemetry sampler reads.
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ + SAFE_ENV + extra (SAFE_ENV wins over a caller that tries to turn NVLS on)."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(SAFE_ENV)
    return env


def apply_safe_env() -> None:
    os.environ.update(SAFE_ENV)


def host_name() -> str:
    return socket.gethostname()


def visible_gpus() -> list[int]:
    """Physical GPU indices this process may use (CUDA_VISIBLE_DEVICES, else all NVML reports)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None and raw.strip() != "":
        try:
            return [int(x) for x in raw.split(",") if x.strip() != ""]
        except ValueError:
            return list(range(len([x for x in raw.split(",") if x.strip()])))
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (CPU host): no GPUs
        return []


def host_cpu(cpuinfo: str = "/proc/cpuinfo") -> dict[str, object]:
    """The host's CPU model and logical CPU count: the host model's cost per launch differs between
    hosts of different sizes (docs/host.md, "pace"), and only a recorded CPU can tell the machine
    from the number of processes sharing it."""
    model = ""
    try:
        with open(cpuinfo) as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model or platform.processor() or "unknown", "logical_cpus": os.cpu_count() or 0}


def software_versions() -> dict[str, str]:
    """Versions of the stack, read in the current process (torch imported here, lazily)."""
    import calib

    out = {"python": platform.python_version(), "calib": calib.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda or ""
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
        except Exception:  # noqa: BLE001 - NCCL absent in CPU builds
            out["nccl"] = ""
    except ImportError:
        pass
    try:
        import megatron.core

        out["megatron_core"] = getattr(megatron.core, "__version__", "?")
    except Exception:  # noqa: BLE001 - megatron-core is optional (CPU path)
        out["megatron_core"] = ""
    return out


def python_exe() -> str:
    return sys.executable
