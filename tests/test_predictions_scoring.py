"""benchmarks/predictions.py: committed predictions scored against the runs they predicted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_benchmark

BUNDLE = ROOT / "traces" / "h100" / "gpt175b-1gpu-L1"


def _tree(tmp_path: Path, predictions: dict, logs: dict[str, str]) -> Path:
    gpu = tmp_path / "traces" / "h100"
    shutil.copytree(BUNDLE, gpu / "layer")
    campaign = gpu / "_campaigns" / "x1-round99"
    (campaign / "logs").mkdir(parents=True)
    (campaign / "predictions.json").write_text(json.dumps(predictions))
    for run, text in logs.items():
        (campaign / "logs" / f"{run}.log").write_text(text)
    return tmp_path / "traces"


def test_each_prediction_meets_its_run_its_out_of_memory_log_or_nothing(tmp_path: Path) -> None:
    from calib.bundle.io import load_bundles
    from calib.validation.measured import measured_step

    measured = measured_step(load_bundles([str(BUNDLE)])[0]).time_s
    traces = _tree(tmp_path, {
        "layer": {"step_time_s": measured * 1.1, "memory_verdict": "tight"},
        "too-big": {"step_time_s": 2.0, "memory_verdict": "out of memory"},
        "never": {"step_time_s": 1.0, "memory_verdict": "fits"},
        "calibration": "a string entry, not a prediction",
    }, {"too-big": "error: run failed: rank 0: out of memory: OutOfMemoryError: CUDA out of memory."})
    bench = load_benchmark("predictions")
    rows = {r.run: r for r in bench.outcomes(traces)}
    assert set(rows) == {"layer", "too-big", "never"}
    assert rows["layer"].error_pct == pytest.approx(10.0)
    assert rows["layer"].measured_s == pytest.approx(measured)
    assert rows["too-big"].measured_s is None and rows["too-big"].ran_out
    assert rows["never"].measured_s is None and not rows["never"].ran_out
    df = bench.table(list(rows.values())).set_index("run")
    assert df.loc["too-big", "outcome"] == "out of memory" and df.loc["never", "outcome"] == "not run"
    assert df.loc["layer", "outcome"] == "ran"


def test_a_prediction_is_not_matched_to_a_twin_on_another_gpu(tmp_path: Path) -> None:
    traces = _tree(tmp_path, {"layer": {"step_time_s": 0.3, "memory_verdict": "fits"}}, {})
    other = traces / "h200" / "_campaigns" / "x1-round99"
    other.mkdir(parents=True)
    (other / "predictions.json").write_text(json.dumps({"predictions": {"layer": {"step_time_s": 0.3}}}))
    rows = load_benchmark("predictions").outcomes(traces)
    by_gpu = {r.gpu: r for r in rows}
    assert by_gpu["h100"].measured_s is not None
    assert by_gpu["h200"].measured_s is None  # the H100 bundle is not the H200 run's


def test_calib_validate_reports_the_committed_predictions_of_its_runs(tmp_path: Path) -> None:
    """`calib validate` scores a validated run's committed prediction as its own kind of error, with the
    file and the calibration it was made with, in the report and the summary."""
    from calib.bundle.io import load_bundles
    from calib.validate import run_validation
    from calib.validation.measured import measured_step
    from calib.validation.types import PREDICTED

    measured = measured_step(load_bundles([str(BUNDLE)])[0]).time_s
    traces = _tree(tmp_path, {"layer": {"step_time_s": measured * 0.95, "calibration": "cal-of-the-day.yaml"},
                              "elsewhere": {"step_time_s": 1.0}}, {})
    cal = ROOT / "calib" / "data" / "calibration-h100.yaml"
    rep = run_validation([traces / "h100" / "layer"], calibration_path=cal, out_dir=tmp_path / "out", replay=False,
                         heldout=False, in_sample=False, write_calibration=False)
    [r] = rep.of_kind(PREDICTED)
    assert r.run == "layer" and r.error_pct == pytest.approx(-5.0)
    assert "x1-round99/predictions.json" in r.note and "cal-of-the-day.yaml" in r.note
    assert rep.summary["predicted_before_count"] == 1
    assert rep.summary["predicted_before_mape"] == pytest.approx(5.0)
    assert "predicted before the run" in (tmp_path / "out" / "validation.md").read_text()


def test_an_unreadable_predictions_file_is_one_clear_error(tmp_path: Path) -> None:
    from calib.errors import CalibError
    from calib.validation.prospective import read_predictions

    bad = tmp_path / "predictions.json"
    bad.write_text('{"layer": {"step_time_s": 0.3')
    with pytest.raises(CalibError, match="not a readable predictions file"):
        read_predictions(bad)


@pytest.mark.parametrize("run", ["llama8b-pp4-rcfull", "gpt175b-tp4"])
def test_round_38_was_predicted_before_it_ran(run: str) -> None:
    """Round 38 (traces/README.md): the H100's first four-stage pipeline and GPT-3 175B's layer at TP 4, predicted by
    the H100 calibration of their day and committed before the call: the measured step (calib's median over the
    slowest rank) within 3 %, peak allocated memory within 2 % on the busiest stage, device use inside the predicted
    bracket."""
    from calib.bundle.io import read_bundle
    from calib.validation.measured import measured_step
    from calib.validation.prospective import committed_predictions

    folder = ROOT / "traces" / "h100"
    bundle = folder / run
    (pred,) = committed_predictions([bundle])[bundle]
    assert pred.source == "x4-round38/predictions.json" and pred.calibration.startswith("calibration-h100.yaml")
    b = read_bundle(bundle)
    assert b.manifest.spec.tp * b.manifest.spec.pp == 4 and b.manifest.gpu.name == "NVIDIA H100 80GB HBM3"
    assert abs(pred.step_s / measured_step(b).time_s - 1) < 0.03
    raw = json.loads((folder / "_campaigns" / "x4-round38" / "predictions.json").read_text())[run]
    gib = 2**30
    peak = max(m.peak_allocated_bytes for m in b.manifest.memory) / gib
    assert abs(raw["memory_gib_per_gpu"] / peak - 1) < 0.02
    used = max(m.device_used_bytes for m in b.manifest.memory) / gib
    assert raw["device_low_gib"] <= used <= raw["device_high_gib"]
