"""Telemetry: the sampler's failure rules and tiers, the NVML reader on a pynvml stand-in (link
scopes, one call per tier), counter unwrapping, the rate probe on the synthetic backend, and the
amdsmi reader on readings shaped as amdsmi documents them (no AMD GPU was available: untested on
hardware). All readings here are synthetic, generated in the test."""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from calib.bundle.schema import TELEMETRY_COLUMNS
from calib.errors import CalibError
from measure.telemetry import LINK_COLUMNS, Sampler, check_sample, column_rates_hz
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


class TieredFake:
    """NVML-like backend: read_fast cheap, read_links costly; the link counter is the time its read
    began (t0-based), so a test can see which row a link reading was filed in."""

    name = "tiered"

    def __init__(self, t0: float, link_cost_s: float = 0.03) -> None:
        self.t0, self.link_cost_s = t0, link_cost_s

    def read_fast(self, gpu: int) -> dict[str, float]:
        return {**FAST, **{c: v for c, v in SLOW.items() if c not in LINK_COLUMNS}}

    def read_links(self, gpu: int) -> dict[str, float]:
        began = time.monotonic() - self.t0
        time.sleep(self.link_cost_s)
        return dict.fromkeys(LINK_COLUMNS, began)


def _run_tiered(link_cost_s: float, seconds: float = 0.6, rate_hz: float = 50.0) -> Sampler:
    t0 = time.monotonic()
    s = Sampler(TieredFake(t0, link_cost_s), [0, 1], rate_hz, t0).start()
    time.sleep(seconds)
    s.stop()
    return s


def test_slow_link_reads_never_hold_back_the_fast_tier() -> None:
    s = _run_tiered(link_cost_s=0.03)
    df = s.frame()
    assert s.failure() == ""
    rates = s.tier_rates_hz()
    for gpu in (0, 1):
        sub = df[df["gpu"] == gpu]
        # Temperatures and utilisation are read with power every sample now: no NaN rows.
        assert sub[["power_w", "temp_gpu_c", "temp_hbm_c", "util_gpu"]].notna().all().all()
        assert rates["fast"][gpu] > 40  # 50 Hz asked; a 30 ms link read would cap one thread at ~25 Hz
        # A 30 ms read on a 20 ms tick: every second tick, so 25 Hz, and NaN (not a copy) in between.
        assert 18 < rates["links"][gpu] < 30
        links = sub["nvlink_tx_bytes"]
        assert 0 < links.notna().sum() < len(sub)
        assert abs(links.notna().sum() - rates["links"][gpu] * s.span_s()) <= 2
    assert s.slow_rate_hz == rates["links"]


def test_a_link_reading_lands_in_the_row_of_the_tick_it_was_read_for() -> None:
    df = _run_tiered(link_cost_s=0.005).frame()
    got = df.dropna(subset=["nvlink_tx_bytes"])
    assert len(got) > 0.8 * len(df)  # a 5 ms read keeps up with a 20 ms tick
    lag = got["nvlink_tx_bytes"] - got["t_s"]  # when the link read began, after its row's time
    assert (lag >= 0).all() and (lag < 0.012).all()  # within half a period (10 ms) and the wake-up


def test_tier_report_is_json_ready_per_tier() -> None:
    s = _run_tiered(link_cost_s=0.001, seconds=0.3)
    report = json.loads(json.dumps(s.tier_report()))
    assert set(report) == {"fast", "links"}
    assert report["links"]["columns"] == list(LINK_COLUMNS)
    assert set(report["fast"]["columns"]) | set(LINK_COLUMNS) == set(TELEMETRY_COLUMNS) - {"gpu", "t_s"}
    assert set(report["fast"]["rate_hz"]) == {"0", "1"} and report["fast"]["read_median_s"]["0"] >= 0


def test_one_tier_backend_reads_every_column_each_sample() -> None:
    s = _run(Fake(), [0], seconds=0.3)
    df = s.frame()
    assert set(s.tiers()) == {"fast"} and df.drop(columns=["gpu", "t_s"]).notna().all().all()
    assert s.slow_rate_hz[0] == pytest.approx(s.tier_rates_hz()["fast"][0])


def test_column_rates_count_only_real_samples() -> None:
    df = pd.DataFrame({c: [1.0, 2.0, 3.0, 4.0] for c in TELEMETRY_COLUMNS})
    df["gpu"] = [0, 0, 1, 1]
    df.loc[1, "nvlink_tx_bytes"] = math.nan
    rates = column_rates_hz(df, 2.0)
    assert rates[0]["power_w"] == 1.0 and rates[0]["nvlink_tx_bytes"] == 0.5 and rates[1]["nvlink_tx_bytes"] == 1.0
    with pytest.raises(CalibError, match="positive span"):
        column_rates_hz(df, 0.0)


# --- NVML, on a stand-in for pynvml that honours scopeId as nvml.h documents it ------------------

UINT_MAX = 0xFFFFFFFF


def _nvml_lib(aggregate: bool, links: int = 18, pcie: bool = True) -> SimpleNamespace:
    """Per-link NVLink counters of link k read (k + 1) KiB; the all-links scope (UINT_MAX) their
    sum where `aggregate`; scopes a GPU lacks answer NVML_ERROR_NOT_SUPPORTED (3)."""
    calls: list[list] = []

    def fv(ret: int, value: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(nvmlReturn=ret, valueType=3, value=SimpleNamespace(ullVal=int(value)))

    def field(fid: int, scope: int) -> SimpleNamespace:
        if fid in (138, 139):
            if scope == UINT_MAX:
                return fv(0, sum(k + 1 for k in range(links))) if aggregate else fv(3)
            return fv(0, scope + 1) if scope < links else fv(3)
        known = {186: 512_000, 82: 55, 197: 7_000 if pcie else None, 198: 9_000 if pcie else None}
        return fv(3) if known.get(fid) is None else fv(0, known[fid])

    def get_fields(h: object, ids: list) -> list:
        calls.append(list(ids))
        # pynvml: a (fieldId, scopeId) tuple sets the scope; a bare id leaves scopeId 0.
        return [field(*(i if isinstance(i, tuple) else (i, 0))) for i in ids]

    return SimpleNamespace(
        calls=calls,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetFieldValues=get_fields,
        nvmlDeviceGetPowerUsage=lambda h: 301_000, nvmlDeviceGetTotalEnergyConsumption=lambda h: 5_000_000,
        NVML_TEMPERATURE_GPU=0, nvmlDeviceGetTemperature=lambda h, k: 47,
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, nvmlDeviceGetClockInfo=lambda h, k: {1: 1980, 2: 3201}[k],
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=93, memory=40),
    )


def test_nvml_prefers_the_all_links_counter_in_one_call() -> None:
    from measure.telemetry.nvml import NvmlBackend

    lib = _nvml_lib(aggregate=True)
    b = NvmlBackend([1], lib=lib)
    assert b.nvlink_scope(1) == "aggregate"
    lib.calls.clear()
    row = b.read_links(1)
    assert len(lib.calls) == 1 and len(lib.calls[0]) == 4  # TX, RX (all links), PCIe TX, RX
    assert row["nvlink_tx_bytes"] == sum(range(1, 19)) * 1024.0 == row["nvlink_rx_bytes"]
    assert row["pcie_tx_bytes"] == 7000.0 and row["pcie_rx_bytes"] == 9000.0


def test_nvml_falls_back_to_summing_the_links_that_answer() -> None:
    from measure.telemetry.nvml import NvmlBackend

    lib = _nvml_lib(aggregate=False, links=4, pcie=False)
    b = NvmlBackend([0], lib=lib)
    assert b.nvlink_scope(0) == "per_link"
    lib.calls.clear()
    row = b.read_links(0)
    assert len(lib.calls) == 1 and len(lib.calls[0]) == 8  # 4 links x 2 directions, no PCIe
    assert row["nvlink_tx_bytes"] == (1 + 2 + 3 + 4) * 1024.0
    assert math.isnan(row["pcie_tx_bytes"]) and math.isnan(row["pcie_rx_bytes"])  # never 0
    totals = b.nvlink_totals_bytes(0)
    assert math.isnan(totals["aggregate"]) and totals["per_link"] == 2 * 10 * 1024.0


def test_nvml_fast_tier_has_temperatures_and_utilisation() -> None:
    from measure.telemetry.nvml import NvmlBackend

    b = NvmlBackend([0], lib=_nvml_lib(aggregate=True))
    row = b.read_fast(0)
    assert row == {"power_w": 301.0, "power_instant_w": 512.0, "energy_j": 5000.0, "temp_gpu_c": 47.0,
                   "temp_hbm_c": 55.0, "sm_clock_hz": 1.98e9, "mem_clock_hz": 3.201e9,
                   "clock_event_reasons": 1.0, "util_gpu": 0.93}
    assert set(b.read(0)) == set(TELEMETRY_COLUMNS) - {"gpu", "t_s"}
    assert set(b.calls(0)) >= {"read_fast", "read_links", "fields_nvlink_aggregate", "fields_nvlink_per_link"}


# --- the rate probe, on the synthetic backend (CPU) ----------------------------------------------

def test_rate_probe_runs_on_cpu_with_the_fake_backend(tmp_path) -> None:
    from measure.probes.telemetry_rate import main

    out = tmp_path / "rate.json"
    assert main(["--out", str(out), "--backend", "fake", "--load", "none", "--seconds", "1",
                 "--call-repeats", "3", "--gpus", "0,1"]) == 0
    data = json.loads(out.read_text())
    assert data["synthetic"] is True and data["failure"] == ""
    assert set(data["gpus"]) == {"0", "1"}
    g = data["gpus"]["0"]
    assert g["columns_hz"]["temp_gpu_c"] > 40 and g["min_column_hz"] >= 20  # fake link read: 30 ms -> 25 Hz
    assert g["unsupported_columns"] == [] and g["counter_deltas"]["nvlink_tx_bytes"] > 0
    assert data["read_s"]["links"]["0"]["median"] >= 0.03
    assert set(data["call_s"]["idle"]["1"]) == {"read_fast", "read_links"}


def test_rate_probe_bad_arguments_are_one_line(tmp_path, capsys) -> None:
    from measure.probes.telemetry_rate import main

    assert main(["--out", str(tmp_path / "x.json"), "--backend", "fake", "--seconds", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: telemetry probe: --seconds must be > 0")
    assert not (tmp_path / "x.json").exists()


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
