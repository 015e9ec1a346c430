"""calib validate on the committed GPU bundles in traces/ (skipped, saying why, when there are none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calib.bundle import load_bundles
from calib.validate import run_validation
from calib.validation.measured import is_real_gpu
from calib.validation.types import REPLAY
from tests.conftest import TRACES


def _real_training() -> list:
    if not TRACES.is_dir():
        return []
    return [b for b in load_bundles([TRACES], kinds=("training",)) if is_real_gpu(b)]


@pytest.fixture(scope="module")
def real_training() -> list:
    found = _real_training()
    if not found:
        pytest.skip(f"no real GPU training bundles under {TRACES} yet")
    return found


@pytest.mark.slow
def test_every_profiled_bundle_replays(real_training: list, tmp_path: Path) -> None:
    """Replay needs only the calibrated network: fit it on the microbenchmark bundles alone."""
    from calib.fit import fit_calibration

    micro = [b for b in load_bundles([TRACES], kinds=("collectives", "kernels"))
             if is_real_gpu(b) and "h200" in b.manifest.gpu.name.lower()]
    if not any(b.manifest.kind == "collectives" for b in micro):
        pytest.skip("no H200 collective microbenchmark bundle to calibrate the network on")
    cal = fit_calibration(micro).save(tmp_path / "cal.yaml")
    rep = run_validation([TRACES], calibration_path=cal, out_dir=tmp_path, heldout=False, in_sample=False,
                         write_calibration=False, jobs=2)
    replays = {r.run: r for r in rep.of_kind(REPLAY)}
    profiled = [b for b in real_training if b.et_files()]
    assert profiled, "no committed training bundle has converted ETs"
    for b in profiled:
        r = replays[b.id]
        if r.error_pct is None:  # only a defect of the ETs themselves may stop a replay, and it says so
            assert b.manifest.spec.pp > 1 and "hold no send/recv" in r.note, f"{b.id}: {r.note}"
            continue
        assert r.measured_step_s > 0 and r.predicted_step_s > 0
    assert rep.summary["replay_count"] + rep.summary["replay_missing"] == len(profiled)
    assert rep.summary["replay_count"] >= len(profiled) // 2
    assert rep.summary["real_bundles"] == len(real_training)
    assert (tmp_path / "validation.html").stat().st_size > 10_000
