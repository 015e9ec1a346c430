"""calib validate on the committed GPU bundles in traces/ (skipped, saying why, when there are none).

The whole set is validated by `calib validate --check` in CI; this test replays one run of each
parallelism type so that a broken replay shows up in the test suite too, in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calib.bundle import load_bundles
from calib.validate import run_validation
from calib.validation.measured import is_real_gpu, parallelism_type
from calib.validation.types import REPLAY
from tests.conftest import TRACES


def _real_training() -> list:
    if not TRACES.is_dir():
        return []
    # one GPU model: the tests calibrate on H200 microbenchmarks
    return [b for b in load_bundles([TRACES], kinds=("training",))
            if is_real_gpu(b) and b.et_files() and "h200" in b.manifest.gpu.name.lower()]


@pytest.fixture(scope="module")
def sample_runs() -> list:
    found = _real_training()
    if not found:
        pytest.skip(f"no real GPU training bundles with ETs under {TRACES} yet")
    by_type: dict[str, object] = {}
    for b in sorted(found, key=lambda b: (b.manifest.spec.tp * b.manifest.spec.pp * b.manifest.spec.dp, b.id)):
        by_type.setdefault(parallelism_type(b.manifest.spec), b)
    return list(by_type.values())


def test_one_run_of_each_parallelism_type_replays(sample_runs: list, tmp_path: Path) -> None:
    """Replay needs only the calibrated network: fit it on the microbenchmark bundles alone."""
    from calib.fit import fit_calibration

    micro = [b for b in load_bundles([TRACES], kinds=("collectives",))
             if is_real_gpu(b) and "h200" in b.manifest.gpu.name.lower()]
    if not micro:
        pytest.skip("no H200 collective microbenchmark bundle to calibrate the network on")
    cal = fit_calibration(micro).save(tmp_path / "cal.yaml")
    rep = run_validation([b.path for b in sample_runs], calibration_path=cal, out_dir=tmp_path, heldout=False,
                         in_sample=False, write_calibration=False, jobs=2)
    replays = {r.run: r for r in rep.of_kind(REPLAY)}
    assert set(replays) == {b.id for b in sample_runs}
    for b in sample_runs:
        r = replays[b.id]
        if r.error_pct is None:  # only a defect of the ETs themselves may stop a replay, and it says so
            assert b.manifest.spec.pp > 1 and "hold no send/recv" in r.note, f"{b.id}: {r.note}"
            continue
        assert r.measured_step_s > 0 and r.predicted_step_s > 0
        # measured kernels are replayed as measured: the replay cannot be shorter than the run's mean
        # per-rank compute busy time read off the same ETs
        assert r.predicted_step_s >= r.breakdown_measured_s["compute"] * 0.999
    assert rep.summary["replay_count"] >= 1
    assert (tmp_path / "validation.html").stat().st_size > 10_000


def test_held_out_kernel_errors_are_per_op_instance() -> None:
    """The kernel model is fitted on op instances (an op's kernels summed); its held-out score must
    compare like with like: a flash backward's three kernels are one op, not three over-predictions."""
    from calib.bundle.io import read_bundle
    from calib.fit import kernel_rows
    from calib.models.kernel import op_instances
    from calib.project import default_calibration_path
    from calib.validate import _kernel_errors
    from calib.validation import engine

    path = TRACES / "h200" / "llama8b-1gpu-s8192-flash"
    if not path.is_dir():
        pytest.skip(f"{path} is not committed")
    b = read_bundle(path)
    cal = engine.load_calibration(str(default_calibration_path("H200")))
    rows, _ = kernel_rows([b])
    ops = op_instances(rows)
    errs, abs_s, measured_s = _kernel_errors(b, cal)
    assert len(ops) < len(rows) and 0.95 * len(ops) <= len(errs) <= len(ops)
    assert measured_s == pytest.approx(float(rows["time_s"].sum()), rel=0.02)  # every kernel once
    assert abs_s / measured_s < 0.2  # per kernel it read 0.38: each flash kernel against its whole op
