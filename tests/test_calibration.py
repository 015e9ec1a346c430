"""The calibration file: save (atomic), load, round trip, refusal of malformed files, ASTRA-sim export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fitdata import write_collectives, write_kernels

from calib.bundle.io import load_bundles
from calib.calibration import SCHEMA, Calibration
from calib.errors import CalibError
from calib.fit import fit_calibration
from calib.sim.config import Dim, SystemConfig


def _same(a: object, b: object) -> bool:
    """Equality with NaN equal to NaN (a calibration may hold NaN for a reading a GPU lacks)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b


@pytest.fixture(scope="module")
def cal(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    d = tmp_path_factory.mktemp("b")
    write_kernels(d / "kern")
    write_collectives(d / "coll", kinds=("all_reduce", "all_gather_into_tensor"))
    return fit_calibration(load_bundles([d]))


def test_round_trip(cal: Calibration, tmp_path: Path) -> None:
    p = cal.save(tmp_path / "c.yaml")
    assert list(tmp_path.iterdir()) == [p]  # no temp file left behind
    again = Calibration.load(p)
    assert _same(again.to_dict(), cal.to_dict())
    assert again.schema == SCHEMA
    sizes = np.array([2.0**20, 2.0**28])
    assert np.allclose(again.network_model().predict("allreduce", 8, sizes), cal.network_model().predict("allreduce", 8, sizes))
    again.validation = {"heldout_mape": 3.0, "heldout_max": 7.0, "replay_mape": 1.0, "replay_max": 2.0, "runs": []}
    again.save(p)
    assert Calibration.load(p).validation["heldout_mape"] == 3.0


def test_missing_model_and_bad_files(cal: Calibration, tmp_path: Path) -> None:
    with pytest.raises(CalibError, match="no power model"):
        cal.power_model()
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: calib.calibration/9\ngpu: x\n")
    with pytest.raises(CalibError, match="not supported"):
        Calibration.load(bad)
    bad.write_text("schema: calib.calibration/1\ngpu: x\nkernel: {classes: {gemm: {knots: [1]}}}\n")
    with pytest.raises(CalibError, match="malformed"):
        Calibration.load(bad)
    bad.write_text(": : :\n")
    with pytest.raises(CalibError, match="bad.yaml"):
        Calibration.load(bad)
    with pytest.raises(CalibError, match="does not exist"):
        Calibration.load(tmp_path / "none.yaml")


def test_astra_export(cal: Calibration) -> None:
    net = cal.astra_network([Dim("Switch", 8, 100.0, 500.0), Dim("Switch", 4, 50.0, 1000.0)])
    fit = cal.network["astra_sim"]["intra"]
    assert net.dims[0].bandwidth_gbps == fit["bandwidth_gbps"] and net.dims[0].latency_ns == fit["latency_ns"]
    assert net.dims[1].bandwidth_gbps == 50.0  # inter-node not measured: configured value kept
    prov = cal.astra_provenance(net)
    assert prov[0].startswith("calibrated") and prov[1].startswith("configured")
    sysc = cal.astra_system(SystemConfig(), ndims=2)
    assert len(sysc.all_reduce_impl) == 2 and sysc.endpoint_delay_ns == 10
