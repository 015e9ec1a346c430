"""PowerModel and activity shares on synthetic points from a known function."""

from __future__ import annotations

import numpy as np
import pytest

from calib.errors import CalibError
from calib.models.power import PowerModel, PowerPoint, exclusive_shares

P = {"compute": 600.0, "memory": 420.0, "comm": 280.0, "idle": 110.0}


def _point(i: int, shares: dict[str, float]) -> PowerPoint:
    p = sum(P[a] * v for a, v in shares.items())
    return PowerPoint("b", f"cfg{i}", 0, shares, p, p * 0.05, 0.05, 100, 5.0, p * 1.2, 1.8e9, {"sw_power_cap": 0.5})


def test_exclusive_shares_resolve_overlap_by_priority() -> None:
    # gemm 0-4, memory 4-6, comm 3-8 overlapping both; step 10 s.
    sh = exclusive_shares(np.array([0.0, 4.0, 3.0]), np.array([4.0, 6.0, 8.0]), ["compute", "memory", "comm"], 10.0)
    assert sh == pytest.approx({"compute": 0.4, "memory": 0.2, "comm": 0.2, "idle": 0.2})


def test_recovers_activity_powers_and_predicts_energy() -> None:
    rng = np.random.default_rng(0)
    pts = []
    for i in range(8):
        v = rng.dirichlet(np.ones(4))
        pts.append(_point(i, dict(zip(("compute", "memory", "comm", "idle"), v, strict=True))))
    m = PowerModel.fit(pts, max_sm_clock_hz=1.98e9)
    for a, w in P.items():
        assert m.power_by_activity_w[a] == pytest.approx(w, rel=1e-6)
    assert m.energy_j(0.1, {"compute": 1.0}) == pytest.approx(60.0)
    assert m.throttle_factor == pytest.approx(1.1)
    assert m.clock_reasons == {"sw_power_cap": 0.5}
    again = PowerModel.from_dict(m.to_dict())
    assert again.power_w({"compute": 0.5, "idle": 0.5}) == pytest.approx(355.0)


def test_too_few_windows_and_bad_shares() -> None:
    with pytest.raises(CalibError, match="need at least"):
        PowerModel.fit([_point(0, {"compute": 1.0, "memory": 0.0, "comm": 0.0, "idle": 0.0})])
    m = PowerModel(dict(P))
    with pytest.raises(CalibError, match="unknown activity"):
        m.power_w({"thinking": 1.0})


def test_power_is_capped_at_the_limit() -> None:
    rng = np.random.default_rng(1)
    pts = [_point(i, dict(zip(("compute", "memory", "comm", "idle"), rng.dirichlet(np.ones(4)), strict=True)))
           for i in range(8)]
    m = PowerModel.fit(pts, power_limit_w=500.0)
    assert all(0.0 <= v <= 500.0 for v in m.power_by_activity_w.values())
    assert m.power_w({"compute": 1.0}) <= 500.0


def _flop_point(i: int, shares: dict[str, float], rate: float, per_flop: float) -> PowerPoint:
    p = sum(P[a] * v for a, v in shares.items()) + per_flop * rate
    return PowerPoint("b", f"cfg{i}", 0, shares, p, p * 0.05, 0.05, 100, 5.0, p * 1.2, 1.8e9, {}, rate)


def test_recovers_the_energy_per_flop() -> None:
    rng = np.random.default_rng(2)
    per_flop = 3.5e-13  # J per FLOP: 350 W at 1 PFLOP/s
    pts = [_flop_point(i, dict(zip(("compute", "memory", "comm", "idle"), rng.dirichlet(np.ones(4)), strict=True)),
                       float(rng.uniform(0.0, 4e14)), per_flop) for i in range(10)]
    m = PowerModel.fit(pts)
    assert m.energy_per_flop_j == pytest.approx(per_flop, rel=1e-4)
    for a, w in P.items():
        assert m.power_by_activity_w[a] == pytest.approx(w, rel=1e-4)
    # 0.1 s of compute doing 2e13 FLOPs: 0.1 * 600 + 3.5e-13 * 2e13 J.
    assert m.energy_j(0.1, {"compute": 1.0}, flops=2e13) == pytest.approx(60.0 + 7.0, rel=1e-4)
    again = PowerModel.from_dict(m.to_dict())
    assert again.energy_per_flop_j == pytest.approx(m.energy_per_flop_j)
    old = m.to_dict()
    del old["energy_per_flop_j"]  # a file written before the FLOP term predicts from the shares alone
    assert PowerModel.from_dict(old).energy_j(0.1, {"compute": 1.0}, flops=2e13) == pytest.approx(0.1 * m.power_by_activity_w["compute"])


def test_an_activity_no_window_ran_gets_the_idle_power() -> None:
    rng = np.random.default_rng(3)
    pts = []
    for i in range(8):
        c, mem, idle = rng.dirichlet(np.ones(3))
        pts.append(_point(i, {"compute": c, "memory": mem, "comm": 0.0, "idle": idle}))
    m = PowerModel.fit(pts)
    assert m.power_by_activity_w["comm"] == pytest.approx(m.power_by_activity_w["idle"])
    assert m.unmeasured == ["comm"] and PowerModel.from_dict(m.to_dict()).unmeasured == ["comm"]
    assert m.power_by_activity_w["idle"] == pytest.approx(P["idle"], rel=1e-4)
