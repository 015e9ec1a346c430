"""The SM clock under the power cap: how much slower GEMM and attention kernels run in a step that is
mostly GEMM and attention.

A power-capped GPU (700 W on the H200s) lowers its SM clock when its work would draw more than the
cap. The kernel model learns kernels timed in profiled steps, whose host the profiler slows: the GPU
idles more there and stays under the cap, so a GEMM-heavy run's unprofiled steps, whose time is the
measured step, run its compute-bound kernels at up to 11 % lower clock than the kernel model saw
(calib.validation.measured.profiled_clock_ratio; docs/host.md, "The power cap's clock in generated
steps"). How far the clock falls follows how hard the step drives the GPU, which a projection knows
once it has simulated the step:

    clock ratio(x) = 1 + slope * max(min(x, top) - knee, 0),   slowdown = ratio ^ exponent

x, the model's input (`feature`):
- `gemm_flop_rate` (calib fit since the fifty-fifth session): GEMM FLOPs per second of the step over the GPU's
  dense bf16 peak (`peak_flops_per_s`): a measured run's profiled GEMM kernels' FLOPs per rank and step over its
  measured step time (measured_gemm_flop_rate), a projection's generated GEMM FLOPs over its simulated step. A step
  at the cap's clock draws the cap; the more GEMM work per second it does there, the less energy each FLOP may
  take, so the lower the clock. Over the committed runs it predicts held-out configurations' clocks better than
  the share below: H200 1.28 / 6.8 % against 1.62 / 10.5 % (mean / max), H100 1.24 / 6.1 % against 1.52 / 9.7 %;
  adding flash attention's FLOPs is a near tie (H200 1.25 / 6.4 %, at half weight 1.23 / 6.3 %; H100 1.24 / 6.5
  and 1.24 / 6.3 %) and the memory-bound share no better (docs/host.md, "The clock model reads the GEMM FLOP
  rate"). Synthetic loads (measure/probes/clock_load.py) agree where the GPU is busy all along, as in a training
  step: GEMMs followed by memory-bound adds within 0.4-2.6 % of
  the clock, flash attention at full duty (294 TFLOP/s, 0.70 kW) unthrottled, which the share would have slowed by
  21 %. Where GEMM bursts alternate with idle, the GPU draws less and the model, fitted on busy steps, gives a
  clock up to 18 % too low (benchmarks/clock_load.py).
- `share` (files written before it): time with a GEMM or attention kernel running over the step time, those
  kernels at the kernel model's clock (calib.models.power.measured_shares' "compute" for a measured run; the
  generated step's GEMM and attention time over its simulated step for a projection).

top: the largest input measured (beyond it the slowdown is held: nothing was measured there). GEMM and attention
kernels are scaled by the slowdown; memory-bound kernels follow the HBM clock, which does not move under the cap.

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
over the measured inputs, the slope (>= 0) is least squares at each knee. Error: leave one configuration out, |predicted - measured| / measured
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

KNEES = 71  # knee candidates, evenly over the measured inputs
MIN_CONFIGS = 4  # configurations with both clocks below which no model is fitted
CLOCK_EXPONENT = 0.6  # GEMM and attention time ~ SM clock ^ -CLOCK_EXPONENT (module docstring)
REFERENCES = ("profiled", "top")
FEATURES = ("share", "gemm_flop_rate")  # what the hinge reads (module docstring)


@dataclass(frozen=True)
class ClockPoint:
    """One training bundle: its GEMM/attention share of the step, its GEMM FLOP rate over the peak (NaN where no
    peak was given) and its clock ratio."""

    bundle: str
    config: str
    share: float
    ratio: float
    gemm_rate: float = float("nan")

    def x(self, feature: str) -> float:
        """The model input `feature` (FEATURES) of this point."""
        return self.gemm_rate if feature == "gemm_flop_rate" else self.share


def measured_gemm_flop_rate(bundle: Any) -> float | None:
    """GEMM FLOPs per second of a training bundle's measured step: its profiled steps' GEMM kernels' FLOPs per rank
    and step (the mean over ranks; the generated step's GEMM FLOPs to 1e-4 on the committed runs) over the measured
    step time; None without kernels, steps or GEMM FLOPs."""
    return bundle.derived("gemm_flop_rate", lambda: _gemm_flop_rate(bundle))


def _gemm_flop_rate(bundle: Any) -> float | None:
    from calib.models.power import flops_per_step
    from calib.validation.measured import measured_step

    if not bundle.has("kernels") or not bundle.has("steps"):
        return None
    k = bundle.table("kernels")
    if k.empty or "flops" not in k.columns:
        return None
    per_rank = [flops_per_step(k, r, ("gemm",)) for r in sorted(k["rank"].unique())]
    step_s = measured_step(bundle).time_s
    rate = float(np.mean(per_rank)) / step_s if per_rank else 0.0
    return rate if np.isfinite(rate) and rate > 0 else None


def clock_points(bundles: Sequence[Any], reference_clock_hz: float | None = None,
                 exponent: float = CLOCK_EXPONENT, peak_flops_per_s: float | None = None) -> list[ClockPoint]:
    """The points of the training bundles whose telemetry gives both clocks (others are left out). With a
    `reference_clock_hz` (reference `top`): ratio = that clock over the measured steps' clock and the share at it
    (the profiled share times (profiled clock / reference) ^ exponent); without: the profiled over the measured
    steps' clock and the profiled share (reference `profiled`). With `peak_flops_per_s`, each point's GEMM FLOP
    rate over it (measured_gemm_flop_rate; a bundle without one is left out)."""
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
        rate = float("nan")
        if peak_flops_per_s:
            flops = measured_gemm_flop_rate(b)
            if flops is None:
                continue
            rate = flops / peak_flops_per_s
        out.append(ClockPoint(b.id, m.spec.key(), share, float(ratio), rate))
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
    top: float = 1.0  # the largest input measured; the slowdown is held beyond it
    count: int = 0
    flat_mape: float = float("nan")  # percent: leave-one-configuration-out error of no slowdown
    points: list[dict] = field(default_factory=list)  # per bundle: id, config, share, ratio
    reference: str = "profiled"  # the clock the kernel model's times are at (module docstring)
    exponent: float = 1.0  # kernel time ~ clock ^ -exponent
    reference_clock_hz: float = float("nan")  # reference `top`: that clock
    feature: str = "share"  # the input the hinge reads (FEATURES; module docstring)
    peak_flops_per_s: float = float("nan")  # feature `gemm_flop_rate`: the FLOP rate it is a fraction of

    def clock_ratio(self, x: float) -> float:
        """The reference clock over the clock of a step whose input (`feature`) is x (>= 1)."""
        if not np.isfinite(x) or x <= 0:
            return 1.0
        return float(1.0 + self.slope * _hinge(np.array([x]), self.knee, self.top)[0])

    def slowdown(self, x: float) -> float:
        """The factor on GEMM and attention kernel times of a step whose input (`feature`) is x (>= 1)."""
        return self.clock_ratio(x) ** self.exponent

    def step_input(self, flop_share: float, gemm_flops_per_s: float) -> float:
        """The model's input for a step with this GEMM/attention share (at the reference clock) and this GEMM
        FLOP rate (FLOP/s over the step)."""
        return gemm_flops_per_s / self.peak_flops_per_s if self.feature == "gemm_flop_rate" else flop_share

    def measured_input(self, bundle: Any) -> float | None:
        """The model's input as a measured training bundle's profiled step gives it (the share as measured, the
        GEMM FLOP rate over the measured step); None where the bundle cannot say. A share model fitted at the top
        clock gets the profiled share too: this is asked of runs without telemetry, whose profiled clock, and so
        their share at the top clock, is unknown."""
        if self.feature == "gemm_flop_rate":
            rate = measured_gemm_flop_rate(bundle)
            return None if rate is None else rate / self.peak_flops_per_s
        from calib.models.power import measured_shares

        shares = measured_shares(bundle)
        return None if shares is None else float(shares["compute"])

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
            reference_clock_hz: float = float("nan"), feature: str = "share",
            peak_flops_per_s: float = float("nan")) -> tuple[ClockModel, ErrorStat]:
        """The hinge (module docstring) over the points' `feature` and its leave-one-configuration-out error (of the
        clock ratio); CalibError with too few points. `reference` and `exponent` say what the points' ratios are,
        `peak_flops_per_s` what their GEMM FLOP rates are fractions of (clock_points)."""
        if feature not in FEATURES:
            raise CalibError(f"clock model: feature {feature!r}, expected one of {', '.join(FEATURES)}")
        configs = [p.config for p in points]
        if len(set(configs)) < MIN_CONFIGS:
            raise CalibError(f"clock model: {len(set(configs))} configuration(s) with both SM clocks in their "
                             f"telemetry, need at least {MIN_CONFIGS}")
        share = np.array([p.x(feature) for p in points], dtype=float)
        ratio = np.array([p.ratio for p in points], dtype=float)
        if not (np.all(np.isfinite(share)) and np.all(np.isfinite(ratio)) and np.all(ratio > 0)):
            raise CalibError(f"clock model: a point has a non-finite {feature} or a non-positive clock ratio")
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
                | ({"gemm_flop_rate": round(p.gemm_rate, 4)} if feature == "gemm_flop_rate" else {})
                for p in points]
        return cls(knee, slope, float(share.max()), len(points), flat.mape, rows, reference, float(exponent),
                   float(reference_clock_hz), feature, float(peak_flops_per_s)), held

    def to_dict(self) -> dict:
        out = {
            "form": "clock ratio = 1 + slope * max(min(x, top) - knee, 0); GEMM and attention kernels take "
                    "ratio ^ exponent; x = the feature: share (their time over the step) or gemm_flop_rate (GEMM "
                    "FLOPs over the step, over peak_flops_per_s)",
            "knee": float(self.knee), "slope": float(self.slope), "top": float(self.top), "count": int(self.count),
            "flat_mape": float(self.flat_mape), "reference": self.reference, "exponent": float(self.exponent),
        }
        if self.from_top:
            out["reference_clock_hz"] = float(self.reference_clock_hz)
        out["feature"] = self.feature
        if self.feature == "gemm_flop_rate":
            out["peak_flops_per_s"] = float(self.peak_flops_per_s)
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
        feature = str(data.get("feature", "share"))
        if feature not in FEATURES:
            raise CalibError(f"calibration power.clock: feature {feature!r}, expected one of {', '.join(FEATURES)}")
        try:
            peak = float(data.get("peak_flops_per_s", float("nan")))
        except (TypeError, ValueError):
            raise CalibError("calibration power.clock: peak_flops_per_s must be a number") from None
        if feature == "gemm_flop_rate" and not (np.isfinite(peak) and peak > 0):
            raise CalibError("calibration power.clock: feature 'gemm_flop_rate' needs a positive peak_flops_per_s")
        return cls(knee, slope, top, int(data.get("count", 0)), float(data.get("flat_mape", float("nan"))),
                   list(data.get("points") or []), reference, exponent, clock_hz, feature, peak)


def _follows_clock(ops: pd.DataFrame) -> np.ndarray:
    """Rows whose time follows the SM clock: GEMM and attention kernels (memory-bound ones follow the HBM's)."""
    return ops["op_class"].astype(str).isin(FLOP_CLASSES).to_numpy()


def at_reference_clock(kernels: pd.DataFrame, profiled_clock_hz: float | None, reference_clock_hz: float | None,
                       exponent: float = CLOCK_EXPONENT) -> pd.DataFrame:
    """A profiled step's kernel rows with the GEMM and attention kernels' `time_s` as they would take at the
    reference clock: times (profiled clock / reference) ^ exponent, the factor kept as `clock_scale` (1 for the
    others). Unchanged (`clock_scale` 1) where either clock is unknown."""
    scale = np.ones(len(kernels))
    if profiled_clock_hz and reference_clock_hz and np.isfinite(profiled_clock_hz) and np.isfinite(reference_clock_hz):
        scale[_follows_clock(kernels)] = (profiled_clock_hz / reference_clock_hz) ** exponent
    if np.all(scale == 1.0):
        return kernels.assign(clock_scale=scale)
    return kernels.assign(time_s=pd.to_numeric(kernels["time_s"], errors="coerce").to_numpy(float) * scale,
                          clock_scale=scale)


def run_slowdown(bundle: Any, clock: ClockModel | None) -> float:
    """The slowdown a measured run's GEMM and attention kernels had against the kernel model's: from its telemetry's
    clocks (reference `top`: the top over its measured steps' clock; `profiled`: its profiled over its measured
    steps' clock), else the model's at its measured input (a run without telemetry); 1.0 where the calibration
    applies none (no clock model, or a flat one of reference `profiled`), so that fitted runs and projections stand
    on the same footing."""
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
    x = clock.measured_input(bundle)
    return 1.0 if x is None else clock.slowdown(x)


def clock_of(calibration: Any) -> ClockModel | None:
    """The calibration's clock model; None where it has none (or is no calibration: a bare kernel model)."""
    return calibration.clock_model() if calibration is not None and hasattr(calibration, "clock_model") else None


def replay_exponent(calibration: Any) -> float:
    """The exponent a replay's GEMM and attention kernels follow the clock with: the calibration's clock model's, 1
    where it has none (as replays were before the exponent)."""
    clock = clock_of(calibration)
    return 1.0 if clock is None else clock.exponent


def throttled(kernel_time: Callable[[pd.DataFrame], np.ndarray], slowdown: float
              ) -> Callable[[pd.DataFrame], np.ndarray]:
    """`kernel_time` with GEMM and attention ops `slowdown` times longer (the others as they were)."""
    if slowdown == 1.0:
        return kernel_time

    def predict(ops: pd.DataFrame) -> np.ndarray:
        out = np.array(kernel_time(ops), dtype=float)
        out[_follows_clock(ops)] *= slowdown
        return out

    return predict
