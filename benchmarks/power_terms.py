"""Power-model terms: which ones earn their place in the energy-per-step error.

    python benchmarks/power_terms.py [BUNDLE_DIR]      # default: traces/h200

Fits calib.models.power on the bundle directory's power points and prints, per variant, the
leave-one-configuration-out error of the energy per step (what `calib fit` reports as
`power.energy_per_step`) and the fitted parameters:
- shares: the activities' time shares alone (calib before the FLOP term);
- shares + FLOP rate: the GEMM/attention FLOPs per second beside them (calib now);
- shares + FLOP rate + byte rate: the memory-bound kernels' bytes per second as well;
- the first two with the activity powers unbounded (not capped at the power limit).
Then the worst configurations of the first two variants.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
TB = 1e12


def byte_rates(bundle: object, points: list) -> list[float]:
    """Per point: memory-bound kernels' bytes per profiled step over the measured step, mean over its ranks."""
    from calib.models.power import _measured_step_s, _profiled_steps, _rank_to_gpu, activity_of

    kernels, steps = bundle.table("kernels"), bundle.table("steps")  # type: ignore[attr-defined]
    profiled = _profiled_steps(bundle)
    ranks = _rank_to_gpu(bundle, None)
    out = []
    for p in points:
        rates = []
        for r in ranks.get(p.gpu, []):
            kr = kernels[kernels["rank"] == r]
            mem = np.array([activity_of(c, n) == "memory" for c, n in zip(kr["op_class"], kr["name"], strict=True)])
            if kr.empty or not mem.any():
                continue
            work = float(pd.to_numeric(kr.loc[mem, "bytes"], errors="coerce").fillna(0).sum()) / kr["step"].nunique()
            rates.append(work / _measured_step_s(steps, r, profiled))
        out.append(float(np.mean(rates)) if rates else 0.0)
    return out


def loco(points: list, idle: list[float], limit: float, extra: np.ndarray | None, bounded: bool) -> tuple[dict, np.ndarray]:
    """(per-configuration signed error %, parameters fitted on all) of one variant. With `extra` (a
    column per point, in its own unit) the fit is done here, as PowerModel.fit does it plus that column."""
    from scipy.optimize import lsq_linear

    from calib.models.power import ACTIVITIES, PFLOP, PowerModel

    cap = limit if bounded else np.inf

    def fit(train: list[int]) -> tuple[PowerModel, float]:
        pts = [points[i] for i in train]
        if extra is None:
            return PowerModel.fit(pts, idle, power_limit_w=limit if bounded else float("nan")), 0.0
        a = np.array([[p.shares[c] for c in ACTIVITIES] + [p.flops_per_s / PFLOP, extra[i]]
                      for i, p in zip(train, pts, strict=True)])
        y = np.array([p.mean_power_w for p in pts])
        a = np.vstack([a, [0, 0, 0, 1, 0, 0]])
        y = np.append(y, float(np.median(idle)))
        sol = lsq_linear(a / y[:, None], np.ones(len(y)), bounds=(0, [cap] * 4 + [np.inf, np.inf])).x
        return PowerModel(dict(zip(ACTIVITIES, sol[:4], strict=True)), power_limit_w=limit,
                          energy_per_flop_j=float(sol[4]) / PFLOP), float(sol[5])

    def energy(m: PowerModel, per_byte: float, i: int) -> float:
        p = points[i]
        w = m.power_w(p.shares, p.flops_per_s) + (per_byte * extra[i] if extra is not None else 0.0)
        return min(w, limit) * p.step_time_s

    configs = [p.config for p in points]
    errs = {}
    for c in dict.fromkeys(configs):
        test = [i for i, k in enumerate(configs) if k == c]
        m, pb = fit([i for i, k in enumerate(configs) if k != c])
        pred = sum(energy(m, pb, i) for i in test)
        meas = sum(points[i].energy_per_step_j for i in test)
        errs[points[test[0]].bundle] = 100 * (pred / meas - 1)
    m, pb = fit(list(range(len(points))))
    params = {**{k: round(float(v), 1) for k, v in m.power_by_activity_w.items()},
              "W per PFLOP/s": round(m.energy_per_flop_j * 1e15, 1)}
    if extra is not None:
        params["W per TB/s"] = round(pb, 2)
    return errs, params


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, select_bundles
    from calib.models.power import power_points

    path = argv[0] if argv else str(ROOT / "traces" / "h200")
    points, idle, bytes_ = [], [], []
    limits = []
    for b in select_bundles(load_bundles([path]), FitOptions()):
        p, i, _ = power_points(b)
        idle += i
        points += p
        bytes_ += byte_rates(b, p) if p else []
        if p and b.manifest.gpu.power_limit_w > 0:
            limits.append(b.manifest.gpu.power_limit_w)
    limit = float(min(limits)) if limits else float("nan")
    no_flops = [dataclasses.replace(p, flops_per_s=0.0) for p in points]
    tb = np.array(bytes_) / TB
    variants = {
        "shares": (no_flops, None, True),
        "shares + FLOP rate": (points, None, True),
        "shares + FLOP rate + byte rate": (points, tb, True),
        "shares, unbounded": (no_flops, None, False),
        "shares + FLOP rate, unbounded": (points, None, False),
    }
    worst = {}
    print(f"{path}: {len(points)} GPU windows, {len({p.config for p in points})} configurations, limit {limit:g} W")
    for name, (pts, extra, bounded) in variants.items():
        errs, params = loco(pts, idle, limit, extra, bounded)
        e = np.abs(list(errs.values()))
        print(f"{name:32s} LOCO energy {e.mean():5.2f} % (max {e.max():5.1f})  {params}")
        worst[name] = errs
    for name in ("shares", "shares + FLOP rate"):
        top = sorted(worst[name].items(), key=lambda kv: -abs(kv[1]))[:6]
        print(f"worst, {name}: " + ", ".join(f"{k} {v:+.1f}" for k, v in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
