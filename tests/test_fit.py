"""calib fit end to end on synthetic bundles (tests/fitdata.py) and its refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fitdata import write_collectives, write_kernels, write_training

from calib.bundle.io import Bundle, load_bundles
from calib.calibration import Calibration
from calib.cli import main
from calib.errors import CalibError
from calib.fit import fit_calibration


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bundles")
    write_kernels(d / "kern")
    write_collectives(d / "coll")
    for i, (g, m, mbs) in enumerate([(0.5, 0.2, 1), (0.3, 0.3, 2), (0.6, 0.1, 4), (0.2, 0.5, 8)]):
        # Half the runs on GPUs 2-3 of the host: telemetry numbers GPUs physically.
        write_training(d / f"train{i}", g, m, mbs, first_gpu=2 * (i % 2))
    return d


def test_fit_everything_with_errors_and_provenance(bundle_dir: Path) -> None:
    cal = fit_calibration(load_bundles([bundle_dir]))
    assert {b["id"] for b in cal.bundles} == {"kern", "coll", "train0", "train1", "train2", "train3"}
    assert all(len(b["sha256"]) == 64 for b in cal.bundles)
    for name in ("kernel", "kernel.gemm", "kernel.memory", "network", "power.energy_per_step",
                 "network.astra_sim.intra"):
        assert name in cal.errors, name
    assert cal.errors["kernel"].method.startswith("5-fold")
    assert cal.errors["power.energy_per_step"].method.startswith("leave-one-configuration-out")
    assert cal.errors["power.energy_per_step"].count == 4
    assert cal.errors["power.energy_per_step"].mape < 1.0
    assert cal.provenance["kernel.peaks"].startswith("configured: NVIDIA H200")
    assert cal.provenance["kernel.classes"].startswith("calibrated: ")
    assert cal.provenance["network.astra_sim.inter"].startswith("not calibrated")
    assert cal.power_model().power_w({"compute": 1.0}) == pytest.approx(620.0, rel=1e-3)


def test_fit_without_cross_validation_has_the_same_parameters_and_no_errors(bundle_dir: Path) -> None:
    bundles = load_bundles([bundle_dir])
    full, bare = fit_calibration(bundles), fit_calibration(bundles, cross_validate=False)
    for section in ("kernel", "network", "power"):
        assert getattr(bare, section) == getattr(full, section), section
    assert not any(name.startswith(("kernel", "network.all_sizes", "network.trace", "network.bench")) or name == "network"
                   for name in bare.errors)
    assert "kernel" in full.errors and "network" in full.errors


def test_cli_writes_file_and_prints_tables(bundle_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cal.yaml"
    assert main(["fit", str(bundle_dir), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kernel.gemm" in text and "calibrated" in text and "configured" in text
    assert Calibration.load(out).gpu == "NVIDIA H200"


def test_mixed_gpus_refused_unless_allowed(bundle_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    other = tmp_path / "h100"
    write_collectives(other / "coll100", gpu="NVIDIA H100 80GB HBM3")
    out = tmp_path / "cal.yaml"
    assert main(["fit", str(bundle_dir), str(other), "-o", str(out)]) == 2
    assert "different GPU models" in capsys.readouterr().err
    assert not out.exists()
    assert main(["fit", str(bundle_dir), str(other), "--gpu", "h100", "-o", str(out)]) == 0
    assert Calibration.load(out).gpu.startswith("NVIDIA H100")
    cal = fit_calibration(load_bundles([bundle_dir, other]), allow_mixed_gpus=True)
    assert len(cal.bundles) == 7


def test_failed_and_partial_bundles_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    b = write_collectives(tmp_path / "bad")
    mf = b / "manifest.json"
    data = json.loads(mf.read_text())
    data.update(status="failed", failure="NCCL timeout")
    mf.write_text(json.dumps(data))
    out = tmp_path / "cal.yaml"
    assert main(["fit", str(b), "-o", str(out)]) == 2
    assert "failed run: NCCL timeout" in capsys.readouterr().err
    partial = tmp_path / "run.partial"
    partial.mkdir()
    assert main(["fit", str(partial), "-o", str(out)]) == 2
    assert "incomplete" in capsys.readouterr().err
    assert not out.exists()


def test_too_few_points_refused(tmp_path: Path) -> None:
    write_kernels(tmp_path / "tiny", n_gemm=3, n_mem=2)
    with pytest.raises(CalibError, match="too few"):
        fit_calibration(load_bundles([tmp_path]))


def test_kernel_extrapolation_checks_from_microbenchmark_labels() -> None:
    from fitdata import labelled_gemm_frame

    from calib.fit import FitOptions, fit_kernels
    from calib.models.peaks import PEAKS

    _, errors = fit_kernels(labelled_gemm_frame(), PEAKS["H200"], FitOptions())
    assert errors["kernel.tp1_from_other_tp"].count > 5
    assert errors["kernel.largest_model"].method.endswith("gpt3-175b's")
    # The known function saturates, so extrapolated efficiencies hold: small errors (noise is 1%).
    assert errors["kernel.tp1_from_other_tp"].mape < 5.0
    assert errors["kernel.largest_model"].mape < 5.0


def test_collectives_timed_each_alone_are_kernel_timed_and_an_unknown_method_is_refused(tmp_path: Path) -> None:
    """Round 42's `--timing kernel-isolated` bundle (committed packed) gives points with the training steps'
    latency, as back-to-back kernel-timed ones do; a timing method calib does not know is one clear error."""
    import tarfile

    from calib.errors import CalibError
    from calib.fit import collective_points
    from tests.conftest import TRACES

    with tarfile.open(TRACES / "h200" / "_campaigns" / "x4-round42" / "dense-iso.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    iso, b2b = (tmp_path / f"collectives-4gpu-dense-{n}" for n in ("iso", "b2b"))
    micro, _ = collective_points(load_bundles([iso, b2b]))
    assert set(micro["bundle"]) == {iso.name, b2b.name} and not micro["events"].any()
    manifest = iso / "manifest.json"
    data = json.loads(manifest.read_text())
    data["notes"]["timing_method"] = "kernel-sampled"
    manifest.write_text(json.dumps(data))
    with pytest.raises(CalibError, match="unknown method 'kernel-sampled'"):
        collective_points(load_bundles([iso]))


def test_kernel_timed_microbenchmarks_are_read_as_profiled_rows(tmp_path: Path) -> None:
    """A kernels bundle timed kernel by kernel (measure/kernels.py, timing "kernel") holds a converted profile's
    rows: its split-K reductions become memory-bound rows, its memory kernels carry their operand layout, it
    fits with the steps' floor (source "bench-kernel", not the event-timed "bench"), is scored as a
    microbenchmark, and its `case` labels drive the TP extrapolation check. An unknown method is refused."""
    from fitdata import kernel_frame, labelled_gemm_frame, manifest, memory_time

    from calib.bundle.io import BundleWriter
    from calib.fit import FitOptions, _kernel_frame, fit_kernels
    from calib.models.peaks import PEAKS

    gemms = labelled_gemm_frame()
    rows = gemms.assign(case=gemms["name"], name="nvjet_tst_128x256", start_s=np.arange(len(gemms)) * 1e-3)
    first = rows.iloc[0]
    reduce = first.to_dict() | {"name": "void cublasLt::splitKreduce_kernel<32, 16, int, float>", "time_s": 4e-6,
                                "start_s": first["start_s"] + 1e-4}
    adds = [{"rank": 0, "step": i, "stream": 7, "name": "void at::native::vectorized_elementwise_kernel<4, add>",
             "op_class": "memory", "start_s": 9.0 + i, "time_s": memory_time(3 * 2.0**p), "aten_op": "aten::add",
             "m": np.nan, "n": np.nan, "k": np.nan, "batch": np.nan, "flops": 0.0, "bytes": 3 * 2.0**p,
             "dtype": "bfloat16", "case": f"add/{2**p}"} for i, p in enumerate(range(16, 31))]
    table = pd.concat([rows, pd.DataFrame([reduce, *adds])], ignore_index=True)

    def bundle(path: Path, method: str) -> Bundle:
        w = BundleWriter(path, manifest("kernels", count=1, notes={"timing_method": method}))
        w.write_table("kernels", table)
        w.finish()
        return load_bundles([path])[0]

    frame = _kernel_frame(bundle(tmp_path / "k", "kernel"))
    assert frame is not None and set(frame["source"]) == {"bench-kernel"}
    split = frame[frame["name"].str.contains("splitKreduce")]
    assert split["op_class"].tolist() == ["memory"] and split["flops"].tolist() == [0.0]
    assert set(frame.loc[frame["aten_op"] == "aten::add", "layout"]) == {"contiguous"}
    steps = kernel_frame(n_gemm=40, n_mem=20, seed=1).assign(bundle="steps", source="trace", layout="")
    _, errors = fit_kernels(pd.concat([frame, steps], ignore_index=True), PEAKS["H200"], FitOptions())
    assert errors["kernel.bench"].count + errors["kernel.trace"].count == errors["kernel"].count
    assert errors["kernel.tp1_from_other_tp"].count > 5  # labels read from `case`, names are kernels'
    with pytest.raises(CalibError, match="timed by 'cuda-graphs'.*known: kernel, events"):
        _kernel_frame(bundle(tmp_path / "g", "cuda-graphs"))


def test_an_event_timed_kernel_bench_is_superseded_by_a_kernel_timed_one_of_its_gpu(tmp_path: Path) -> None:
    """Where a GPU model has a kernel-timed kernels bundle, its event-timed one (the host's dispatch and the power
    cap in its times) is not fitted, and the calibration says so; another GPU's event-timed bundle still is."""
    from fitdata import kernel_frame, manifest

    from calib.bundle.io import BundleWriter
    from calib.fit import kernel_rows, superseded_kernel_benches

    def bundle(name: str, gpu: str, method: str | None) -> None:
        w = BundleWriter(tmp_path / name, manifest("kernels", gpu, count=1, notes={"timing_method": method} if method else {}))
        w.write_table("kernels", kernel_frame(seed=len(name)))
        w.finish()

    bundle("h200-events", "NVIDIA H200", None)
    bundle("h200-kernel", "NVIDIA H200", "kernel")
    bundle("h100-events", "NVIDIA H100 80GB HBM3", "events")
    bundles = load_bundles([tmp_path])
    assert [b.id for b in superseded_kernel_benches(bundles)] == ["h200-events"]
    rows, used = kernel_rows(bundles)
    assert sorted(b.id for b in used) == ["h100-events", "h200-kernel"]
    assert set(rows["bundle"]) == {"h100-events", "h200-kernel"}
    cal = fit_calibration(load_bundles([tmp_path / "h200-events", tmp_path / "h200-kernel"]))
    assert "h200-events" in cal.provenance["kernel.superseded"]
