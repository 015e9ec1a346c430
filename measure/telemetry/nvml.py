"""NVIDIA telemetry through NVML (nvidia-ml-py, imported as pynvml).

Readings and their NVML sources (units converted by calib.units):
- power_w: nvmlDeviceGetPowerUsage (mW; a ~1 s average on recent GPUs, so step energy comes from
  the energy counter over many steps), power_instant_w: field NVML_FI_DEV_POWER_INSTANT (mW).
- energy_j: nvmlDeviceGetTotalEnergyConsumption (mJ since driver load).
- temp_gpu_c: nvmlDeviceGetTemperature; temp_hbm_c: field NVML_FI_DEV_MEMORY_TEMP.
- sm_clock_hz / mem_clock_hz: nvmlDeviceGetClockInfo (MHz); clock_event_reasons:
  nvmlDeviceGetCurrentClocksEventReasons (bit mask; 0x1 = idle).
- util_gpu: nvmlDeviceGetUtilizationRates().gpu / 100.
- nvlink_tx/rx_bytes: fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (KiB counters). nvml.h: "Link
  ID needs to be specified in the scopeId field ... A scopeId of UINT_MAX returns aggregate value
  summed up across all links": the aggregate scope is used where the driver answers it (2 fields),
  else every link's scope, summed (36 fields on an 18-link H200). pynvml sets scopeId only from a
  (fieldId, scopeId) tuple; a bare id reads link 0 alone.
- pcie_tx/rx_bytes: fields NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES where the driver has them, else NaN.
Which link and PCIe fields the driver supports is probed once at start; unsupported ones are NaN
for the whole run (recorded in `fields`).

Tiers (measure.telemetry.Sampler): read_fast() is every reading but the link counters (7 plain
calls and one 2-field call); read_links() is the NVLink and PCIe counters in one field call.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from calib import units
from calib.errors import CalibError

NVLINK_MAX_LINKS = 18
SCOPE_ALL_LINKS = 0xFFFFFFFF  # UINT_MAX: the aggregate over every link
FI_POWER_INSTANT = 186
FI_MEMORY_TEMP = 82
FI_NVLINK_DATA_TX = 138
FI_NVLINK_DATA_RX = 139
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198


def _field_value(fv: object) -> float:
    """Decode one nvmlFieldValue_t; NaN when the read failed."""
    if getattr(fv, "nvmlReturn", 1) != 0:
        return math.nan
    v = fv.value  # type: ignore[attr-defined]
    kind = fv.valueType  # type: ignore[attr-defined]
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(kind, "ullVal")
    return float(getattr(v, attr))


class NvmlBackend:
    name = "nvml"

    def __init__(self, gpus: list[int] | None = None, lib: Any = None) -> None:
        if lib is None:
            try:
                import pynvml as lib  # type: ignore[no-redef]
            except ImportError:
                raise CalibError("NVML telemetry needs nvidia-ml-py (pip install nvidia-ml-py)") from None
        self.nv = lib  # pynvml, or a stand-in with its functions (tests)
        try:
            lib.nvmlInit()
            count = lib.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses
            raise CalibError(f"NVML could not start ({exc})") from None
        self.gpus = list(range(count)) if gpus is None else list(gpus)
        bad = [g for g in self.gpus if not 0 <= g < count]
        if bad:
            raise CalibError(f"NVML sees {count} GPUs; asked for GPU(s) {bad}")
        self.handles = {g: lib.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
        self.fields: dict[int, dict[str, list]] = {g: self._probe(g) for g in self.gpus}
        # NVML's PCIe byte counters are 32-bit and wrap (seen on H200, driver 580): unwrap them into
        # 64-bit totals here, per GPU and direction.
        self._wrap: dict[tuple[int, str], tuple[float, float]] = {}

    def _probe(self, gpu: int) -> dict[str, list]:
        """Which optional fields this GPU answers: ask once for each, keep those that succeed. The
        NVLink counters: the all-links scope if it answers, else the links that answer."""
        want = {
            "power_instant_w": [(FI_POWER_INSTANT, 0)],
            "temp_hbm_c": [(FI_MEMORY_TEMP, 0)],
            "pcie_tx_bytes": [(FI_PCIE_TX_BYTES, 0)],
            "pcie_rx_bytes": [(FI_PCIE_RX_BYTES, 0)],
        }
        out = {col: self._answered(gpu, ids) for col, ids in want.items()}
        for col, fid in (("nvlink_tx_bytes", FI_NVLINK_DATA_TX), ("nvlink_rx_bytes", FI_NVLINK_DATA_RX)):
            out[col] = self._answered(gpu, [(fid, SCOPE_ALL_LINKS)]) or \
                self._answered(gpu, [(fid, link) for link in range(NVLINK_MAX_LINKS)])
        return out

    def _answered(self, gpu: int, ids: list) -> list:
        try:
            values = self.nv.nvmlDeviceGetFieldValues(self.handles[gpu], ids)
        except Exception:  # noqa: BLE001 - the whole call unsupported
            return []
        return [i for i, fv in zip(ids, values, strict=False) if not math.isnan(_field_value(fv))]

    def nvlink_scope(self, gpu: int) -> str:
        """"aggregate" (one all-links field per direction), "per_link", or "none"."""
        ids = self.fields[gpu]["nvlink_tx_bytes"]
        if not ids:
            return "none"
        return "aggregate" if ids[0][1] == SCOPE_ALL_LINKS else "per_link"

    def supported(self, gpu: int) -> dict[str, bool]:
        return {col: bool(ids) for col, ids in self.fields[gpu].items()}

    def read(self, gpu: int) -> dict[str, float]:
        return {**self.read_fast(gpu), **self.read_links(gpu)}

    def _fields(self, gpu: int, cols: tuple[str, ...]) -> dict[str, float]:
        """One nvmlDeviceGetFieldValues call for the probed fields of `cols`, each column the sum
        of its fields (several only for per-link NVLink), NaN where a column has none."""
        fields = self.fields[gpu]
        ids = [i for col in cols for i in fields[col]]
        got = self.nv.nvmlDeviceGetFieldValues(self.handles[gpu], ids) if ids else []
        values = [_field_value(fv) for fv in got]
        out, k = {}, 0
        for col in cols:
            n = len(fields[col])
            out[col] = float(sum(values[k:k + n])) if n else math.nan
            k += n
        return out

    def read_fast(self, gpu: int) -> dict[str, float]:
        """Every reading but the link counters: single cheap calls, read every sample."""
        nv, h = self.nv, self.handles[gpu]
        f = self._fields(gpu, ("power_instant_w", "temp_hbm_c"))
        return {
            "power_w": units.mw_to_w(nv.nvmlDeviceGetPowerUsage(h)),
            "power_instant_w": units.mw_to_w(f["power_instant_w"]),
            "energy_j": units.mj_to_j(nv.nvmlDeviceGetTotalEnergyConsumption(h)),
            "temp_gpu_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "temp_hbm_c": f["temp_hbm_c"],
            "sm_clock_hz": units.mhz_to_hz(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "mem_clock_hz": units.mhz_to_hz(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "clock_event_reasons": float(self._reasons(h)),
            # The driver refreshes utilisation every 1/6-1 s: consecutive reads may repeat its value.
            "util_gpu": nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
        }

    def read_links(self, gpu: int) -> dict[str, float]:
        """NVLink and PCIe byte counters (cumulative), all in one field call."""
        f = self._fields(gpu, ("nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes"))
        return {
            "nvlink_tx_bytes": units.kib_to_bytes(f["nvlink_tx_bytes"]),
            "nvlink_rx_bytes": units.kib_to_bytes(f["nvlink_rx_bytes"]),
            "pcie_tx_bytes": self._unwrap(gpu, "pcie_tx_bytes", f["pcie_tx_bytes"]),
            "pcie_rx_bytes": self._unwrap(gpu, "pcie_rx_bytes", f["pcie_rx_bytes"]),
        }

    def calls(self, gpu: int) -> dict[str, Callable[[], object]]:
        """Each NVML call the tiers make, by name, for timing them one by one (the rate probe)."""
        nv, h = self.nv, self.handles[gpu]
        per_link_tx = [(FI_NVLINK_DATA_TX, link) for link in range(NVLINK_MAX_LINKS)]
        per_link_rx = [(FI_NVLINK_DATA_RX, link) for link in range(NVLINK_MAX_LINKS)]
        return {
            "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "clock_event_reasons": lambda: self._reasons(h),
            "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "fields_power_instant_hbm_temp": lambda: self._fields(gpu, ("power_instant_w", "temp_hbm_c")),
            "fields_nvlink_aggregate": lambda: nv.nvmlDeviceGetFieldValues(
                h, [(FI_NVLINK_DATA_TX, SCOPE_ALL_LINKS), (FI_NVLINK_DATA_RX, SCOPE_ALL_LINKS)]),
            "fields_nvlink_per_link": lambda: nv.nvmlDeviceGetFieldValues(h, per_link_tx + per_link_rx),
            "fields_pcie": lambda: nv.nvmlDeviceGetFieldValues(h, [(FI_PCIE_TX_BYTES, 0), (FI_PCIE_RX_BYTES, 0)]),
            "read_fast": lambda: self.read_fast(gpu),
            "read_links": lambda: self.read_links(gpu),
        }

    def nvlink_totals_bytes(self, gpu: int) -> dict[str, float]:
        """NVLink TX+RX counters read both ways back to back (all-links scope, and the per-link
        sum), so the probe can check the aggregate agrees with the links."""
        nv, h = self.nv, self.handles[gpu]
        out = {}
        for name, ids in (("aggregate", [(FI_NVLINK_DATA_TX, SCOPE_ALL_LINKS), (FI_NVLINK_DATA_RX, SCOPE_ALL_LINKS)]),
                          ("per_link", [(fid, link) for fid in (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX)
                                        for link in range(NVLINK_MAX_LINKS)])):
            try:
                vals = [_field_value(fv) for fv in nv.nvmlDeviceGetFieldValues(h, ids)]
            except Exception:  # noqa: BLE001 - unsupported on this driver
                vals = []
            good = [v for v in vals if not math.isnan(v)]
            out[name] = units.kib_to_bytes(float(sum(good))) if good else math.nan
        return out

    def _unwrap(self, gpu: int, col: str, raw: float) -> float:
        if math.isnan(raw):
            return raw
        last, offset = self._wrap.get((gpu, col), (raw, 0.0))
        if raw < last:
            offset += 2.0**32
        self._wrap[(gpu, col)] = (raw, offset)
        return raw + offset

    def _reasons(self, h: object) -> int:
        nv = self.nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(h))

    def info(self, gpu: int) -> dict:
        nv, h = self.nv, self.handles[gpu]
        name = nv.nvmlDeviceGetName(h)
        return {
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "memory_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).total),
            "driver": _text(nv.nvmlSystemGetDriverVersion()),
            "power_limit_w": units.mw_to_w(nv.nvmlDeviceGetEnforcedPowerLimit(h)),
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already shut down
            self.nv.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
