"""Telemetry: the sampler's failure rules, NVML counter unwrapping, and the amdsmi reader on
readings shaped as amdsmi documents them (no AMD GPU was available: untested on hardware)."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest

from calib.bundle.schema import TELEMETRY_COLUMNS
from calib.errors import CalibError
from measure.telemetry import Sampler, check_sample
from measure.telemetry.amdsmi import AmdSmiBackend

FAST = {"power_w": 300.0, "power_instant_w": 310.0, "energy_j": 1.0, "sm_clock_hz": 1.98e9, "mem_clock_hz": 3.2e9,
        "clock_event_reasons": 0.0}
SLOW = {"temp_gpu_c": 40.0, "temp_hbm_c": 45.0, "util_gpu": 1.0, "nvlink_tx_bytes": 1e9, "nvlink_rx_bytes": 1e9,
        "pcie_tx_bytes": 1e6, "pcie_rx_bytes": 1e6}


class Fake:
    """A backend whose power goes NaN, or whose GPU vanishes, after `good` reads."""

    name = "fake"

    def __init__(self, good: int = 10**9, mode: str = "nan") -> None:
        self.good, self.mode, self.n = good, mode, 0

    def read(self, gpu: int) -> dict[str, float]:
        self.n += 1
        row = {**FAST, **SLOW, "energy_j": float(self.n)}
        if self.n > self.good:
            if self.mode == "nan":
                row["power_w"] = math.nan
            else:
                raise RuntimeError("NVMLError_GPUIsLost: GPU is lost")
        return row


def _run(backend: object, gpus: list[int], seconds: float = 0.3) -> Sampler:
    s = Sampler(backend, gpus, 100.0, time.monotonic()).start()  # type: ignore[arg-type]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not s.failure():
        time.sleep(0.01)
    s.stop()
    return s


def test_sampler_rows_follow_the_schema() -> None:
    s = _run(Fake(), [0, 1])
    df = s.frame()
    assert list(df.columns) == TELEMETRY_COLUMNS
    assert set(df["gpu"]) == {0, 1} and s.failure() == ""
    assert df["t_s"].is_monotonic_increasing
    assert s.achieved_rate_hz() > 20


def test_nan_power_stops_sampling_with_one_line() -> None:
    s = _run(Fake(good=5, mode="nan"), [3])
    assert s.failure() == "telemetry: GPU 3: power_w reading is NaN or missing"
    assert not s.frame()["power_w"].isna().any()  # the bad sample is not kept


def test_gpu_that_disappears_is_a_failure() -> None:
    s = _run(Fake(good=5, mode="lost"), [2])
    assert s.failure().startswith("telemetry: GPU 2 stopped answering mid-run (RuntimeError: NVMLError_GPUIsLost")


def test_check_sample_names_the_reading() -> None:
    with pytest.raises(CalibError, match="GPU 0: energy_j reading is NaN or missing"):
        check_sample({"gpu": 0, "t_s": 0.0, "power_w": 1.0}, "GPU 0")


class SplitFake:
    """NVML-like backend: cheap and slow readings apart, the slow ones costly."""

    name = "split"

    def read_fast(self, gpu: int) -> dict[str, float]:
        return dict(FAST)

    def read_slow(self, gpu: int) -> dict[str, float]:
        time.sleep(0.03)
        return dict(SLOW)


def test_slow_readings_thin_out_but_never_repeat_stale_values() -> None:
    s = _run(SplitFake(), [0], seconds=0.6)
    df = s.frame()
    assert df["power_w"].notna().all()
    slow = df["temp_gpu_c"].notna()
    assert 0 < slow.sum() < len(df)  # read less often than power, NaN in between
    assert s.achieved_rate_hz() > 40


def test_nvml_pcie_counters_are_unwrapped_to_64_bit() -> None:
    from measure.telemetry.nvml import NvmlBackend

    b = NvmlBackend.__new__(NvmlBackend)
    b._wrap = {}
    seen = [b._unwrap(0, "pcie_tx_bytes", v) for v in (4.29e9, 4.294e9, 1.0e6, 2.0e6)]
    assert seen[:2] == [4.29e9, 4.294e9]
    assert seen[2] == 1.0e6 + 2**32 and seen[3] == 2.0e6 + 2**32


# --- amdsmi, on readings shaped as the amdsmi Python API documents them --------------------------

class _Enum(SimpleNamespace):
    pass


def _amdsmi_lib(energy_key: str = "energy_accumulator", instant: object = 512.0) -> SimpleNamespace:
    temps = {"HOTSPOT": 61, "EDGE": 48, "VRAM": 55}
    clocks = {"GFX": {"clk": 2100, "min_clk": 500, "max_clk": 2100}, "MEM": {"clk": 1300, "min_clk": 900, "max_clk": 1300}}
    return SimpleNamespace(
        amdsmi_init=lambda *a: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["h0", "h1"],
        amdsmi_get_power_info=lambda h: {"average_socket_power": 498, "current_socket_power": instant,
                                         "gfx_voltage": 900, "power_limit": 750},
        # energy_accumulator counts of counter_resolution uJ each (older releases call it "power")
        amdsmi_get_energy_count=lambda h: {energy_key: 1_000_000, "counter_resolution": 15.3, "timestamp": 1},
        AmdSmiTemperatureType=_Enum(HOTSPOT="HOTSPOT", EDGE="EDGE", VRAM="VRAM"),
        AmdSmiTemperatureMetric=_Enum(CURRENT="CURRENT"),
        amdsmi_get_temp_metric=lambda h, t, m: temps[t],
        AmdSmiClkType=_Enum(GFX="GFX", MEM="MEM"),
        amdsmi_get_clock_info=lambda h, c: clocks[c],
        amdsmi_get_gpu_activity=lambda h: {"gfx_activity": 87, "umc_activity": 40, "mm_activity": "N/A"},
        amdsmi_get_gpu_metrics_info=lambda h: {
            "throttle_status": 0, "xgmi_read_data_acc": [1000, 2000, 2**64 - 1], "xgmi_write_data_acc": [3000, 4000, 2**64 - 1],
        },
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI250X"},
        amdsmi_get_gpu_vram_info=lambda h: {"vram_size": 65536},
        amdsmi_get_gpu_driver_info=lambda h: {"driver_version": "6.7.0"},
    )


def test_amdsmi_reader_converts_documented_readings_to_si() -> None:
    b = AmdSmiBackend([1], lib=_amdsmi_lib())
    row = b.read(1)
    assert row["power_w"] == 498.0 and row["power_instant_w"] == 512.0
    assert row["energy_j"] == pytest.approx(1_000_000 * 15.3e-6)
    assert row["temp_gpu_c"] == 61.0 and row["temp_hbm_c"] == 55.0
    assert row["sm_clock_hz"] == 2.1e9 and row["mem_clock_hz"] == 1.3e9
    assert row["util_gpu"] == pytest.approx(0.87)
    assert row["nvlink_rx_bytes"] == 3000e3 and row["nvlink_tx_bytes"] == 7000e3  # unused links (max uint64) skipped
    assert math.isnan(row["pcie_tx_bytes"])
    check_sample({**row, "gpu": 1, "t_s": 0.0}, "GPU 1")
    info = b.info(1)
    assert info == {"name": "AMD Instinct MI250X", "memory_bytes": 65536 * 2**20, "driver": "6.7.0", "power_limit_w": 750.0}


def test_amdsmi_older_key_and_na_values() -> None:
    row = AmdSmiBackend([0], lib=_amdsmi_lib(energy_key="power", instant="N/A")).read(0)
    assert row["energy_j"] == pytest.approx(15.3)
    assert math.isnan(row["power_instant_w"])  # "N/A" becomes NaN, never 0


def test_amdsmi_missing_gpu_is_one_line() -> None:
    with pytest.raises(CalibError, match=r"amdsmi sees 2 GPUs; asked for GPU\(s\) \[5\]"):
        AmdSmiBackend([5], lib=_amdsmi_lib())
