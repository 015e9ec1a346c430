"""The calibration file (YAML, schema "calib.calibration/1"): fitted parameters, their errors and origin.

    schema: calib.calibration/1
    created_utc, calib (version), gpu
    bundles:     [{id, sha256, kind, config}]          what was fitted on
    kernel:      KernelModel.to_dict()                 (peaks, per-class curves)
    network:     CollectiveModel.to_dict()             (series per domain/kind/group size, astra_sim)
    power:       PowerModel.to_dict()
    host:        HostModel.to_dict()
    memory:      MemoryModel.to_dict() + held_out      (allocator reserve, memory outside the allocator)
    errors:      {model: {mape, max, count, method}}   percent, cross-validated unless method says so
    validation:  {heldout_mape, heldout_max, replay_mape, replay_max, runs}   written by `calib validate`
    provenance:  {parameter: "calibrated: <bundle ids>" | "configured: <source>" | "not calibrated: <why>"}

docs/formats.md ("Calibration file") is the reference for people; this module is the one reader
and writer. Saving is atomic (temp file, then os.replace).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from calib.errors import CalibError
from calib.models.clock import ClockModel
from calib.models.common import ErrorStat
from calib.models.host import HostModel
from calib.models.kernel import KernelModel
from calib.models.memory import MemoryModel
from calib.models.network import CollectiveModel
from calib.models.power import PowerModel
from calib.sim.config import Dim, NetworkConfig, SystemConfig
from calib.yamlio import load_yaml

SCHEMA = "calib.calibration/1"
SECTIONS = ("kernel", "network", "power")


@dataclass
class Calibration:
    gpu: str
    bundles: list[dict] = field(default_factory=list)
    kernel: dict = field(default_factory=dict)
    network: dict = field(default_factory=dict)
    power: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)  # HostModel.to_dict() (calib.models.host); {} = GPU-bound
    memory: dict = field(default_factory=dict)  # MemoryModel.to_dict() + held_out (calib.models.memory)
    errors: dict[str, ErrorStat] = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    software: dict = field(default_factory=dict)  # the bundles' software stack (calib.stack); {} = not recorded
    created_utc: str = ""
    calib_version: str = ""
    schema: str = SCHEMA
    source: str = ""  # the file it was loaded from, not saved

    @property
    def id(self) -> str:
        """Short identity for projection results: the GPU and a hash over the bundles' hashes."""
        import hashlib

        h = hashlib.sha256("".join(sorted(b.get("sha256", "") for b in self.bundles)).encode()).hexdigest()[:12]
        return f"{self.gpu or 'gpu'}-{h}"

    # ---- models --------------------------------------------------------------------------
    def kernel_model(self) -> KernelModel:
        if not self.kernel:
            raise CalibError(f"calibration {self.source or self.gpu}: has no kernel model ({self._why('kernel')})")
        return KernelModel.from_dict(self.kernel)

    def network_model(self) -> CollectiveModel:
        if not self.network:
            raise CalibError(f"calibration {self.source or self.gpu}: has no network model ({self._why('network')})")
        return CollectiveModel.from_dict(self.network)

    def power_model(self) -> PowerModel:
        if not self.power:
            raise CalibError(f"calibration {self.source or self.gpu}: has no power model ({self._why('power')})")
        return PowerModel.from_dict(self.power)

    def clock_model(self) -> ClockModel | None:
        """The SM clock's slowdown under the power cap (power.clock), None where it was not fitted."""
        clock = (self.power or {}).get("clock")
        return None if not clock else ClockModel.from_dict(clock)

    def host_model(self) -> HostModel:
        if not self.host:
            raise CalibError(f"calibration {self.source or self.gpu}: has no host model ({self._why('host')})")
        return HostModel.from_dict(self.host)

    def memory_model(self) -> MemoryModel | None:
        """The allocator's reserve and the memory outside it, None in files from before they were fitted."""
        return MemoryModel.from_dict(self.memory) if self.memory else None

    def _why(self, section: str) -> str:
        return self.provenance.get(section, "not fitted")

    def astra_network(self, dims: Sequence[Dim] | NetworkConfig) -> NetworkConfig:
        """The given dimensions with calibrated bandwidth/latency where the calibration has them.

        Dimension 0 (the node's NVSwitch) takes the "intra" domain's fit, dimensions >= 1 the
        "inter" one; a dimension without a calibrated domain keeps its configured values
        (`astra_provenance` says which is which).
        """
        given = dims.dims if isinstance(dims, NetworkConfig) else tuple(dims)
        fits = self.network.get("astra_sim", {}) if self.network else {}
        out = []
        for i, d in enumerate(given):
            f = fits.get("intra" if i == 0 else "inter")
            if f:
                d = replace(d, bandwidth_gbps=float(f["bandwidth_gbps"]), latency_ns=float(f["latency_ns"]))
            out.append(d)
        return NetworkConfig(tuple(out))

    def astra_provenance(self, dims: Sequence[Dim] | NetworkConfig) -> list[str]:
        given = dims.dims if isinstance(dims, NetworkConfig) else tuple(dims)
        fits = self.network.get("astra_sim", {}) if self.network else {}
        out = []
        for i in range(len(given)):
            dom = "intra" if i == 0 else "inter"
            key = f"network.astra_sim.{dom}"
            out.append(self.provenance.get(key, "calibrated") if dom in fits else "configured: cluster preset")
        return out

    def astra_system(self, system: SystemConfig, ndims: int = 1) -> SystemConfig:
        """The system config with the calibrated endpoint delay and per-collective implementations."""
        fits = self.network.get("astra_sim", {}) if self.network else {}
        intra = fits.get("intra")
        if not intra:
            return system
        impl = intra.get("implementation", {})

        def per_dim(kind: str, current: list[str]) -> list[str]:
            first = impl.get(kind, current[0] if current else "ring")
            rest = [fits.get("inter", {}).get("implementation", {}).get(kind, first)] * (ndims - 1)
            return [first, *rest][:ndims]

        return replace(
            system,
            endpoint_delay_ns=int(round(float(intra.get("endpoint_delay_ns", system.endpoint_delay_ns)))),
            all_reduce_impl=per_dim("allreduce", system.all_reduce_impl),
            all_gather_impl=per_dim("allgather", system.all_gather_impl),
            reduce_scatter_impl=per_dim("reducescatter", system.reduce_scatter_impl),
            all_to_all_impl=per_dim("alltoall", system.all_to_all_impl),
        )

    # ---- file ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _plain({
            "schema": self.schema,
            "created_utc": self.created_utc,
            "calib": self.calib_version,
            "gpu": self.gpu,
            "bundles": self.bundles,
            "software": self.software,
            "kernel": self.kernel,
            "network": self.network,
            "power": self.power,
            "host": self.host,
            "memory": self.memory,
            "errors": {k: (v.to_dict() if isinstance(v, ErrorStat) else dict(v)) for k, v in self.errors.items()},
            "validation": self.validation,
            "provenance": self.provenance,
        })

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibration") -> Calibration:
        if not isinstance(data, dict):
            raise CalibError(f"{source}: not a calibration file (expected a YAML mapping)")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise CalibError(f"{source}: schema {schema!r} is not supported (this calib reads {SCHEMA!r})")
        if not data.get("gpu"):
            raise CalibError(f"{source}: has no gpu")
        errors = {}
        for name, e in (data.get("errors") or {}).items():
            try:
                errors[str(name)] = ErrorStat.from_dict(e)
            except (KeyError, TypeError, ValueError):
                raise CalibError(f"{source}: errors.{name} needs mape, max, count and method") from None
        for sec in (*SECTIONS, "host", "memory", "software"):
            if data.get(sec) is not None and not isinstance(data.get(sec), dict):
                raise CalibError(f"{source}: section {sec} must be a mapping")
        return cls(
            gpu=str(data["gpu"]), bundles=list(data.get("bundles") or []), kernel=dict(data.get("kernel") or {}),
            network=dict(data.get("network") or {}), power=dict(data.get("power") or {}),
            host=dict(data.get("host") or {}), memory=dict(data.get("memory") or {}), errors=errors,
            validation=dict(data.get("validation") or {}), provenance=dict(data.get("provenance") or {}),
            software=dict(data.get("software") or {}),
            created_utc=str(data.get("created_utc") or ""), calib_version=str(data.get("calib") or ""),
            source=source,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        p = Path(path)
        data = load_yaml(p, "calibration file")
        cal = cls.from_dict(data, source=str(p))
        try:  # the models must load too: a file whose sections are malformed is refused now
            for sec, build in (("kernel", cal.kernel_model), ("network", cal.network_model), ("power", cal.power_model),
                               ("host", cal.host_model), ("memory", cal.memory_model)):
                if getattr(cal, sec):
                    build()
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CalibError(f"calibration file {p}: section {sec} is malformed ({exc!r})") from None
        return cal

    @staticmethod
    def check_output(path: str | os.PathLike) -> Path:
        """Refuse an output path that cannot take the file (a folder, a parent that is a file)."""
        p = Path(path)
        if p.is_dir():
            raise CalibError(f"calibration output {p} is a folder; name a file such as {p / 'calibration.yaml'}")
        for parent in p.parents:
            if parent.exists() and not parent.is_dir():
                raise CalibError(f"calibration output {p}: {parent} is a file, not a folder")
        return p

    def save(self, path: str | os.PathLike) -> Path:
        p = self.check_output(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CalibError(f"calibration output {p}: cannot create {p.parent} ({exc.strerror})") from None
        text = "# calib calibration file; format: docs/formats.md (Calibration file)\n"
        text += yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, width=110)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        except OSError as exc:
            raise CalibError(f"calibration output {p}: cannot write in {p.parent} ({exc.strerror})") from None
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a calibration file is data to share
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p


class _Dumper(yaml.SafeDumper):
    """Mappings as blocks (one parameter a line), lists of numbers and strings inline."""


def _list_inline(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list_inline)


def _plain(value: Any) -> Any:
    """Plain YAML types only: numpy scalars become floats/ints, tuples lists (NaN is written as .nan)."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    return value
