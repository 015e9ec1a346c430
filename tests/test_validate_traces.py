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


def test_every_profiled_bundle_replays(real_training: list, tmp_path: Path) -> None:
    rep = run_validation([TRACES], out_dir=tmp_path, heldout=False, in_sample=False, write_calibration=False)
    replays = {r.run: r for r in rep.of_kind(REPLAY)}
    profiled = [b for b in real_training if b.et_files()]
    assert profiled, "no committed training bundle has converted ETs"
    for b in profiled:
        r = replays[b.id]
        assert r.error_pct is not None, f"{b.id}: {r.note}"
        assert r.measured_step_s > 0 and r.predicted_step_s > 0
    assert rep.summary["replay_count"] == len(profiled)
    assert rep.summary["real_bundles"] == len(real_training)
    assert (tmp_path / "validation.html").stat().st_size > 10_000
