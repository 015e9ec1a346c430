"""NVIDIA telemetry through NVML (nvidia-ml-py, imported as pynvml).

Readings and their NVML sources (units converted by calib.units):
- power_w: nvmlDeviceGetPowerUsage (mW; a ~1 s average on recent GPUs, so step energy comes from
  the energy counter over many steps), power_instant_w: field NVML_FI_DEV_POWER_INSTANT (mW).
- energy_j: nvmlDeviceGetTotalEnergyConsumption (mJ since driver load).
- temp_gpu_c: nvmlDeviceGetTemperature; temp_hbm_c: field NVML_FI_DEV_MEMORY_TEMP.
- sm_clock_hz / mem_clock_hz: nvmlDeviceGetClockInfo (MHz); clock_event_reasons:
  nvmlDeviceGetCurrentClocksEventReasons (bit mask; 0x1 = idle).
- util_gpu: nvmlDeviceGetUtilizationRates().gpu / 100.
- nvlink_tx/rx_bytes: per-link fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (KiB counters), summed.
- pcie_tx/rx_bytes: fields NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES where the driver has them, else NaN.
Which link and PCIe fields the driver supports is probed once at start; unsupported ones are NaN
for the whole run (recorded in `fields`).
"""

from __future__ import annotations

import contextlib
import math

from calib import units
from calib.errors import CalibError

NVLINK_MAX_LINKS = 18
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

    def __init__(self, gpus: list[int] | None = None) -> None:
        try:
            import pynvml
        except ImportError:
            raise CalibError("NVML telemetry needs nvidia-ml-py (pip install nvidia-ml-py)") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses
            raise CalibError(f"NVML could not start ({exc})") from None
        self.gpus = list(range(count)) if gpus is None else list(gpus)
        bad = [g for g in self.gpus if not 0 <= g < count]
        if bad:
            raise CalibError(f"NVML sees {count} GPUs; asked for GPU(s) {bad}")
        self.handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
        self.fields: dict[int, dict[str, list]] = {g: self._probe(g) for g in self.gpus}
        # NVML's PCIe byte counters are 32-bit and wrap (seen on H200, driver 580): unwrap them into
        # 64-bit totals here, per GPU and direction.
        self._wrap: dict[tuple[int, str], tuple[float, float]] = {}

    def _probe(self, gpu: int) -> dict[str, list]:
        """Which optional fields this GPU answers: ask once for each, keep those that succeed."""
        h = self.handles[gpu]
        want = {
            "power_instant_w": [(FI_POWER_INSTANT, 0)],
            "temp_hbm_c": [(FI_MEMORY_TEMP, 0)],
            "nvlink_tx_bytes": [(FI_NVLINK_DATA_TX, link) for link in range(NVLINK_MAX_LINKS)],
            "nvlink_rx_bytes": [(FI_NVLINK_DATA_RX, link) for link in range(NVLINK_MAX_LINKS)],
            "pcie_tx_bytes": [(FI_PCIE_TX_BYTES, 0)],
            "pcie_rx_bytes": [(FI_PCIE_RX_BYTES, 0)],
        }
        out: dict[str, list] = {}
        for col, ids in want.items():
            try:
                values = self.nv.nvmlDeviceGetFieldValues(h, ids)
            except Exception:  # noqa: BLE001 - the whole call unsupported
                out[col] = []
                continue
            out[col] = [i for i, fv in zip(ids, values, strict=False) if not math.isnan(_field_value(fv))]
        return out

    def supported(self, gpu: int) -> dict[str, bool]:
        return {col: bool(ids) for col, ids in self.fields[gpu].items()}

    def read(self, gpu: int) -> dict[str, float]:
        return {**self.read_fast(gpu), **self.read_slow(gpu)}

    def read_fast(self, gpu: int) -> dict[str, float]:
        """Power, energy, clocks and clock-event reasons: cheap calls, read every sample."""
        nv, h, fields = self.nv, self.handles[gpu], self.fields[gpu]
        row: dict[str, float] = {
            "power_w": units.mw_to_w(nv.nvmlDeviceGetPowerUsage(h)),
            "energy_j": units.mj_to_j(nv.nvmlDeviceGetTotalEnergyConsumption(h)),
            "sm_clock_hz": units.mhz_to_hz(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "mem_clock_hz": units.mhz_to_hz(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "clock_event_reasons": float(self._reasons(h)),
        }
        ids = fields["power_instant_w"]
        got = [_field_value(fv) for fv in nv.nvmlDeviceGetFieldValues(h, ids)] if ids else []
        row["power_instant_w"] = units.mw_to_w(float(sum(got))) if got else math.nan
        return row

    def read_slow(self, gpu: int) -> dict[str, float]:
        """Temperatures, utilisation, NVLink and PCIe counters: slower calls (many link fields)."""
        nv, h, fields = self.nv, self.handles[gpu], self.fields[gpu]
        row: dict[str, float] = {
            "temp_gpu_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "util_gpu": nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
        }
        ids = [i for col in ("temp_hbm_c", "nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes")
               for i in fields[col]]
        values = dict(zip(ids, (_field_value(fv) for fv in nv.nvmlDeviceGetFieldValues(h, ids)), strict=False)) if ids else {}

        def total(col: str) -> float:
            got = [values.get(i, math.nan) for i in fields[col]]
            return float(sum(got)) if got else math.nan

        row["temp_hbm_c"] = total("temp_hbm_c")
        row["nvlink_tx_bytes"] = units.kib_to_bytes(total("nvlink_tx_bytes"))
        row["nvlink_rx_bytes"] = units.kib_to_bytes(total("nvlink_rx_bytes"))
        row["pcie_tx_bytes"] = self._unwrap(gpu, "pcie_tx_bytes", total("pcie_tx_bytes"))
        row["pcie_rx_bytes"] = self._unwrap(gpu, "pcie_rx_bytes", total("pcie_rx_bytes"))
        return row

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
