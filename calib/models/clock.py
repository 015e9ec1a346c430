"""The SM clock under the power cap: how much slower GEMM and attention kernels run in a step that is
mostly GEMM and attention.

A power-capped GPU (700 W on the H200s) lowers its SM clock when its work would draw more than the
cap. The kernel model learns kernels timed in profiled steps, whose host the profiler slows: the GPU
idles more there and stays under the cap, so a GEMM-heavy run's unprofiled steps, whose time is the
measured step, run its compute-bound kernels at up to 11 % lower clock than the kernel model saw
(calib.validation.measured.profiled_clock_ratio; docs/host.md, "The power cap's clock in generated
steps"). How far the clock falls follows how much of the step the GPU spends in GEMM and attention
kernels, which a projection knows once it has simulated the step:

    slowdown(share) = 1 + slope * max(min(share, top) - knee, 0)

share: time with a GEMM or attention kernel running over the step time, those kernels at the profiled
clock (calib.models.power.measured_shares' "compute" for a measured run; the generated step's GEMM and
attention time over its simulated step for a projection); top: the largest share measured (beyond it
the slowdown is held: nothing was measured there). GEMM and attention kernels are scaled by it;
memory-bound kernels follow the HBM clock, which does not move under the cap.

Fit: one point per training bundle whose telemetry gives both clocks (the ratio of its profiled to its
measured steps' SM clock). The knee is searched on a grid over the measured shares, the slope (>= 0) is
least squares at each knee. Error: leave one configuration out, |predicted - measured| / measured
of the ratio. Where the hinge predicts held-out runs no better than no slowdown at all, the model is
flat (slope 0), and says so (`flat_mape`: the error of no slowdown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from calib.errors import CalibError
from calib.models.common import ErrorStat, error_stat, group_folds
from calib.ops import FLOP_CLASSES

KNEES = 71  # knee candidates, evenly over the measured shares
MIN_CONFIGS = 4  # configurations with both clocks below which no model is fitted


@dataclass(frozen=True)
class ClockPoint:
    """One training bundle: its GEMM/attention share of the step and its profiled / measured SM clock."""

    bundle: str
    config: str
    share: float
    ratio: float


def clock_points(bundles: Sequence[Any]) -> list[ClockPoint]:
    """The points of the training bundles whose telemetry gives both clocks (others are left out)."""
    from calib.models.power import measured_shares
    from calib.validation.measured import measured_clock_ratio

    out = []
    for b in bundles:
        m = b.manifest
        if m.kind != "training" or m.spec is None or not b.has("kernels"):
            continue
        ratio = measured_clock_ratio(b)
        if ratio is None:
            continue
        shares = measured_shares(b)
        if shares is None:
            continue
        out.append(ClockPoint(b.id, m.spec.key(), float(shares["compute"]), float(ratio)))
    return out


def _hinge(share: np.ndarray, knee: float, top: float) -> np.ndarray:
    return np.maximum(np.minimum(share, top) - knee, 0.0)


def _fit_hinge(share: np.ndarray, ratio: np.ndarray) -> tuple[float, float]:
    """(knee, slope) minimising the squared error of 1 + slope * hinge against the ratios."""
    top = float(share.max())
    best = (np.inf, float(share.min()), 0.0)
    for knee in np.linspace(float(share.min()), top, KNEES):
        h = _hinge(share, knee, top)
        hh = float(h @ h)
        slope = max(float(h @ (ratio - 1.0)) / hh, 0.0) if hh > 0 else 0.0
        sse = float(np.sum((1.0 + slope * h - ratio) ** 2))
        if sse < best[0]:
            best = (sse, float(knee), slope)
    return best[1], best[2]


@dataclass
class ClockModel:
    knee: float = 0.0
    slope: float = 0.0
    top: float = 1.0  # the largest share measured; the slowdown is held beyond it
    count: int = 0
    flat_mape: float = float("nan")  # percent: leave-one-configuration-out error of no slowdown
    points: list[dict] = field(default_factory=list)  # per bundle: id, config, share, ratio

    def slowdown(self, share: float) -> float:
        """The factor on GEMM and attention kernel times of a step with this GEMM/attention share (>= 1)."""
        if not np.isfinite(share) or share <= 0:
            return 1.0
        return float(1.0 + self.slope * _hinge(np.array([share]), self.knee, self.top)[0])

    @property
    def slows(self) -> bool:
        """Whether the model applies any slowdown (a flat fit does not)."""
        return self.slope > 0

    def beyond_measured(self, share: float) -> bool:
        return self.slows and share > self.top

    @classmethod
    def fit(cls, points: Sequence[ClockPoint]) -> tuple[ClockModel, ErrorStat]:
        """The hinge (module docstring) and its leave-one-configuration-out error; CalibError with too few points."""
        configs = [p.config for p in points]
        if len(set(configs)) < MIN_CONFIGS:
            raise CalibError(f"clock model: {len(set(configs))} configuration(s) with both SM clocks in their "
                             f"telemetry, need at least {MIN_CONFIGS}")
        share = np.array([p.share for p in points], dtype=float)
        ratio = np.array([p.ratio for p in points], dtype=float)
        if not (np.all(np.isfinite(share)) and np.all(np.isfinite(ratio)) and np.all(ratio > 0)):
            raise CalibError("clock model: a point has a non-finite share or a non-positive clock ratio")
        pred = np.empty(len(points))
        for test in group_folds(configs):
            train = np.setdiff1d(np.arange(len(points)), test)
            knee, slope = _fit_hinge(share[train], ratio[train])
            pred[test] = 1.0 + slope * _hinge(share[test], knee, float(share[train].max()))
        method = "leave-one-configuration-out, one point per bundle (SM clock ratio)"
        held, flat = error_stat(pred, ratio, method), error_stat(np.ones_like(ratio), ratio, method)
        knee, slope = _fit_hinge(share, ratio)
        if not held.mape < flat.mape:
            # The hinge predicts unseen runs no better than no slowdown: do not apply one.
            knee, slope, held = float(share.max()), 0.0, ErrorStat(flat.mape, flat.max, flat.count,
                                                                    "leave-one-configuration-out, no slowdown (the "
                                                                    "fitted hinge did no better held out)")
        rows = [{"id": p.bundle, "config": p.config, "share": round(p.share, 4), "ratio": round(p.ratio, 4)}
                for p in points]
        return cls(knee, slope, float(share.max()), len(points), flat.mape, rows), held

    def to_dict(self) -> dict:
        return {
            "form": "slowdown = 1 + slope * max(min(share, top) - knee, 0) on GEMM and attention kernels; share = "
                    "their time over the step",
            "knee": float(self.knee), "slope": float(self.slope), "top": float(self.top), "count": int(self.count),
            "flat_mape": float(self.flat_mape), "points": [dict(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ClockModel:
        if not isinstance(data, dict):
            raise CalibError("calibration power.clock: expected a mapping with knee, slope and top")
        try:
            knee, slope, top = (float(data[k]) for k in ("knee", "slope", "top"))
        except (KeyError, TypeError, ValueError):
            raise CalibError("calibration power.clock: knee, slope and top must be numbers") from None
        if not all(np.isfinite(v) for v in (knee, slope, top)) or slope < 0 or not 0 <= knee <= max(top, 0.0) <= 1:
            raise CalibError(f"calibration power.clock: knee {knee}, slope {slope}, top {top}: expected 0 <= knee <= "
                             "top <= 1 and a finite slope >= 0")
        return cls(knee, slope, top, int(data.get("count", 0)), float(data.get("flat_mape", float("nan"))),
                   list(data.get("points") or []))


def run_slowdown(bundle: Any, clock: ClockModel | None) -> float:
    """The slowdown a measured run's GEMM and attention kernels had: its telemetry's clock ratio, or the
    model's at its measured share where its telemetry cannot say (a run without telemetry); 1.0 where
    the calibration applies none (no clock model, or a flat one), so that fitted runs and projections
    stand on the same footing."""
    from calib.models.power import measured_shares
    from calib.validation.measured import measured_clock_ratio

    if clock is None or not clock.slows:
        return 1.0
    ratio = measured_clock_ratio(bundle)
    if ratio is not None:
        return ratio
    shares = measured_shares(bundle)
    return 1.0 if shares is None else clock.slowdown(shares["compute"])


def throttled(kernel_time: Callable[[pd.DataFrame], np.ndarray], slowdown: float
              ) -> Callable[[pd.DataFrame], np.ndarray]:
    """`kernel_time` with GEMM and attention ops `slowdown` times longer (the others as they were)."""
    if slowdown == 1.0:
        return kernel_time

    def predict(ops: pd.DataFrame) -> np.ndarray:
        out = np.array(kernel_time(ops), dtype=float)
        out[ops["op_class"].isin(FLOP_CLASSES).to_numpy()] *= slowdown
        return out

    return predict
