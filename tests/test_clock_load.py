"""The synthetic-load probe of the power cap's clock (measure/probes/clock_load.py, traces/h200/_probes/clock-load-*)
against the bundled H200 calibration's clock model (benchmarks/clock_load.py)."""

from __future__ import annotations

import json
import lzma

import pytest

from tests.conftest import ROOT, load_benchmark

PROBES = sorted((ROOT / "traces" / "h200" / "_probes").glob("clock-load-*/clock-load.json.xz"))


def test_flop_share_of_a_load() -> None:
    bench = load_benchmark("clock_load")
    call_s = {"gemm/8192x8192x8192": 2e-3}
    gemm = {"load": "gemm/8192x8192x8192", "gemm_flop_rate": 5e14, "attention_flop_rate": 0.0, "busy_share": 0.7}
    add = {"load": "add/256MiB", "gemm_flop_rate": 0.0, "attention_flop_rate": 0.0, "busy_share": 1.0}
    mixed = {"load": "gemm8192+4add", "gemm_flop_rate": 4e14, "attention_flop_rate": 0.0, "busy_share": 1.0,
             "periods": 100, "calls_per_period": 3, "wall_s": 1.0}
    assert bench._flop_share(gemm, call_s) == 0.7
    assert bench._flop_share(add, call_s) == 0.0
    assert bench._flop_share(mixed, call_s) == pytest.approx(0.6)  # 300 GEMMs of 2 ms in 1 s


@pytest.mark.skipif(not PROBES, reason="no committed clock-load probe")
def test_busy_loads_meet_the_clock_model() -> None:
    """Where the GPU is busy all along, as in a training step, the GEMM rate's clock is within 3 % of the measured one
    for GEMMs followed by memory-bound adds; flash attention at full duty holds the top clock, as the model (which
    counts no attention FLOPs) says."""
    from calib.calibration import Calibration
    from calib.project import default_calibration_path

    clock = Calibration.load(str(default_calibration_path("H200"))).clock_model()
    assert clock is not None and clock.feature == "gemm_flop_rate"
    for path in PROBES:
        with lzma.open(path, "rt") as fh:
            points = json.load(fh)["points"]
        busy = [p for p in points if p["duty_target"] == 1.0]
        mixed = [p for p in busy if p["load"].startswith("gemm8192+")]
        assert mixed
        for p in mixed:
            model_hz = clock.reference_clock_hz / clock.clock_ratio(clock.step_input(0.0, p["gemm_flop_rate"]))
            assert model_hz == pytest.approx(p["sm_clock_hz"], rel=0.03), p["load"]
        flash = next(p for p in busy if p["load"].startswith("flash/"))
        assert flash["sm_clock_hz"] >= 1.97e9 and flash["attention_flop_rate"] > 2.5e14
        assert clock.clock_ratio(clock.step_input(1.0, flash["gemm_flop_rate"])) == 1.0
