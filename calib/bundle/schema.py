"""The measurement bundle, format calib.bundle/1 (docs/formats.md): the one definition of it.

A bundle is a folder:
    manifest.json        Manifest below (written last; its `status` says complete or failed)
    steps.parquet        STEP_COLUMNS         one row per rank and step (+ STEP_OPTIONAL_COLUMNS)
    telemetry.parquet    TELEMETRY_COLUMNS    one row per GPU and sample
    kernels.parquet      KERNEL_COLUMNS (+ shape columns)
    collectives.parquet  COLLECTIVE_COLUMNS
    host_pace.parquet    HOST_PACE_COLUMNS    one row per sample of the host's pace (training; optional)
    et/rank.N.et.xz (.et.gz in older bundles), et/comm_groups.json
Which tables a bundle has depends on its kind (REQUIRED_TABLES).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "calib.bundle/1"
KINDS = ("training", "collectives", "kernels")
STATUSES = ("complete", "failed")

STEP_COLUMNS = ["rank", "step", "start_s", "time_s", "profiled"]
# Optional: the trainer's own pace timed in its main thread just after each step, outside its timing
# (measure/own_pace.py): seconds per tiny CUDA launch and per sample of the host-pace work; NaN after a
# profiled step and, for launches, on the CPU path. Larger is slower.
STEP_OPTIONAL_COLUMNS = ["own_launch_s", "own_work_s"]
TELEMETRY_COLUMNS = [
    "gpu", "t_s", "power_w", "power_instant_w", "energy_j", "temp_gpu_c", "temp_hbm_c", "sm_clock_hz",
    "mem_clock_hz", "clock_event_reasons", "util_gpu", "nvlink_tx_bytes", "nvlink_rx_bytes",
    "pcie_tx_bytes", "pcie_rx_bytes",
]
# Readings that must never be NaN in a sample (a GPU that cannot report one omits the column's
# meaning by writing the whole column as NaN, which `check` accepts and the fit then ignores).
TELEMETRY_REQUIRED = ["gpu", "t_s", "power_w", "energy_j"]
KERNEL_COLUMNS = ["rank", "step", "stream", "name", "op_class", "start_s", "time_s"]
COLLECTIVE_COLUMNS = [
    "kind", "group_size", "bytes", "time_s", "wait_s", "transfer_s", "algbw_gbps", "busbw_gbps", "repeats",
]
# How a collectives bundle timed its calls (manifest notes.timing_method, measure/collectives.py): by their NCCL
# kernels (back to back, or each alone with the training steps' transfer split), or with CUDA events (launch floor
# included; "events": bundles written before notes.timing_method).
KERNEL_TIMING_METHODS = ("kernel", "kernel-isolated")
EVENT_TIMING_METHODS = ("events", "events-one-call", "events-loop")
# How a kernels bundle timed its shapes (notes.timing_method, measure/kernels.py): each kernel from a converted
# profile, or CUDA events around each call ("events": also the bundles written before notes.timing_method).
KERNEL_BENCH_METHODS = ("kernel", "events")
# The host's pace beside a training run (measure/telemetry/host_pace.py): when a sample started (t_s,
# the steps' clock) and how long a fixed pure-Python workload took then (work_s): larger is slower.
HOST_PACE_COLUMNS = ["t_s", "work_s"]
TABLE_COLUMNS = {
    "steps": STEP_COLUMNS,
    "telemetry": TELEMETRY_COLUMNS,
    "kernels": KERNEL_COLUMNS,
    "collectives": COLLECTIVE_COLUMNS,
    "host_pace": HOST_PACE_COLUMNS,
}
REQUIRED_TABLES = {
    "training": ("steps",),
    "collectives": ("collectives",),
    "kernels": ("kernels",),
}


@dataclass
class GpuInfo:
    name: str = ""
    count: int = 0
    memory_bytes: int = 0
    driver: str = ""
    power_limit_w: float = 0.0
    vendor: str = "nvidia"  # nvidia | amd | cpu


@dataclass
class Software:
    python: str = ""
    torch: str = ""
    cuda: str = ""
    nccl: str = ""
    megatron_core: str = ""
    calib: str = ""


@dataclass
class RunSpec:
    """What ran: the model (preset name or architecture dict) and the parallel configuration."""

    model: Any = None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    micro_batch: int = 1
    global_batch: int = 1
    seq_length: int = 0
    dtype: str = "bf16"
    recompute: str = "none"
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    distributed_optimizer: bool = False
    attention: str = "local"  # calib.workload.parallel.ATTENTION; bundles before the flash runs: local

    def key(self) -> str:
        """Identity of the configuration: bundles that differ only in telemetry share it."""
        model = self.model if isinstance(self.model, str) else (self.model or {}).get("name", "?")
        parts = [
            str(model), f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}", f"ep{self.ep}", f"vpp{self.vpp}",
            f"sp{int(self.sequence_parallel)}", f"mbs{self.micro_batch}", f"gbs{self.global_batch}",
            f"seq{self.seq_length}", self.dtype, f"rc-{self.recompute}", f"og{int(self.overlap_grad_reduce)}",
            f"op{int(self.overlap_param_gather)}", f"do{int(self.distributed_optimizer)}",
        ]
        if self.attention != "local":  # only then, so that every earlier configuration keeps its key
            parts.append(f"attn-{self.attention}")
        return "/".join(parts)


@dataclass
class StepsInfo:
    warmup: int = 0
    measured: int = 0
    profiled: list[int] = field(default_factory=list)


@dataclass
class TelemetryInfo:
    enabled: bool = False
    rate_hz: float = 0.0
    overhead_fraction: float | None = None  # measured against a telemetry-off twin, when there is one
    backend: str = ""  # nvml | amdsmi | none
    # Samples per second of the host's pace (host_pace.parquet); 0 = not sampled (bundles before the
    # thirty-fourth session, --no-host-pace, --no-telemetry).
    host_pace_hz: float = 0.0


@dataclass
class RankMemory:
    rank: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    # Device memory used beyond torch's reserve, the most seen at the probes between steps
    # (measure.worker.memory_probe); 0 = not recorded (bundles before the twenty-fifth session, CPU).
    outside_allocator_bytes: int = 0
    device_used_bytes: int = 0  # device-wide used memory, the most seen at the probes
    probes: list[dict] = field(default_factory=list)  # [{at, used_bytes, reserved_bytes}]


@dataclass
class Manifest:
    kind: str
    status: str = "complete"
    failure: str = ""
    schema: str = SCHEMA
    created_utc: str = ""
    host: str = ""
    gpu: GpuInfo = field(default_factory=GpuInfo)
    software: Software = field(default_factory=Software)
    spec: RunSpec | None = None
    steps: StepsInfo = field(default_factory=StepsInfo)
    telemetry: TelemetryInfo = field(default_factory=TelemetryInfo)
    memory: list[RankMemory] = field(default_factory=list)
    unsupported: list[dict] = field(default_factory=list)  # [{"option": ..., "why": ...}]
    notes: dict = field(default_factory=dict)  # free-form facts about the run (e.g. benchmark params)

    @property
    def timing_method(self) -> str:
        """How a microbenchmark bundle timed its calls (KERNEL_TIMING_METHODS, EVENT_TIMING_METHODS for collectives,
        KERNEL_BENCH_METHODS for kernels); bundles written before notes.timing_method timed them with events."""
        return str((self.notes or {}).get("timing_method", "events"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        data = dict(data)
        sub = {
            "gpu": GpuInfo, "software": Software, "steps": StepsInfo, "telemetry": TelemetryInfo,
        }
        for key, klass in sub.items():
            if isinstance(data.get(key), dict):
                data[key] = _build(klass, data[key])
        if isinstance(data.get("spec"), dict):
            data["spec"] = _build(RunSpec, data["spec"])
        data["memory"] = [_build(RankMemory, m) for m in data.get("memory") or []]
        return _build(cls, data)


def _build(klass: type, data: dict) -> Any:
    """Construct a dataclass, ignoring keys from newer minor versions rather than failing."""
    names = {f.name for f in dataclasses.fields(klass)}
    return klass(**{k: v for k, v in data.items() if k in names})
