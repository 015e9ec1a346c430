"""Shared pieces of the fitted models: error statistics, cross-validation, a clamped hinge basis.

Errors are relative: |predicted - measured| / measured, reported as MAPE (mean, percent) and max
(percent) over `count` points, with the `method` that produced them ("5-fold", "leave-one-
configuration-out", "in-sample").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from calib.errors import CalibError

# How a method text starts when no fitted model enters the error (a harness against its own repeat, an
# estimate with no parameter): `calib validate` labels those neither cross-validated nor in-sample.
NO_MODEL = "no model"
NO_FITTED_PARAMETER = "no fitted parameter"
MODEL_FREE_METHODS = (NO_MODEL, NO_FITTED_PARAMETER)

# Where a kernel-model row was measured (its `source`): "trace" (or absent) for profiled training steps; "bench"
# for kernel microbenchmarks timed by CUDA events around one call, whose floor (the host's dispatch of the call)
# is fitted apart (`t0_bench_s`); "bench-kernel" for microbenchmarks timed kernel by kernel from a converted
# profile, as the steps are (measure/kernels.py, timing "kernel"): the steps' floor, merged into op instances as
# theirs are, with a level of its own on each curve (calib.models.kernel.LEVEL_SOURCES). The residual's `bench`
# feature tells the three apart (calib.models.residual).
EVENT_BENCH = "bench"
KERNEL_BENCH = "bench-kernel"
BENCH_SOURCES = (EVENT_BENCH, KERNEL_BENCH)


@dataclass(frozen=True)
class ErrorStat:
    """Relative error of a model on points it did not see (or says `method` when it did)."""

    mape: float  # percent
    max: float  # percent
    count: int
    method: str

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> ErrorStat:
        return cls(float(data["mape"]), float(data["max"]), int(data["count"]), str(data["method"]))


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    predicted = np.asarray(predicted, dtype=float)
    measured = np.asarray(measured, dtype=float)
    return np.abs(predicted - measured) / measured


def error_stat(predicted: np.ndarray, measured: np.ndarray, method: str) -> ErrorStat:
    rel = relative_errors(predicted, measured)
    if rel.size == 0:
        return ErrorStat(float("nan"), float("nan"), 0, method)
    return ErrorStat(float(100 * rel.mean()), float(100 * rel.max()), int(rel.size), method)


def kfold_indices(n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """k disjoint test folds over n points, shuffled with a fixed seed (reproducible errors)."""
    if n < 2:
        raise CalibError(f"cross-validation needs at least 2 points, got {n}")
    k = max(2, min(k, n))
    order = np.random.default_rng(seed).permutation(n)
    return [order[i::k] for i in range(k)]


def group_folds(groups: Sequence[str]) -> list[np.ndarray]:
    """One test fold per distinct group (leave-one-group-out), in first-seen order."""
    arr = np.asarray(list(groups), dtype=object)
    seen: list[str] = list(dict.fromkeys(arr.tolist()))
    return [np.flatnonzero(arr == g) for g in seen]


def cross_validate(
    n: int,
    folds: list[np.ndarray],
    fit_predict: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """Out-of-fold predictions: for each fold, fit on the other points and predict the fold.

    `fit_predict(train_idx, test_idx)` returns predictions for test_idx; a fold whose training
    part cannot be fitted (CalibError) leaves NaN, which the caller drops and counts as not seen.
    """
    out = np.full(n, np.nan)
    everything = np.arange(n)
    for test in folds:
        train = np.setdiff1d(everything, test)
        if train.size == 0:
            continue
        try:
            out[test] = fit_predict(train, test)
        except CalibError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Clamped hinge basis: a piecewise-linear function of one feature, constant outside the knots'
# range. Used for residuals in log space: inside the measured range it follows the data, outside
# it holds the value at the nearest measured end, so a larger-than-measured shape is predicted at
# the efficiency of the largest measured one instead of a runaway extrapolated slope.


def hinge_basis(x: np.ndarray, knots: Sequence[float]) -> np.ndarray:
    """Columns [1, x, relu(x - k1), ..., relu(x - k_{m-2})] with x clipped to [k0, k_last]."""
    kn = np.asarray(knots, dtype=float)
    xc = np.clip(np.asarray(x, dtype=float), kn[0], kn[-1])
    cols = [np.ones_like(xc), xc - kn[0]]
    cols += [np.maximum(xc - k, 0.0) for k in kn[1:-1]]
    return np.column_stack(cols)


def choose_knots(x: np.ndarray, max_segments: int, min_points_per_segment: int = 4) -> list[float]:
    """Knots at quantiles of x: as many segments as the data supports, at most max_segments."""
    x = np.asarray(x, dtype=float)
    lo, hi = float(np.min(x)), float(np.max(x))
    if hi - lo < 1e-9:
        return [lo, lo + 1e-9]
    segs = int(max(1, min(max_segments, len(np.unique(np.round(x, 6))) // max(1, min_points_per_segment))))
    qs = np.quantile(x, np.linspace(0, 1, segs + 1))
    knots = [lo] + [float(q) for q in qs[1:-1]] + [hi]
    # Drop knots that collapsed onto each other (many equal sizes).
    out = [knots[0]]
    for k in knots[1:]:
        if k - out[-1] > 1e-6:
            out.append(k)
    if len(out) == 1:
        out.append(out[0] + 1e-9)
    return out


def refine_knots(x: np.ndarray, knots: Sequence[float], score: Callable[[list[float]], float], passes: int = 2,
                 most: int = 24, min_points_per_segment: int = 3) -> list[float]:
    """Coordinate descent on the interior knots: each in turn moves to the measured value between its
    neighbours (at most `most` of them, evenly spread) where `score` is lowest; ends stay."""
    xs = np.unique(np.asarray(x, dtype=float))
    kn = [float(k) for k in knots]
    best = score(kn)
    for _ in range(passes):
        moved = False
        for i in range(1, len(kn) - 1):
            # Each segment keeps `min_points_per_segment` measured values (its ends included).
            between = xs[(xs > kn[i - 1] + 1e-6) & (xs < kn[i + 1] - 1e-6)]
            lo_n = np.searchsorted(xs, kn[i - 1] - 1e-6)
            hi_n = np.searchsorted(xs, kn[i + 1] + 1e-6)
            rank = np.searchsorted(xs, between)
            inside = between[(rank - lo_n + 1 >= min_points_per_segment) & (hi_n - rank >= min_points_per_segment)]
            if inside.size > most:
                inside = inside[np.unique(np.linspace(0, inside.size - 1, most).round().astype(int))]
            for c in inside:
                trial = kn[:i] + [float(c)] + kn[i + 1:]
                s = score(trial)
                if s < best - 1e-12:
                    best, kn, moved = s, trial, True
        if not moved:
            break
    return kn


def ridge_fit(a: np.ndarray, y: np.ndarray, alpha: float = 1e-3, weights: np.ndarray | None = None) -> np.ndarray:
    """Least squares with a small ridge on all but the intercept column (stable with few points)."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    sw = np.sqrt(w)[:, None]
    aw = a * sw
    yw = y * sw[:, 0]
    reg = alpha * np.eye(a.shape[1])
    reg[0, 0] = 0.0
    coef, *_ = np.linalg.lstsq(aw.T @ aw + reg, aw.T @ yw, rcond=None)
    return coef


@dataclass
class ClampedPiecewise:
    """A fitted piecewise-linear function of one feature, exportable as plain numbers."""

    knots: list[float]
    coef: list[float]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return hinge_basis(x, self.knots) @ np.asarray(self.coef)

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, max_segments: int = 4, alpha: float = 1e-3,
            min_points_per_segment: int = 4) -> ClampedPiecewise:
        knots = choose_knots(x, max_segments, min_points_per_segment)
        coef = ridge_fit(hinge_basis(x, knots), np.asarray(y, dtype=float), alpha=alpha)
        return cls([float(k) for k in knots], [float(c) for c in coef])

    def to_dict(self) -> dict:
        return {"knots": [float(k) for k in self.knots], "coef": [float(c) for c in self.coef]}

    @classmethod
    def from_dict(cls, data: dict) -> ClampedPiecewise:
        return cls([float(k) for k in data["knots"]], [float(c) for c in data["coef"]])
