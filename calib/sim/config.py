"""ASTRA-sim's network and system inputs as data classes, with readers and writers.

Units as ASTRA-sim spells them (the one place they enter calib): network `bandwidth` in GB/s with
GB = 2^30 bytes, `latency` in ns; system `local-mem-bw` in GB/s with GB = 10^9 bytes,
`peak-perf` in TFLOP/s, `endpoint-delay` in ns.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from calib.errors import CalibError
from calib.yamlio import load_yaml

TOPOLOGIES = ("Ring", "FullyConnected", "Switch")
IMPLEMENTATIONS = ("ring", "direct", "halvingDoubling", "doubleBinaryTree")


@dataclass(frozen=True)
class Dim:
    topology: str
    npus: int
    bandwidth_gbps: float  # GB/s, GB = 2^30 bytes
    latency_ns: float

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise CalibError(f"network topology {self.topology!r} is not one of {', '.join(TOPOLOGIES)}")
        if self.npus < 1:
            raise CalibError(f"network dimension npus must be >= 1, got {self.npus}")
        if not self.bandwidth_gbps > 0 or not math.isfinite(self.bandwidth_gbps):
            raise CalibError(f"network bandwidth must be a positive number of GB/s, got {self.bandwidth_gbps}")
        if not self.latency_ns >= 0 or not math.isfinite(self.latency_ns):
            raise CalibError(f"network latency must be >= 0 ns, got {self.latency_ns}")


@dataclass(frozen=True)
class NetworkConfig:
    dims: tuple[Dim, ...]

    @property
    def npus(self) -> int:
        return math.prod(d.npus for d in self.dims)

    def check_ranks(self, num_ranks: int) -> None:
        if self.npus != num_ranks:
            shape = " x ".join(str(d.npus) for d in self.dims)
            raise CalibError(f"network dimensions {shape} = {self.npus} NPUs do not match the workload's {num_ranks} ranks")

    @classmethod
    def from_yaml(cls, path: str | Path) -> NetworkConfig:
        p = Path(path)
        return cls.from_dict(load_yaml(p, "network configuration"), source=str(p))

    @classmethod
    def from_dict(cls, data: dict, source: str = "network") -> NetworkConfig:
        try:
            topo, npus, bw, lat = (list(data[k]) for k in ("topology", "npus_count", "bandwidth", "latency"))
        except (KeyError, TypeError) as exc:
            raise CalibError(f"{source}: needs topology, npus_count, bandwidth and latency lists ({exc})") from None
        if not len(topo) == len(npus) == len(bw) == len(lat):
            raise CalibError(f"{source}: topology, npus_count, bandwidth and latency differ in length")
        if not topo:
            raise CalibError(f"{source}: the network has no dimensions")
        try:
            dims = [(str(t), int(n), float(b), float(la)) for t, n, b, la in zip(topo, npus, bw, lat, strict=True)]
        except (TypeError, ValueError) as exc:
            raise CalibError(f"{source}: npus_count, bandwidth and latency must be numbers ({exc})") from None
        return cls(tuple(Dim(*d) for d in dims))

    def to_dict(self) -> dict:
        return {
            "topology": [d.topology for d in self.dims],
            "npus_count": [d.npus for d in self.dims],
            "bandwidth": [d.bandwidth_gbps for d in self.dims],
            "latency": [d.latency_ns for d in self.dims],
        }

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


@dataclass
class SystemConfig:
    scheduling_policy: str = "LIFO"
    endpoint_delay_ns: int = 10
    active_chunks_per_dimension: int = 1
    preferred_dataset_splits: int = 1
    collective_optimization: str = "localBWAware"
    local_mem_bw_gbps: float | None = None  # GB/s, GB = 10^9 bytes; None: reduction is free
    peak_perf_tflops: float | None = None
    roofline_enabled: bool = False
    all_reduce_impl: list[str] = field(default_factory=lambda: ["ring"])
    all_gather_impl: list[str] = field(default_factory=lambda: ["ring"])
    reduce_scatter_impl: list[str] = field(default_factory=lambda: ["ring"])
    all_to_all_impl: list[str] = field(default_factory=lambda: ["ring"])
    extra: dict = field(default_factory=dict)  # keys calib does not model, kept for round trips

    _KEYS = {
        "scheduling-policy": "scheduling_policy",
        "endpoint-delay": "endpoint_delay_ns",
        "active-chunks-per-dimension": "active_chunks_per_dimension",
        "preferred-dataset-splits": "preferred_dataset_splits",
        "collective-optimization": "collective_optimization",
        "local-mem-bw": "local_mem_bw_gbps",
        "peak-perf": "peak_perf_tflops",
        "roofline-enabled": "roofline_enabled",
        "all-reduce-implementation": "all_reduce_impl",
        "all-gather-implementation": "all_gather_impl",
        "reduce-scatter-implementation": "reduce_scatter_impl",
        "all-to-all-implementation": "all_to_all_impl",
    }

    @classmethod
    def from_json(cls, path: str | Path) -> SystemConfig:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CalibError(f"system configuration {p}: {exc}") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: dict, source: str = "system") -> SystemConfig:
        if not isinstance(data, dict):
            raise CalibError(f"{source}: expected a JSON object of ASTRA-sim system settings")
        if "preferred-dataset-splits" not in data:
            raise CalibError(f"{source}: preferred-dataset-splits is required (ASTRA-sim crashes without it)")
        kw: dict = {}
        extra: dict = {}
        for key, value in data.items():
            if key in cls._KEYS:
                kw[cls._KEYS[key]] = value
            else:
                extra[key] = value
        for key in ("all_reduce_impl", "all_gather_impl", "reduce_scatter_impl", "all_to_all_impl"):
            if key in kw:
                kw[key] = [str(v) for v in kw[key]]
                bad = [v for v in kw[key] if v not in IMPLEMENTATIONS]
                if bad:
                    raise CalibError(f"{source}: unknown collective implementation(s) {bad}")
        if "roofline_enabled" in kw:
            kw["roofline_enabled"] = bool(int(kw["roofline_enabled"])) if not isinstance(kw["roofline_enabled"], bool) else kw["roofline_enabled"]
        _check_numbers(kw, source)
        cfg = cls(**kw, extra=extra)
        if cfg.endpoint_delay_ns <= 0:
            raise CalibError(f"{source}: endpoint-delay must be >= 1 ns (ASTRA-sim aborts on 0)")
        return cfg

    def to_dict(self) -> dict:
        out: dict = {}
        for key, attr in self._KEYS.items():
            value = getattr(self, attr)
            if value is None:
                continue
            if attr == "roofline_enabled":
                value = int(value)
            out[key] = value
        out.update(self.extra)
        return out

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))


_INT_KEYS = ("endpoint_delay_ns", "active_chunks_per_dimension", "preferred_dataset_splits")
_POSITIVE_KEYS = ("local_mem_bw_gbps", "peak_perf_tflops")


def _check_numbers(kw: dict, source: str) -> None:
    """Coerce the numeric system settings in place; a bad one is a CalibError naming its JSON key."""
    json_key = {attr: key for key, attr in SystemConfig._KEYS.items()}
    for attr in _INT_KEYS:
        if attr in kw:
            v = kw[attr]
            if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or (v < 1 and attr != "endpoint_delay_ns"):
                raise CalibError(f"{source}: {json_key[attr]} must be a positive integer, got {v!r}")
            kw[attr] = int(v)
    for attr in _POSITIVE_KEYS:
        if kw.get(attr) is not None:
            v = kw[attr]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise CalibError(f"{source}: {json_key[attr]} must be a positive number, got {v!r}")
            kw[attr] = float(v)
