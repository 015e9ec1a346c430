"""AMD telemetry through amdsmi (ROCm's Python bindings). UNTESTED ON HARDWARE: it is unit-tested on
readings shaped as amdsmi's documentation gives them (tests/test_measure_telemetry.py), not on an
AMD GPU, since none was available.

amdsmi sources (python API, ROCm 6.x):
- power_w: amdsmi_get_power_info()["average_socket_power"] (W); power_instant_w: its
  "current_socket_power" (W) where the GPU reports it ("N/A" -> NaN).
- energy_j: amdsmi_get_energy_count() -> energy_accumulator (older releases: "power") x
  counter_resolution (uJ per count).
- temp_gpu_c: amdsmi_get_temp_metric(HOTSPOT, CURRENT) (edge where hotspot is absent); temp_hbm_c: VRAM.
- sm_clock_hz / mem_clock_hz: amdsmi_get_clock_info(GFX / MEM)["clk"] (MHz).
- clock_event_reasons: amdsmi_get_gpu_metrics_info()["throttle_status"]; util_gpu: amdsmi_get_gpu_activity()["gfx_activity"] / 100.
- nvlink_*_bytes: the XGMI accumulators of gpu_metrics (xgmi_write_data_acc / xgmi_read_data_acc,
  KB, summed over links). PCIe byte counters: not exposed as counters -> NaN.
"""

from __future__ import annotations

import math
from typing import Any

from calib import units
from calib.errors import CalibError


def _num(value: Any) -> float:
    """amdsmi writes "N/A" (or raises) for what a GPU does not support: NaN, never 0."""
    if value is None or isinstance(value, str):
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan
    if isinstance(value, dict) and "value" in value:  # newer releases: {"value": x, "unit": "W"}
        return _num(value["value"])
    return float(value)


def _acc(values: Any) -> float:
    if isinstance(values, list | tuple):
        nums = [_num(v) for v in values]
        nums = [v for v in nums if not math.isnan(v) and v < 2**63]  # unused links read as max uint64
        return float(sum(nums)) if nums else math.nan
    return _num(values)


class AmdSmiBackend:
    name = "amdsmi"

    def __init__(self, gpus: list[int] | None = None, lib: Any = None) -> None:
        if lib is None:
            try:
                import amdsmi as lib  # type: ignore[import-not-found,no-redef]
            except ImportError:
                raise CalibError("AMD telemetry needs amdsmi (ROCm's Python package)") from None
        self.lib = lib
        try:
            lib.amdsmi_init()
            handles = list(lib.amdsmi_get_processor_handles())
        except Exception as exc:  # noqa: BLE001 - AmdSmiException and friends
            raise CalibError(f"amdsmi could not start ({exc})") from None
        self.gpus = list(range(len(handles))) if gpus is None else list(gpus)
        bad = [g for g in self.gpus if not 0 <= g < len(handles)]
        if bad:
            raise CalibError(f"amdsmi sees {len(handles)} GPUs; asked for GPU(s) {bad}")
        self.handles = {g: handles[g] for g in self.gpus}

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.lib, fn)(*args)
        except Exception:  # noqa: BLE001 - unsupported on this GPU: NaN for this reading
            return None

    def read(self, gpu: int) -> dict[str, float]:
        lib, h = self.lib, self.handles[gpu]
        power = lib.amdsmi_get_power_info(h)
        energy = lib.amdsmi_get_energy_count(h)
        acc = energy.get("energy_accumulator", energy.get("power"))
        temp_type, metric = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric
        hot = self._try("amdsmi_get_temp_metric", h, temp_type.HOTSPOT, metric.CURRENT)
        if hot is None:
            hot = self._try("amdsmi_get_temp_metric", h, temp_type.EDGE, metric.CURRENT)
        vram = self._try("amdsmi_get_temp_metric", h, temp_type.VRAM, metric.CURRENT)
        gfx = self._try("amdsmi_get_clock_info", h, lib.AmdSmiClkType.GFX) or {}
        mem = self._try("amdsmi_get_clock_info", h, lib.AmdSmiClkType.MEM) or {}
        activity = self._try("amdsmi_get_gpu_activity", h) or {}
        metrics = self._try("amdsmi_get_gpu_metrics_info", h) or {}
        return {
            "power_w": _num(power.get("average_socket_power")),
            "power_instant_w": _num(power.get("current_socket_power")),
            "energy_j": units.uj_to_j(_num(acc) * _num(energy.get("counter_resolution"))),
            "temp_gpu_c": _num(hot),
            "temp_hbm_c": _num(vram),
            "sm_clock_hz": units.mhz_to_hz(_num(gfx.get("clk"))),
            "mem_clock_hz": units.mhz_to_hz(_num(mem.get("clk"))),
            "clock_event_reasons": _num(metrics.get("throttle_status")),
            "util_gpu": _num(activity.get("gfx_activity")) / 100.0,
            "nvlink_tx_bytes": units.kb_to_bytes(_acc(metrics.get("xgmi_write_data_acc"))),
            "nvlink_rx_bytes": units.kb_to_bytes(_acc(metrics.get("xgmi_read_data_acc"))),
            "pcie_tx_bytes": math.nan,
            "pcie_rx_bytes": math.nan,
        }

    def info(self, gpu: int) -> dict:
        h = self.handles[gpu]
        asic = self._try("amdsmi_get_gpu_asic_info", h) or {}
        vram = self._try("amdsmi_get_gpu_vram_info", h) or {}
        driver = self._try("amdsmi_get_gpu_driver_info", h) or {}
        power = self._try("amdsmi_get_power_info", h) or {}
        size_mb = _num(vram.get("vram_size"))
        return {
            "name": str(asic.get("market_name", "")),
            "memory_bytes": int(size_mb * 2**20) if not math.isnan(size_mb) else 0,
            "driver": str(driver.get("driver_version", "")),
            "power_limit_w": _num(power.get("power_limit")),
        }

    def close(self) -> None:
        self._try("amdsmi_shut_down")
