"""The SM clock under the power cap: how much slower GEMM and attention kernels run in a step that is
mostly GEMM and attention.

A power-capped GPU (700 W on the H200s) lowers its SM clock when its work would draw more than the
cap. The kernel model learns kernels timed in profiled steps, whose host the profiler slows: the GPU
idles more there and stays under the cap, so a GEMM-heavy run's unprofiled steps, whose time is the
measured step, run its compute-bound kernels at up to 11 % lower clock than the kernel model saw
(calib.validation.measured.profiled_clock_ratio; docs/host.md, "The power cap's clock in generated
steps"). How far the clock falls follows how much of the step the GPU spends in GEMM and attention
kernels, which a projection knows once it has simulated the step:

    clock ratio(share) = 1 + slope * max(min(share, top) - knee, 0),   slowdown = ratio ^ exponent

share: time with a GEMM or attention kernel running over the step time, those kernels at the kernel
model's clock (calib.models.power.measured_shares' "compute" for a measured run; the generated step's
GEMM and attention time over its simulated step for a projection); top: the largest share measured
(beyond it the slowdown is held: nothing was measured there). GEMM and attention kernels are scaled by
the slowdown; memory-bound kernels follow the HBM clock, which does not move under the cap.

Two references (`reference`):
- `top` (calib fit since the fifty-fourth session): the kernel model learns every profiled kernel at the GPU's top
  SM clock (`reference_clock_hz`, the configured peaks' max_sm_clock_hz): a training step's GEMM and attention rows
  are scaled by (its profiled step's clock / top) ^ `exponent` (calib.fit.kernel_rows), because the profiled steps
  of the committed H200 runs held 1.56-1.98 GHz under the cap. The ratio modelled is then the top clock over the
  measured steps' clock (the share taken at the top clock too), and a kernel's time grows by ratio ^ `exponent`.
- `profiled` (files written before it): the kernel model learned kernels at their runs' profiled clocks, the ratio
  is the profiled over the measured steps' clock and a kernel's time grows by the ratio itself (exponent 1).

`exponent` (CLOCK_EXPONENT, 0.6): a GEMM's or attention kernel's time goes as clock ^ -exponent, not -1, because
part of it waits on memory, whose clock does not move; measure/probes/clock_sensitivity.py timed GEMMs at
0.36-0.50 and flash attention at 0.45-0.82, and the kernel model cross-validated over the steps' shapes is best
near 0.6 with one exponent for both (benchmarks/kernel_per_clock.py: 3.66 % at 0.6, 3.69 % at 1, 3.68 % unscaled;
0.45 / 0.77 per class 3.65 %).

Fit: one point per training bundle whose telemetry gives both clocks. The knee is searched on a grid
over the measured shares, the slope (>= 0) is least squares at each knee. Error: leave one configuration out, |predicted - measured| / measured
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
CLOCK_EXPONENT = 0.6  # GEMM and attention time ~ SM clock ^ -CLOCK_EXPONENT (module docstring)
REFERENCES = ("profiled", "top")


@dataclass(frozen=True)
class ClockPoint:
    """One training bundle: its GEMM/attention share of the step and its profiled / measured SM clock."""

    bundle: str
    config: str
    share: float
    ratio: float


def clock_points(bundles: Sequence[Any], reference_clock_hz: float | None = None,
                 exponent: float = CLOCK_EXPONENT) -> list[ClockPoint]:
    """The points of the training bundles whose telemetry gives both clocks (others are left out). With a
    `reference_clock_hz` (reference `top`): ratio = that clock over the measured steps' clock and the share at it
    (the profiled share times (profiled clock / reference) ^ exponent); without: the profiled over the measured
    steps' clock and the profiled share (reference `profiled`)."""
    from calib.models.power import measured_shares
    from calib.validation.measured import measured_clock_hz, measured_clock_ratio, profiled_clock_hz

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
        share = float(shares["compute"])
        if reference_clock_hz is not None:
            prof, meas = profiled_clock_hz(b), measured_clock_hz(b)
            if prof is None or meas is None:
                continue
            ratio = reference_clock_hz / meas
            share *= (prof / reference_clock_hz) ** exponent
        out.append(ClockPoint(b.id, m.spec.key(), share, float(ratio)))
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
    reference: str = "profiled"  # the clock the kernel model's times are at (module docstring)
    exponent: float = 1.0  # kernel time ~ clock ^ -exponent
    reference_clock_hz: float = float("nan")  # reference `top`: that clock

    def clock_ratio(self, share: float) -> float:
        """The reference clock over the clock of a step with this GEMM/attention share (>= 1)."""
        if not np.isfinite(share) or share <= 0:
            return 1.0
        return float(1.0 + self.slope * _hinge(np.array([share]), self.knee, self.top)[0])

    def slowdown(self, share: float) -> float:
        """The factor on GEMM and attention kernel times of a step with this GEMM/attention share (>= 1)."""
        return self.clock_ratio(share) ** self.exponent

    @property
    def slows(self) -> bool:
        """Whether the model applies any slowdown (a flat fit does not)."""
        return self.slope > 0

    @property
    def from_top(self) -> bool:
        """Whether the kernel model's times are at the top clock (reference `top`), so that every step's GEMM and
        attention kernels, fitted runs' included, are slowed to its own clock."""
        return self.reference == "top"

    def beyond_measured(self, share: float) -> bool:
        return self.slows and share > self.top

    @classmethod
    def fit(cls, points: Sequence[ClockPoint], reference: str = "profiled", exponent: float = 1.0,
            reference_clock_hz: float = float("nan")) -> tuple[ClockModel, ErrorStat]:
        """The hinge (module docstring) and its leave-one-configuration-out error (of the clock ratio); CalibError
        with too few points. `reference` and `exponent` say what the points' ratios are (clock_points)."""
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
        return cls(knee, slope, float(share.max()), len(points), flat.mape, rows, reference, float(exponent),
                   float(reference_clock_hz)), held

    def to_dict(self) -> dict:
        out = {
            "form": "clock ratio = 1 + slope * max(min(share, top) - knee, 0); GEMM and attention kernels take "
                    "ratio ^ exponent; share = their time over the step",
            "knee": float(self.knee), "slope": float(self.slope), "top": float(self.top), "count": int(self.count),
            "flat_mape": float(self.flat_mape), "reference": self.reference, "exponent": float(self.exponent),
        }
        if self.from_top:
            out["reference_clock_hz"] = float(self.reference_clock_hz)
        out["points"] = [dict(p) for p in self.points]
        return out

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
        reference = str(data.get("reference", "profiled"))
        if reference not in REFERENCES:
            raise CalibError(f"calibration power.clock: reference {reference!r}, expected one of {', '.join(REFERENCES)}")
        try:
            exponent = float(data.get("exponent", 1.0))
            clock_hz = float(data.get("reference_clock_hz", float("nan")))
        except (TypeError, ValueError):
            raise CalibError("calibration power.clock: exponent and reference_clock_hz must be numbers") from None
        if not (np.isfinite(exponent) and 0 < exponent <= 2):
            raise CalibError(f"calibration power.clock: exponent {exponent}, expected 0 < exponent <= 2")
        if reference == "top" and not (np.isfinite(clock_hz) and clock_hz > 0):
            raise CalibError("calibration power.clock: reference 'top' needs a positive reference_clock_hz")
        return cls(knee, slope, top, int(data.get("count", 0)), float(data.get("flat_mape", float("nan"))),
                   list(data.get("points") or []), reference, exponent, clock_hz)


def at_reference_clock(kernels: pd.DataFrame, profiled_clock_hz: float | None, reference_clock_hz: float | None,
                       exponent: float = CLOCK_EXPONENT) -> pd.DataFrame:
    """A profiled step's kernel rows with the GEMM and attention kernels' `time_s` as they would take at the
    reference clock: times (profiled clock / reference) ^ exponent, the factor kept as `clock_scale` (1 for the
    others). Unchanged (`clock_scale` 1) where either clock is unknown."""
    scale = np.ones(len(kernels))
    if profiled_clock_hz and reference_clock_hz and np.isfinite(profiled_clock_hz) and np.isfinite(reference_clock_hz):
        flop = kernels["op_class"].astype(str).isin(FLOP_CLASSES).to_numpy()
        scale[flop] = (profiled_clock_hz / reference_clock_hz) ** exponent
    if np.all(scale == 1.0):
        return kernels.assign(clock_scale=scale)
    return kernels.assign(time_s=pd.to_numeric(kernels["time_s"], errors="coerce").to_numpy(float) * scale,
                          clock_scale=scale)


def run_slowdown(bundle: Any, clock: ClockModel | None) -> float:
    """The slowdown a measured run's GEMM and attention kernels had against the kernel model's: from its telemetry's
    clocks (reference `top`: the top over its measured steps' clock; `profiled`: its profiled over its measured
    steps' clock), else the model's at its measured share (a run without telemetry); 1.0 where the calibration
    applies none (no clock model, or a flat one of reference `profiled`), so that fitted runs and projections stand
    on the same footing."""
    from calib.models.power import measured_shares
    from calib.validation.measured import measured_clock_hz, measured_clock_ratio

    if clock is None or not (clock.slows or clock.from_top):
        return 1.0
    if clock.from_top:
        meas = measured_clock_hz(bundle)
        ratio = None if meas is None else clock.reference_clock_hz / meas
    else:
        ratio = measured_clock_ratio(bundle)
    if ratio is not None:
        return float(ratio) ** clock.exponent
    shares = measured_shares(bundle)
    return 1.0 if shares is None else clock.slowdown(shares["compute"])


def replay_exponent(calibration: Any) -> float:
    """The exponent a replay's GEMM and attention kernels follow the clock with: the calibration's clock model's, 1
    where it has none (as replays were before the exponent)."""
    clock = calibration.clock_model() if calibration is not None and hasattr(calibration, "clock_model") else None
    return 1.0 if clock is None else clock.exponent


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
