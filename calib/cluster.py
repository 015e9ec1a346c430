"""Cluster presets: processor + memory + network parts, loaded from simconfigs/<name>.yaml and validated.

Every number in a preset is a `{value, source}` pair naming the datasheet it comes from, or carries
`calibrated: <domain>.<parameter>` meaning a calibration file replaces it at projection time (the
value is then the datasheet fallback used when the calibration lacks that domain). Units are SI
and named by the key (`_bytes`, `_bytes_per_s`, `_s`, `_w`, `_flops_per_s`).

Network convention (docs/DESIGN.md): dimension 0 is the node's GPU fabric (NVSwitch or Infinity
Fabric), dimension 1 one switch per rail across nodes (a GPU reaches the GPUs of the same rail in
other nodes through its own NIC), an optional dimension 2 the spine above groups of
`nodes_per_leaf` nodes, with its oversubscription dividing the bandwidth. A cluster of at most one
node is one dimension of that many GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from calib.errors import CalibError
from calib.sim.config import TOPOLOGIES, Dim, NetworkConfig, SystemConfig
from calib.units import bytes_per_s_to_astra_bw_gbps, bytes_per_s_to_astra_local_mem_bw
from calib.yamlio import load_yaml

SIMCONFIGS = Path(__file__).resolve().parent.parent / "simconfigs"
SCHEMA = "calib.cluster/1"
MAX_GPUS = 32768


@dataclass(frozen=True)
class Value:
    """A configured number with its source, or a calibrated one with its datasheet fallback."""

    value: float
    source: str
    calibrated: str = ""  # "<domain>.<parameter>" in the calibration's network astra_sim section

    def provenance(self) -> str:
        return f"configured: {self.source}"


@dataclass(frozen=True)
class NetDim:
    name: str
    scope: str  # node | rail | spine
    topology: str
    bandwidth: Value  # bytes/s per GPU per direction
    latency: Value  # seconds per hop
    description: str = ""


@dataclass
class ClusterPreset:
    name: str
    description: str
    gpu: str  # GPU model, as a calibration's `gpu` names it (H200, H100, MI250)
    gpus_per_node: int
    processor: dict[str, Value]
    memory: dict[str, Value]
    dims: list[NetDim]
    nodes_per_leaf: int = 0  # 0: no spine dimension
    spine_oversubscription: float = 1.0
    max_gpus: int = MAX_GPUS
    endpoint_delay: Value = field(default_factory=lambda: Value(10e-9, "ASTRA-sim default endpoint-delay"))
    source_path: str = ""

    # --- parts ---------------------------------------------------------------------------------
    @property
    def peak_flops_per_s(self) -> float:
        return self.processor["peak_bf16_flops_per_s"].value

    @property
    def tdp_w(self) -> float:
        return self.processor["tdp_w"].value

    @property
    def hbm_bytes(self) -> float:
        return self.memory["hbm_bytes"].value

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.memory["hbm_bandwidth_bytes_per_s"].value

    def check_gpus(self, gpus: int) -> None:
        if not isinstance(gpus, int) or gpus < 1:
            raise CalibError(f"cluster {self.name}: GPU count must be a positive integer, got {gpus!r}")
        if gpus > self.max_gpus:
            raise CalibError(f"cluster {self.name}: at most {self.max_gpus} GPUs, asked for {gpus}")
        if gpus > self.gpus_per_node and gpus % self.gpus_per_node:
            raise CalibError(
                f"cluster {self.name}: {gpus} GPUs is more than one node and not a multiple of the node size "
                f"{self.gpus_per_node}"
            )

    def _dim(self, scope: str) -> NetDim | None:
        return next((d for d in self.dims if d.scope == scope), None)

    def network_dims(self, gpus: int) -> list[tuple[NetDim, int, float]]:
        """(preset dimension, NPUs, bandwidth divisor) per network dimension for `gpus` GPUs."""
        self.check_gpus(gpus)
        node = self._dim("node")
        assert node is not None
        if gpus <= self.gpus_per_node:
            return [(node, gpus, 1.0)]
        nodes = gpus // self.gpus_per_node
        rail, spine = self._dim("rail"), self._dim("spine")
        if rail is None:
            raise CalibError(f"cluster {self.name}: has no inter-node (rail) network; at most {self.gpus_per_node} GPUs")
        if spine is None or self.nodes_per_leaf <= 0 or nodes <= self.nodes_per_leaf:
            return [(node, self.gpus_per_node, 1.0), (rail, nodes, 1.0)]
        if nodes % self.nodes_per_leaf == 0:
            return [(node, self.gpus_per_node, 1.0), (rail, self.nodes_per_leaf, 1.0),
                    (spine, nodes // self.nodes_per_leaf, self.spine_oversubscription)]
        # Whole nodes that do not fill the last leaf group: one rail dimension at the spine's rate
        # (the slowest path a rail message may take).
        return [(node, self.gpus_per_node, 1.0), (spine, nodes, self.spine_oversubscription)]

    def network(self, gpus: int) -> NetworkConfig:
        """ASTRA-sim network for `gpus` GPUs with the preset's (configured) values; a calibration
        replaces the calibrated ones (Calibration.astra_network: dimension 0 <- "intra", others <- "inter")."""
        dims = []
        for d, npus, div in self.network_dims(gpus):
            bw = bytes_per_s_to_astra_bw_gbps(d.bandwidth.value) / div
            dims.append(Dim(d.topology, npus, bw, d.latency.value * 1e9))
        return NetworkConfig(tuple(dims))

    def system(self, gpus: int = 1) -> SystemConfig:
        """ASTRA-sim system configuration: ring collectives on every dimension, the HBM bandwidth as
        local-mem-bw and the peak rate as peak-perf (used only when roofline compute is enabled)."""
        ndims = len(self.network_dims(gpus))
        ring = ["ring"] * ndims
        return SystemConfig(
            scheduling_policy="LIFO", endpoint_delay_ns=max(1, int(round(self.endpoint_delay.value * 1e9))),
            active_chunks_per_dimension=1, preferred_dataset_splits=1, collective_optimization="localBWAware",
            local_mem_bw_gbps=bytes_per_s_to_astra_local_mem_bw(self.hbm_bytes_per_s),
            peak_perf_tflops=self.peak_flops_per_s / 1e12, roofline_enabled=False,
            all_reduce_impl=list(ring), all_gather_impl=list(ring), reduce_scatter_impl=list(ring),
            all_to_all_impl=list(ring),
        )

    def provenance(self, gpus: int) -> dict[str, Value]:
        """Every preset value used for `gpus` GPUs, by parameter name (network.<dim>.<what>, processor.*, memory.*)."""
        out: dict[str, Value] = {}
        for d, _, div in self.network_dims(gpus):
            out[f"network.{d.name}.bandwidth"] = d.bandwidth
            out[f"network.{d.name}.latency"] = d.latency
            if div != 1.0:
                out["network.spine_oversubscription"] = Value(div, "preset spine_oversubscription")
        out["network.endpoint_delay"] = self.endpoint_delay
        for part, values in (("processor", self.processor), ("memory", self.memory)):
            for k, v in values.items():
                out[f"{part}.{k}"] = v
        return out


# --- loading -------------------------------------------------------------------------------------


def _value(data: object, where: str) -> Value:
    if not isinstance(data, dict) or "value" not in data:
        raise CalibError(f"{where}: expected a mapping with `value` and `source`")
    try:
        value = float(data["value"])
    except (TypeError, ValueError):
        raise CalibError(f"{where}.value: not a number ({data['value']!r})") from None
    if not math.isfinite(value) or value < 0:
        raise CalibError(f"{where}.value: must be a finite non-negative number, got {value}")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise CalibError(f"{where}.source: every configured value must name its source")
    calibrated = data.get("calibrated", "")
    if calibrated and (not isinstance(calibrated, str) or "." not in calibrated):
        raise CalibError(f"{where}.calibrated: expected '<domain>.<parameter>', got {calibrated!r}")
    return Value(value, source.strip(), calibrated or "")


def _need(data: dict, key: str, where: str) -> object:
    if key not in data:
        raise CalibError(f"{where}: missing key {key!r}")
    return data[key]


def cluster_from_dict(data: dict, source: str) -> ClusterPreset:
    if not isinstance(data, dict):
        raise CalibError(f"{source}: expected a mapping")
    if data.get("schema") != SCHEMA:
        raise CalibError(f"{source}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    known = {"schema", "name", "description", "gpu", "gpus_per_node", "max_gpus", "processor", "memory", "network"}
    unknown = set(data) - known
    if unknown:
        raise CalibError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}")
    gpn = _need(data, "gpus_per_node", source)
    if not isinstance(gpn, int) or gpn < 1:
        raise CalibError(f"{source}: gpus_per_node must be a positive integer, got {gpn!r}")
    parts: dict[str, dict[str, Value]] = {}
    for part, keys in (("processor", ("peak_bf16_flops_per_s", "tdp_w")),
                       ("memory", ("hbm_bytes", "hbm_bandwidth_bytes_per_s"))):
        sec = _need(data, part, source)
        if not isinstance(sec, dict):
            raise CalibError(f"{source}: {part} must be a mapping")
        vals = {k: _value(v, f"{source}: {part}.{k}") for k, v in sec.items() if k != "name"}
        for k in keys:
            if k not in vals:
                raise CalibError(f"{source}: {part} lacks {k!r}")
            if vals[k].value <= 0:
                raise CalibError(f"{source}: {part}.{k} must be positive")
        parts[part] = vals
    net = _need(data, "network", source)
    if not isinstance(net, dict):
        raise CalibError(f"{source}: network must be a mapping")
    dims = []
    for i, d in enumerate(_need(net, "dims", f"{source}: network") or []):
        where = f"{source}: network.dims[{i}]"
        if not isinstance(d, dict):
            raise CalibError(f"{where}: expected a mapping")
        scope = _need(d, "scope", where)
        if scope not in ("node", "rail", "spine"):
            raise CalibError(f"{where}.scope: must be node, rail or spine, got {scope!r}")
        topo = _need(d, "topology", where)
        if topo not in TOPOLOGIES:
            raise CalibError(f"{where}.topology: must be one of {', '.join(TOPOLOGIES)}, got {topo!r}")
        bw = _value(_need(d, "bandwidth_bytes_per_s", where), f"{where}.bandwidth_bytes_per_s")
        if bw.value <= 0:
            raise CalibError(f"{where}.bandwidth_bytes_per_s: must be positive")
        lat = _value(_need(d, "latency_s", where), f"{where}.latency_s")
        dims.append(NetDim(str(d.get("name", scope)), scope, topo, bw, lat, str(d.get("description", ""))))
    if not any(d.scope == "node" for d in dims):
        raise CalibError(f"{source}: network.dims needs a dimension with scope: node")
    leaf = net.get("nodes_per_leaf", {"value": 0, "source": "no spine"})
    over = net.get("spine_oversubscription", {"value": 1.0, "source": "non-blocking"})
    leaf_v = _value(leaf, f"{source}: network.nodes_per_leaf")
    over_v = _value(over, f"{source}: network.spine_oversubscription")
    if over_v.value < 1:
        raise CalibError(f"{source}: network.spine_oversubscription must be >= 1, got {over_v.value}")
    delay = _value(net.get("endpoint_delay_s", {"value": 10e-9, "source": "ASTRA-sim default endpoint-delay"}),
                   f"{source}: network.endpoint_delay_s")
    max_gpus = data.get("max_gpus", MAX_GPUS)
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise CalibError(f"{source}: max_gpus must be a positive integer")
    return ClusterPreset(
        name=str(_need(data, "name", source)), description=str(data.get("description", "")).strip(),
        gpu=str(_need(data, "gpu", source)), gpus_per_node=gpn, processor=parts["processor"], memory=parts["memory"],
        dims=dims, nodes_per_leaf=int(leaf_v.value), spine_oversubscription=over_v.value, max_gpus=max_gpus,
        endpoint_delay=delay, source_path=source,
    )


def available() -> list[str]:
    return sorted(p.stem for p in SIMCONFIGS.glob("*.yaml"))


def load_cluster(name_or_path: str) -> ClusterPreset:
    """A preset name from simconfigs/ (`dgx-h200`) or a path to a preset YAML file."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = SIMCONFIGS / f"{name_or_path}.yaml"
    if not path.is_file():
        raise CalibError(f"unknown cluster {name_or_path!r}; presets: {', '.join(available())} (or a YAML file)")
    data = load_yaml(path, "cluster file")
    return cluster_from_dict(data, str(path))
