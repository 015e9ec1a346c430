"""The trainer's own launch pace as a factor on the host model's costs (calib.models.host: own_pace_factor,
HostModel.at_own_pace, own_launch_ref_s; docs/host.md, "The trainer's own pace, as a factor on the host costs")."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from calib.errors import CalibError
from calib.models.host import OWN_PACE_SLOPE, HostModel, fit_runs, own_pace_factor
from calib.models.host import _Run as Run
from tests.conftest import ROOT


def test_the_factor_is_the_pace_over_the_reference_and_one_where_either_is_unknown() -> None:
    assert OWN_PACE_SLOPE == 1.0
    assert own_pace_factor(12e-6, 8e-6) == pytest.approx(1.5)
    assert own_pace_factor(None, 8e-6) == 1.0 and own_pace_factor(12e-6, None) == 1.0
    for bad in (0.0, -1e-6, math.nan, math.inf):
        with pytest.raises(CalibError, match="own launch pace"):
            own_pace_factor(bad, 8e-6)


def test_a_host_model_at_a_pace_scales_launch_and_sync_costs_but_not_the_rendezvous() -> None:
    host = HostModel(40e-6, 700e-6, replay_launch_s=30e-6, replay_sync_s=600e-6, p2p_sync_s=1e-3,
                     tp_rendezvous_s=100e-6, replay_tp_rendezvous_s=50e-6, own_launch_ref_s=8e-6)
    slow = host.at_own_pace(12e-6)
    assert (slow.launch_s, slow.sync_s, slow.p2p_sync_s) == pytest.approx((60e-6, 1050e-6, 1.5e-3))
    assert (slow.replay_launch_s, slow.replay_sync_s, slow.replay_p2p_sync) == pytest.approx((45e-6, 900e-6, 900e-6))
    assert (slow.tp_rendezvous_s, slow.replay_tp_rendezvous_s) == (100e-6, 50e-6)
    assert host.at_own_pace(None) is host
    unreferenced = HostModel(40e-6, 700e-6)
    assert unreferenced.at_own_pace(12e-6) is unreferenced  # no fitted run timed it: nothing to scale from


def test_the_reference_round_trips_and_a_bad_one_is_refused() -> None:
    host = HostModel(40e-6, 700e-6, own_launch_ref_s=8.5e-6)
    assert HostModel.from_dict(host.to_dict()).own_launch_ref_s == 8.5e-6
    assert HostModel.from_dict(HostModel(40e-6, 700e-6).to_dict()).own_launch_ref_s is None
    for bad in (0.0, -1.0, "fast"):
        with pytest.raises(CalibError, match="own_launch_ref_s"):
            HostModel.from_dict({**host.to_dict(), "own_launch_ref_s": bad})


def _host_run(i: str, key: str, n: int, gpu: float, syncs: int, pace: float) -> Run:
    """A run whose host spent 30 us a launch and 2 ms a sync at the reference pace, times its own pace."""
    def step(c: float, s: float, p: float) -> float:
        return max(gpu, n * c) + syncs * s

    return Run(i, key, step(30e-6 * pace, 2e-3 * pace, 0.0), syncs, step, 0, ((n, syncs, 0),))


def test_runs_on_hosts_of_known_paces_give_the_reference_costs_exactly() -> None:
    paces = [0.7, 1.0, 1.35, 0.8, 1.2, 1.0, 0.9]
    shapes = [("a", 4000, 0.05, 0), ("a", 4000, 0.05, 0), ("b", 3000, 0.02, 2), ("b", 3000, 0.02, 2),
              ("c", 5000, 0.1, 4), ("d", 2000, 0.01, 1), ("d", 2000, 0.01, 1)]
    runs = [_host_run(f"{k}{i}", k, n, g, s, p) for i, ((k, n, g, s), p) in enumerate(zip(shapes, paces, strict=True))]
    blind, blind_err = fit_runs(runs)  # each host's pace unknown: one set of costs for all
    paced, paced_err = fit_runs([r.at_own_pace(p) for r, p in zip(runs, paces, strict=True)])
    assert paced.launch_s == pytest.approx(30e-6, rel=0.01) and paced.sync_s == pytest.approx(2e-3, rel=0.02)
    assert paced_err["mape"] < 1.0 < blind_err["mape"]
    # Each run's root stays what its own host needed (informative), not the reference's.
    roots = {r["id"]: r["launch_s"] for r in paced.runs}
    assert roots["a0"] == pytest.approx(0.7 * 30e-6, rel=0.02) and roots["b2"] == pytest.approx(1.35 * 30e-6, rel=0.02)
    assert [r["own_pace"] for r in paced.runs] == paces


def test_a_fast_hosts_bound_is_taken_at_the_reference_pace() -> None:
    # One configuration on a fast host (pace 0.75) and a slow one (1.0), both 60 us a launch at the reference:
    # 0.09 s and 0.12 s. The fast run alone bounds the reference cost at 0.09 / 0.75 / 2000 = 60 us, not 45.
    host = lambda c, s, p: 2000 * c  # noqa: E731
    fast = Run("f", "H", 0.09, 0, host, host_work=((2000, 0, 0),)).at_own_pace(0.75)
    assert fast.cap(0) == pytest.approx(60e-6) and fast.step(60e-6, 0.0, 0.0) == pytest.approx(0.09)
    slow = Run("s", "H", 0.12, 0, host, host_work=((2000, 0, 0),))
    model, _ = fit_runs([fast, slow], cross_validate=False)
    assert model.launch_s == pytest.approx(60e-6, rel=1e-3)


def test_a_projection_follows_the_pace_it_is_given() -> None:
    from calib.calibration import Calibration
    from calib.cluster import load_cluster
    from calib.project import project
    from calib.workload.models import resolve_model
    from calib.workload.parallel import ParallelConfig

    cal = Calibration.load(ROOT / "calib" / "data" / "calibration-h200.yaml")
    cal = copy.copy(cal)
    cal.host = {**cal.host, "own_launch_ref_s": 8e-6}
    model = resolve_model("gpt3-1.3b@L8", seq_length=256)  # host-paced on the H200 (docs/host.md)
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch=4, global_batch=16)
    cluster = load_cluster("h200-1")
    at_ref = project(model, par, cluster, cal).step_time_s
    assert project(model, par, cluster, cal, own_launch_s=8e-6).step_time_s == pytest.approx(at_ref)
    slow = project(model, par, cluster, cal, own_launch_s=12e-6)
    assert 1.2 * at_ref < slow.step_time_s < 1.5 * at_ref  # mostly host time, scaled by 1.5
    assert any("own launch pace of 12.00 us" in c for c in slow.calibrated)
    unreferenced = copy.copy(cal)
    unreferenced.host = {k: v for k, v in cal.host.items() if k != "own_launch_ref_s"}
    none = project(model, par, cluster, unreferenced, own_launch_s=12e-6)
    assert any("host costs not scaled" in n for n in none.notes)


def test_the_h200_runs_host_costs_follow_their_own_pace() -> None:
    """Each timed H200 run's root launch cost (the cost at which its simulated step meets its measured one,
    calibration-h200.yaml host.runs) over its trainer's own launch pace, per one-GPU configuration with runs on
    several leases: log against log, near the slope the model takes (OWN_PACE_SLOPE). The two-GPU configurations,
    four timed runs each on two leases since round 36, follow less (Mixtral EP 2's roots are 59-61 us at 8.3-11.0
    us a launch; docs/host.md, "The profiled step's pace")."""
    import yaml

    from calib.bundle.io import read_bundle
    from calib.validation.measured import measured_own_launch_s

    data = yaml.safe_load((ROOT / "calib" / "data" / "calibration-h200.yaml").read_text())
    by_config: dict[str, list[tuple[float, float]]] = {}
    for run in data["host"]["runs"]:
        path = ROOT / "traces" / "h200" / run["id"]
        own = measured_own_launch_s(read_bundle(path)) if path.exists() else None
        if own is not None and run.get("launch_s") and "/tp1/pp1/dp1/ep1/" in run["config"]:
            by_config.setdefault(run["config"], []).append((own, run["launch_s"]))
    fitted = {c: v for c, v in by_config.items() if len(v) >= 4}
    assert len(fitted) >= 3
    for config, pairs in fitted.items():
        x, y = np.log(np.array(pairs)).T
        slope = np.polyfit(x, y, 1)[0]
        assert 0.5 < slope < 1.5, (config, slope)
        assert np.corrcoef(x, y)[0, 1] > 0.7, config
