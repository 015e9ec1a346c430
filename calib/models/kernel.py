"""Kernel-time model: a roofline with fitted efficiencies and a learned, clamped residual.

For each op class (gemm, attention, memory, other; optionally split by dtype when there are
enough points) the time of one kernel is

    t = t0 + roofline * exp(g(x, z) + offset[aten_op]),
    roofline = max(flops / peak_flops(dtype), bytes / peak_mem_bw)

where x = log10 of the work (FLOPs for gemm/attention, bytes for memory/other), z = log10 of the
arithmetic intensity (FLOPs/byte; gemm/attention only) and g is piecewise linear in x plus
linear in z, both CLAMPED to the measured range. Inside the range g follows the data; beyond it
the efficiency of the nearest measured end is kept, so a full-size GEMM is predicted at the
efficiency of the largest measured one (time grows with its FLOPs). t0 is a fitted per-class
floor (launch and tail latency); offset is a per-aten-op constant in log space, shrunk toward 0
(an op never measured gets 0: the class curve). Rows of a kernel-timed microbenchmark add a level of
their own to g (`source_levels`), so they shape a curve whose level the training steps set. A memory-bound op is keyed by its family and its
operand layout (`layout`, calib.ops.kernel_layout: the same bytes take 2-3x longer strided than
contiguous), with the family over all layouts standing in for an op that comes without one. The reported `efficiency` is the work term's roofline/time at
the largest measured work.

Rows without any work (an "other" op whose FLOPs and bytes are unknown) are predicted by the
median measured time of the same aten op, else of their class.

On top of the curves a learned residual (calib.models.residual: gradient-boosted trees on the log
ratio measured / curve time, from GEMM tile/wave quantisation, alignment, shape and elementwise-
layout features) multiplies the time of every op that has a curve; it is clipped to the training
residuals' range and fades out beyond the measured work of the op's class.

Everything fitted is plain numbers (`to_dict`/`from_dict`), no pickles.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin

from calib.errors import CalibError
from calib.models.common import (
    EVENT_BENCH,
    KERNEL_BENCH,
    ClampedPiecewise,
    choose_knots,
    hinge_basis,
    kfold_indices,
    refine_knots,
)
from calib.models.peaks import GpuPeaks, normalize_dtype
from calib.models.residual import (
    ELEMENT_BYTES,
    checked_residual,
    fit_residual,
    parsed_trees,
    predict_residual,
)
from calib.ops import CALL_OPS, EMBEDDING_BWD, FLOP_CLASSES, call_layout

OP_CLASSES = ("gemm", "attention", "memory", "other")
# A class with no measured kernels of its own is predicted with the model of a related class.
FALLBACK = {"attention": "gemm", "other": "memory", "memory": "other", "gemm": "attention"}
MIN_RESIDUAL_POINTS = 50  # sized shapes needed before a residual is learned on top of the curves
OFFSET_PRIOR = 2.0  # pseudo-points pulling an aten op's offset toward the class curve
# Sources measured apart from the training steps whose level a curve fits apart (`source_levels`): the
# microbenchmark's shapes inform the curve's form, the steps alone its level. Kernel-timed microbenchmarks on
# H200 ran flash attention 9 % and GEMMs 1.2 % under the same shapes in the steps (round 45, traces/README.md).
LEVEL_SOURCES = (KERNEL_BENCH,)
LEVEL_PRIOR = 2.0  # pseudo-points pulling a source's level toward the steps'
# `source`: where a row was measured (calib.models.common.EVENT_BENCH, KERNEL_BENCH, or "trace").
SHAPE_COLUMNS = ["op_class", "aten_op", "m", "n", "k", "batch", "flops", "bytes", "dtype", "source", "layout"]
_STRING_COLUMNS = ("op_class", "aten_op", "dtype", "source", "layout")


_GEMM_FAMILY = {"addmm": "mm", "linear": "mm", "matmul": "mm", "baddbmm": "bmm", "addbmm": "bmm"}


def _joint_fit(a: np.ndarray, idx: np.ndarray, n_ops: int, g: np.ndarray, alpha: float,
               levels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of g on [curve basis | one column per op family | one indicator per LEVEL_SOURCES source],
    the op columns penalized by OFFSET_PRIOR (an op seen n times keeps about n/(n + OFFSET_PRIOR) of its own
    mean residual), the source columns by LEVEL_PRIOR. Returns (curve coefficients, op offsets, source levels)."""
    onehot = np.zeros((len(g), n_ops))
    onehot[np.arange(len(g)), idx] = 1.0
    lv = np.zeros((len(g), 0)) if levels is None else levels
    full = np.column_stack([a, onehot, lv])
    pen = np.concatenate([[0.0], np.full(a.shape[1] - 1, alpha), np.full(n_ops, OFFSET_PRIOR),
                          np.full(lv.shape[1], LEVEL_PRIOR)])
    sol = np.linalg.solve(full.T @ full + np.diag(pen), full.T @ g)
    k = a.shape[1]
    return sol[:k], sol[k:k + n_ops], sol[k + n_ops:]


# Op families whose classified bytes (whole tensors) are not the traffic of one of their kernels.
BYTES_NOT_TRAFFIC = {"index_put_impl", "index_put", "index", "gather", "embedding_dense_backward"}
RANGE_SLACK = 0.15  # decades of work a curve is trusted beyond its measured range
# Measured work this many decades apart with nothing between is a gap the curve has not seen: a
# dtype's curve of 8-byte and GB-sized fp32 fills interpolated 33 MB at 9x its time. Inside a gap
# the next, less specific curve (measured there) predicts. Kernel cross-validation on traces/h200
# (2026-11-23): no gap rule 5.37 %, gaps of 1 / 2 / 3 / 4 / 5 decades 5.33 / 5.33 / 5.26 / 5.23 /
# 5.21 %: narrow gaps also drop curves that interpolated well.
GAP_DECADES = 4.0


def _by_range(chain: list[dict], x: np.ndarray, rows: np.ndarray) -> list[tuple[dict, np.ndarray]]:
    """Assign each row to the most specific curve that may predict its work: any curve inside its
    measured range (RANGE_SLACK decades of slack), above it only a curve whose largest measured
    kernel was throughput-bound (`top_bound`), so a per-op curve fitted on launch-bound kernels
    never extrapolates to large ones, and never below it (a per-op curve fitted on large kernels
    knows nothing of the launch floor: an 8-byte fill timed by a curve of GB-sized fills took
    10^-12 s). Rows no curve takes go to the curve measured nearest to them."""
    lo = np.array([g["knots"][0] for g in chain])
    hi = np.array([g["knots"][-1] for g in chain])
    bound = np.array([bool(g.get("top_bound", True)) for g in chain])
    ok = (x[:, None] >= lo[None, :] - RANGE_SLACK) & ((x[:, None] <= hi[None, :] + RANGE_SLACK) | bound[None, :])
    for j, g in enumerate(chain):  # nor inside a stretch of its range where it measured nothing
        for a, b in g.get("gaps") or []:
            ok[:, j] &= ~((x > a + RANGE_SLACK) & (x < b - RANGE_SLACK))
    nearest = np.where(x < lo.min(), int(lo.argmin()), int(hi.argmax()))
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), nearest)
    return [(chain[i], rows[first == i]) for i in np.unique(first)]


def op_family(aten_op: str) -> str:
    """The op an offset is learned for: in-place and out-of-place variants share one (add_ = add),
    and GEMMs with a fused add share the plain one (addmm = mm, baddbmm = bmm)."""
    name = str(aten_op or "").removeprefix("aten::").strip("_")
    return _GEMM_FAMILY.get(name, name)


def layout_family(family: str, layout: str, op_class: str) -> str:
    """A memory-bound op family split by operand layout ("copy#strided"): curves, offsets and the
    residual learn each layout apart, and an op without a layout is timed by its whole family."""
    return f"{family}#{layout}" if layout and op_class == "memory" else family


def _col(df: pd.DataFrame, name: str, default: float = np.nan) -> np.ndarray:
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
    return np.full(len(df), default)


def _str_col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name in df.columns:
        return df[name].fillna("").astype(str).to_numpy()
    return np.full(len(df), "", dtype=object)


class KernelModel(BaseEstimator, RegressorMixin):
    """scikit-learn regressor: DataFrame of OpRecord fields -> kernel time in seconds."""

    def __init__(
        self,
        peaks: GpuPeaks | None = None,
        max_segments: int = 4,
        min_points: int = 8,
        alpha: float = 1e-3,
        split_dtypes: bool = False,
        split_ops: bool = True,
        residual: bool = True,
        level_sources: tuple[str, ...] = LEVEL_SOURCES,
    ) -> None:
        self.peaks = peaks
        self.max_segments = max_segments
        self.min_points = min_points
        self.alpha = alpha
        self.split_dtypes = split_dtypes
        self.split_ops = split_ops
        self.residual = residual
        self.level_sources = level_sources  # row sources whose level a curve fits apart (`source_levels`)

    # ---- features ------------------------------------------------------------------------
    def _features(self, X: pd.DataFrame) -> dict[str, np.ndarray]:
        if self.peaks is None:
            raise CalibError("kernel model has no peak rates (configure the GPU)")
        flops = np.nan_to_num(_col(X, "flops"), nan=0.0)
        nbytes = np.nan_to_num(_col(X, "bytes"), nan=0.0)
        dtypes = np.array([normalize_dtype(d) for d in _str_col(X, "dtype")], dtype=object)
        classes = _str_col(X, "op_class")
        peak_f = np.array([self.peaks.flops_for(d) for d in dtypes])
        roof = np.maximum(flops / peak_f, nbytes / self.peaks.mem_bytes_per_s)
        compute = np.isin(classes, FLOP_CLASSES)
        work = np.where(compute & (flops > 0), flops, nbytes)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(work > 0, np.log10(np.maximum(work, 1.0)), np.nan)
            z = np.where((flops > 0) & (nbytes > 0), np.log10(np.maximum(flops, 1.0) / np.maximum(nbytes, 1.0)), 0.0)
        base = np.array([op_family(a) for a in _str_col(X, "aten_op")], dtype=object)
        aten = np.array([layout_family(f, lay, c) for f, lay, c in zip(base, _str_col(X, "layout"), classes,
                                                                         strict=True)], dtype=object)
        # Multi-tensor-apply ops (torch's _foreach_*) launch one kernel per fixed-size chunk of their
        # tensor list, and indexing ops touch a few rows of tensors whose full size is in `bytes`:
        # a kernel's time does not follow the bytes, so they are timed per kernel by their
        # measured median (as ops without work are).
        multi = np.array([a.startswith("foreach_") or a in BYTES_NOT_TRAFFIC for a in base], dtype=bool)
        xb = np.where(nbytes > 0, np.log10(np.maximum(nbytes, 1.0)), np.nan)
        # The embedding backward's time follows its token gradients (m indices of k features), not its
        # record's bytes, which the table dominates (2,048 indices of 4,096 features: ~112 us with tables
        # of 0.5 and 1.1 GB; 256 indices: 16 us with 0.5 GB).
        # Files fitted before (no `embedding_tokens`) keep their curve over the record's bytes.
        mk = _col(X, "m") * _col(X, "k")
        tokens = (base == op_family(EMBEDDING_BWD)) & np.isfinite(mk) & (mk > 0)
        if tokens.any() and getattr(self, "embedding_tokens_", True):
            es = np.array([ELEMENT_BYTES.get(str(d), 2) for d in dtypes[tokens]], dtype=float)
            xb[tokens] = np.log10(mk[tokens] * es)
        x = np.where(multi, np.nan, x)
        source = _str_col(X, "source")
        return {"roof": roof, "x": x, "z": z, "classes": classes, "dtypes": dtypes, "aten": aten, "base": base,
                "bench": source == EVENT_BENCH, "source": source, "xb": xb}

    # ---- fitting -------------------------------------------------------------------------
    def fit(self, X: pd.DataFrame, y: np.ndarray) -> KernelModel:
        y = np.asarray(y, dtype=float)
        if len(X) != len(y):
            raise CalibError(f"kernel model: {len(X)} shapes but {len(y)} times")
        if not np.all(np.isfinite(y)) or np.any(y <= 0):
            raise CalibError("kernel model: kernel times must be positive finite seconds")
        f = self._features(X)
        self.groups_: dict[str, dict] = {}
        self.constants_: dict[str, float] = {}
        self.saturating_: dict[str, dict] = {}
        sized = np.isfinite(f["x"]) & (f["roof"] > 0)
        for cls in OP_CLASSES:
            in_cls = f["classes"] == cls
            sel = in_cls & sized
            if sel.sum() >= self.min_points:
                self.groups_[cls] = self._fit_group(f, y, sel, cls)
                for dt in sorted(set(f["dtypes"][sel].tolist())):
                    sub = sel & (f["dtypes"] == dt)
                    # A dtype gets its own curve only when it has enough points and is not the whole class.
                    if self.split_dtypes and dt and self.min_points <= sub.sum() < sel.sum():
                        self.groups_[f"{cls}/{dt}"] = self._fit_group(f, y, sub, cls)
                if self.split_ops:
                    # An op family measured at enough distinct sizes gets its own curve: elementwise,
                    # softmax, copies and fused multi-tensor ops scale differently with bytes. A
                    # family split by layout also gets one over all its layouts.
                    for op in sorted((set(f["aten"][sel].tolist()) | set(f["base"][sel].tolist())) - {""}):
                        sub = sel & ((f["aten"] == op) | (f["base"] == op))
                        if sub.sum() >= self.min_points and sub.sum() < sel.sum():
                            self.groups_[f"{cls}:{op}"] = self._fit_group(f, y, sub, cls)
                            for dt in sorted(set(f["dtypes"][sub].tolist())):
                                sd = sub & (f["dtypes"] == dt)
                                if sd.sum() >= self.min_points and sd.sum() < sub.sum():
                                    self.groups_[f"{cls}:{op}/{dt}"] = self._fit_group(f, y, sd, cls)
            unsized = in_cls & ~sized
            if unsized.any():
                self.constants_[cls] = float(np.median(y[unsized]))
                for op in sorted((set(f["aten"][unsized].tolist()) | set(f["base"][unsized].tolist())) - {""}):
                    one = unsized & ((f["aten"] == op) | (f["base"] == op))
                    self.constants_[f"{cls}/{op}"] = float(np.median(y[one]))
                    with_bytes = one & np.isfinite(f["xb"])
                    if len(np.unique(np.round(f["xb"][with_bytes], 3))) >= 4:
                        # Per-kernel time against the op's bytes, clamped at both ends: a _foreach_
                        # kernel grows with a short tensor list and saturates at its chunk size.
                        curve = ClampedPiecewise.fit(f["xb"][with_bytes], np.log(y[with_bytes]), max_segments=3,
                                                       min_points_per_segment=2)
                        self.saturating_[f"{cls}/{op}"] = curve.to_dict()
        if not self.groups_:
            raise CalibError(
                f"kernel model: too few sized kernels to fit (need {self.min_points} of one op class, "
                f"have {int(sized.sum())} in all)"
            )
        self.residual_: dict | None = None
        if self.residual and sized.sum() >= MIN_RESIDUAL_POINTS:
            # The learned residual: trees on the log ratio measured / curve of the sized ops.
            base = self._predict_curves(X)[sized]
            ok = np.isfinite(base) & (base > 0)
            idx = np.flatnonzero(sized)[ok]
            r = np.log(y[idx] / base[ok])
            sms = self.peaks.sm_count if self.peaks is not None else 132
            self.residual_ = fit_residual(X.iloc[idx], f["aten"][idx], r, sms, f["base"][idx])
        return self

    def _fit_group(self, f: dict, y: np.ndarray, sel: np.ndarray, cls: str) -> dict:
        x, z, roof, yy, ops, bases = f["x"][sel], f["z"][sel], f["roof"][sel], y[sel], f["aten"][sel], f["base"][sel]
        use_z = cls in FLOP_CLASSES and np.ptp(z) > 0.05
        zr = [float(z.min()), float(z.max())] if use_z else [0.0, 0.0]
        names = sorted(set(ops.tolist()))
        idx = np.array([names.index(o) for o in ops])
        # A fixed floor (launch and tail latency) plus the work term. The floor is chosen on a grid
        # below the fastest kernel, separately for microbenchmark rows (CUDA events around one
        # launch on an idle GPU add 10-20 us) and profiled-trace rows (kernels back to back);
        # for each pair the residual curve g and one log-offset per aten op family (shrunk toward
        # 0 by OFFSET_PRIOR) are one least-squares fit in log space.
        bench = f["bench"][sel]
        lo_t = float(yy[~bench].min()) if (~bench).any() else float(yy.min())
        lo_b = float(yy[bench].min()) if bench.any() else lo_t
        grid = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
        # A source gets a level of its own only beside rows of the steps, which then set the curve's.
        src = f["source"][sel]
        steps = ~np.isin(src, list(self.level_sources))
        level_names = [s for s in self.level_sources if steps.any() and (src == s).any()]
        levels = np.column_stack([src == s for s in level_names]).astype(float) if level_names else None

        def trial(t0: float, tb: float, a: np.ndarray) -> tuple[float, float, float, np.ndarray, np.ndarray, np.ndarray]:
            floor = np.where(bench, tb, t0)
            g = np.log(yy - floor) - np.log(roof)
            coef, off, lev = _joint_fit(a, idx, len(names), g, self.alpha, levels)
            shift = levels @ lev if levels is not None else 0.0
            pred = floor + roof * np.exp(a @ coef + off[idx] + shift)
            return float(np.mean(np.abs(pred - yy) / yy)), t0, tb, coef, off, lev

        # A knot at a quantile can fall in a stretch of sizes nothing was measured at, and the
        # segments either side then bend where no data says so (fp32 softmax: measured at 34 MB and
        # from 537 MB up, nothing between; with a knot at 135 MB its 537 MB kernels came out 16 %
        # short). The knots start at quantiles and move onto measured sizes where the curve fits
        # better. Kernel CV on traces/h200 (2026-11-24, benchmarks/kernel_accuracy.py): quantile
        # knots 4.52 %; refined with no minimum / at least 2 / 3 / 4 measured sizes per segment 3.87 / 3.88 /
        # 3.89 / 3.96 %, the largest 20 % of shapes from the rest 8.0 / 7.8 / 7.6 / 7.8 % (8.4 before).
        knots = refine_knots(x, choose_knots(x, self.max_segments),
                             lambda kn: trial(0.5 * lo_t, 0.5 * lo_b, self._design(x, z, kn, zr, use_z))[0])
        a = self._design(x, z, knots, zr, use_z)

        best = min((trial(fr * lo_t, 0.5 * lo_b, a) for fr in grid), key=lambda r: r[0])
        if bench.any():
            best = min([best] + [trial(best[1], fr * lo_b, a) for fr in grid], key=lambda r: r[0])
            best = min([best] + [trial(fr * lo_t, best[2], a) for fr in grid], key=lambda r: r[0])
        _, t0, tb, coef, off, lev = best
        offsets = {n: float(o) for n, o in zip(names, off, strict=True) if n and abs(o) > 1e-9}
        # An op family seen only split by layout gets the count-weighted mean of its layouts' offsets,
        # for ops that come without a layout.
        counts = np.bincount(idx, minlength=len(names))
        base_of = dict(zip(ops.tolist(), bases.tolist(), strict=True))
        for fam in sorted(set(bases.tolist()) - set(names) - {""}):
            mine = [i for i, n in enumerate(names) if base_of[n] == fam]
            pooled = float(np.average(off[mine], weights=counts[mine])) if mine else 0.0
            if abs(pooled) > 1e-9:
                offsets[fam] = pooled
        group = {"t0_s": t0, "t0_bench_s": tb, "knots": [float(k) for k in knots], "coef": [float(c) for c in coef],
                 "z_range": zr, "use_z": bool(use_z), "count": int(sel.sum()), "op_offsets": offsets}
        if level_names:
            group["source_levels"] = {n: float(v) for n, v in zip(level_names, lev, strict=True)}
        xs = np.unique(x)
        wide = np.flatnonzero(np.diff(xs) > GAP_DECADES)
        if wide.size:
            group["gaps"] = [[float(xs[i]), float(xs[i + 1])] for i in wide]
        g_top = float((self._design(np.array([knots[-1]]), np.array([zr[1]]), knots, zr, use_z) @ coef)[0])
        group["efficiency"] = float(math.exp(-g_top))
        # Was the largest measured kernel throughput-bound (work term at least twice the floor)?
        top = int(np.argmax(x))
        work_top = float(roof[top] * math.exp(float(a[top] @ coef) + off[idx[top]]))
        group["top_bound"] = bool(work_top >= 2.0 * t0)
        return group

    @staticmethod
    def _design(x: np.ndarray, z: np.ndarray, knots: list[float], zr: list[float], use_z: bool) -> np.ndarray:
        a = hinge_basis(x, knots)
        if use_z:
            a = np.column_stack([a, np.clip(z, zr[0], zr[1]) - zr[0]])
        return a

    # ---- prediction ----------------------------------------------------------------------
    def _group_for(self, cls: str, dtype: str, op: str = "") -> dict | None:
        for key in (f"{cls}:{op}/{dtype}", f"{cls}:{op}", f"{cls}/{dtype}", cls, FALLBACK.get(cls, "")):
            if key in getattr(self, "groups_", {}):
                return self.groups_[key]
        return None

    def _groups_for(self, cls: str, dtype: str, op: str, base: str = "") -> list[dict]:
        """Curves that may predict this op, most specific first (its layout's, its family's, its class's)."""
        keys = (f"{cls}:{op}/{dtype}", f"{cls}:{op}", f"{cls}:{base}/{dtype}", f"{cls}:{base}", f"{cls}/{dtype}", cls,
                FALLBACK.get(cls, ""))
        groups = getattr(self, "groups_", {})
        out: list[dict] = []
        for k in keys:
            if k in groups and not any(groups[k] is g for g in out):
                out.append(groups[k])
        return out

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Seconds per op: the roofline curves, times exp(learned residual) where the op has a work
        term (ops timed by a measured median or saturating curve get no residual)."""
        out = self._predict_curves(X)
        res = getattr(self, "residual_", None)
        if res:
            f = self._features(X)
            sized = np.flatnonzero(np.isfinite(f["x"]) & (f["roof"] > 0))
            if sized.size:
                known = list(res.get("families") or {})
                fam = np.where(np.isin(f["aten"][sized], known), f["aten"][sized], f["base"][sized])
                out[sized] = out[sized] * np.exp(predict_residual(res, X.iloc[sized], fam, FALLBACK, self._trees(res)))
        return out

    def _trees(self, res: dict) -> list:
        """The residual's trees parsed once (a host fit times each training run's ops with one model): kept
        with the section they came from, and parsed again if the model is given another."""
        kept = getattr(self, "_parsed", None)
        if kept is None or kept[0] is not res:
            kept = self._parsed = (res, parsed_trees(res))
        return kept[1]

    def _predict_curves(self, X: pd.DataFrame) -> np.ndarray:
        if not hasattr(self, "groups_"):
            raise CalibError("kernel model is not fitted")
        f = self._features(X)
        out = np.full(len(X), np.nan)
        sized = np.isfinite(f["x"]) & (f["roof"] > 0)
        keys = np.array([f"{c}\0{d}\0{o}\0{b}" for c, d, o, b in zip(f["classes"], f["dtypes"], f["aten"], f["base"],
                                                                   strict=True)], dtype=object)
        for key in set(keys[sized].tolist()):
            cls, dt, op, base = key.split("\0")
            chain = self._groups_for(cls, dt, op, base)
            if not chain:
                continue
            rows = np.flatnonzero(sized & (keys == key))
            for grp, idx in _by_range(chain, f["x"][rows], rows):
                a = self._design(f["x"][idx], f["z"][idx], grp["knots"], grp["z_range"], grp["use_z"])
                offs = grp.get("op_offsets", {})
                g = a @ np.asarray(grp["coef"]) + np.array([offs.get(o, offs.get(b, 0.0))
                                                            for o, b in zip(f["aten"][idx], f["base"][idx], strict=True)])
                levels = grp.get("source_levels") or {}
                if levels:
                    g = g + np.array([levels.get(s, 0.0) for s in f["source"][idx]])
                t0 = float(grp.get("t0_s", 0.0))
                floor = np.where(f["bench"][idx], float(grp.get("t0_bench_s", t0)), t0)
                out[idx] = floor + f["roof"][idx] * np.exp(g)
        sat = getattr(self, "saturating_", {})
        for i in np.flatnonzero(np.isnan(out)):
            cls = f["classes"][i]
            key = next((k for k in (f"{cls}/{f['aten'][i]}", f"{cls}/{f['base'][i]}") if k in sat), "")
            if key and np.isfinite(f["xb"][i]):
                out[i] = float(np.exp(ClampedPiecewise.from_dict(sat[key])(np.array([f["xb"][i]]))[0]))
            else:
                out[i] = self._no_work_time(str(cls), str(f["dtypes"][i]), str(f["aten"][i]), str(f["base"][i]))
        return out

    def _no_work_time(self, cls: str, dtype: str, aten: str, base: str = "") -> float:
        """An op without FLOPs/bytes: the median measured time of that op or class, else the time of
        the smallest measured kernel of its class (a kernel doing next to nothing costs a launch)."""
        for key in (f"{cls}/{aten}", f"{cls}/{base}", cls, FALLBACK.get(cls, "")):
            if key in self.constants_:
                return self.constants_[key]
        grp = self._group_for(cls, dtype)
        if grp is None:
            raise CalibError(
                f"kernel model cannot predict a {cls or '?'} op ({aten or 'no aten op'}): "
                "it has neither FLOPs/bytes nor a measured class to take a launch time from"
            )
        x0 = np.array([grp["knots"][0]])
        a = self._design(x0, np.array([grp["z_range"][0]]), grp["knots"], grp["z_range"], grp["use_z"])
        cls_of_grp = next((c for c in OP_CLASSES if self.groups_.get(c) is grp), cls)
        peak = self.peaks.flops_for(dtype) if cls_of_grp in FLOP_CLASSES else self.peaks.mem_bytes_per_s
        return float(grp.get("t0_s", 0.0) + 10 ** x0[0] / peak * math.exp(float((a @ np.asarray(grp["coef"]))[0])))

    def score(self, X: pd.DataFrame, y: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
        """1 - MAPE (fraction): higher is better, as scikit-learn expects of a score."""
        pred = self.predict(X)
        rel = np.abs(pred - np.asarray(y, dtype=float)) / np.asarray(y, dtype=float)
        w = np.ones_like(rel) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        return float(1.0 - np.average(rel, weights=w))

    # ---- plain-data export ---------------------------------------------------------------
    def to_dict(self) -> dict:
        if not hasattr(self, "groups_"):
            raise CalibError("kernel model is not fitted")
        return {
            "form": "t0 + roofline x exp(clamped piecewise-linear residual in log10 work, linear in log10 "
                    "intensity, + per-aten-op offset); x exp(learned residual trees) where `residual` is present",
            "peaks": self.peaks.to_dict() if self.peaks else None,
            "classes": self.groups_,
            "constants_s": self.constants_,
            "saturating": self.saturating_,
            "embedding_tokens": True,
            **({"residual": self.residual_} if getattr(self, "residual_", None) else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> KernelModel:
        peaks = GpuPeaks.from_dict(data["peaks"]) if data.get("peaks") else None
        model = cls(peaks=peaks)
        model.groups_ = {str(k): _checked_group(str(k), dict(v)) for k, v in (data.get("classes") or {}).items()}
        model.constants_ = {str(k): float(v) for k, v in (data.get("constants_s") or {}).items()}
        model.saturating_ = {str(k): ClampedPiecewise.from_dict(v).to_dict() for k, v in (data.get("saturating") or {}).items()}
        model.embedding_tokens_ = bool(data.get("embedding_tokens", False))
        # Files written before the residual existed (calibration schema 1 without `kernel.residual`)
        # predict with the curves alone.
        model.residual_ = checked_residual(dict(data["residual"])) if data.get("residual") else None
        model.residual = model.residual_ is not None
        return model


def _checked_group(name: str, g: dict) -> dict:
    """A class curve read from a file: refuse one whose numbers cannot make a prediction."""
    knots, coef = list(g.get("knots") or []), list(g.get("coef") or [])
    use_z = bool(g.get("use_z", False))
    want = len(knots) + (1 if use_z else 0)
    if len(knots) < 2 or len(coef) != want or len(g.get("z_range") or []) != 2:
        raise ValueError(f"kernel class {name}: needs >= 2 knots, {want} coefficients and a z_range")
    g["knots"], g["coef"] = [float(k) for k in knots], [float(c) for c in coef]
    g["z_range"] = [float(z) for z in g["z_range"]]
    g["t0_s"] = float(g.get("t0_s", 0.0))
    g["t0_bench_s"] = float(g.get("t0_bench_s", g["t0_s"]))
    g["op_offsets"] = {str(k): float(v) for k, v in (g.get("op_offsets") or {}).items()}
    if "source_levels" in g:
        g["source_levels"] = {str(k): float(v) for k, v in (g.get("source_levels") or {}).items()}
    return g


def _with_shape_columns(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in SHAPE_COLUMNS if c not in df.columns]
    if not missing:
        return df
    df = df.copy()
    for col in missing:
        df[col] = "" if col in _STRING_COLUMNS else np.nan
    return df


def shape_keys(df: pd.DataFrame) -> pd.Series:
    """One string per row naming its shape (the SHAPE_COLUMNS values); rows of one shape share it."""
    df = _with_shape_columns(df)
    keys = df[SHAPE_COLUMNS[0]].map(str)
    for col in SHAPE_COLUMNS[1:]:
        keys = keys + "|" + df[col].map(str)
    return keys


_OP_CONTEXT = ["bundle", "rank", "step", "stream"]


def op_instances(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel rows -> one row per launching op instance, its `time_s` the sum of its kernels.

    One aten op may launch several kernels (a split-K GEMM and its `splitKreduce`, a norm backward's
    input- and weight-gradient kernels, a two-pass reduction); every one of them carries the op's
    shape columns. The workload generator times an op once (its `kernels` launched back to back), so
    the model is fitted on the op's total time, not on the median of unlike kernels. Kernels of one op are consecutive on their
    stream with the same shape; a repeat of the op's first kernel name starts the next instance.
    A CALL_OPS op (the embedding backward) is every run of its consecutive kernels instead, whatever
    their names and records, with its largest kernel's record and its path's layout (calib.ops.call_layout).
    Rows without `start_s`/`name` (or microbenchmark rows, timed per op already) pass unchanged.
    """
    if kernels.empty or not {"start_s", "name"} <= set(kernels.columns):
        return kernels
    df = _with_shape_columns(kernels)
    bench = df["source"].astype(str).to_numpy() == EVENT_BENCH
    if bench.all():
        return df
    ctx = [c for c in _OP_CONTEXT if c in df.columns]
    tr = df[~bench]
    ctx_code = tr.groupby(ctx, dropna=False, sort=False).ngroup().to_numpy() if ctx else np.zeros(len(tr), int)
    key_code = tr.groupby(SHAPE_COLUMNS, dropna=False, sort=False).ngroup().to_numpy()
    start = pd.to_numeric(tr["start_s"], errors="coerce").to_numpy(dtype=float)
    order = np.lexsort((start, ctx_code))
    tr = tr.iloc[order].reset_index(drop=True)
    ctx_code, key_code, start = ctx_code[order], key_code[order], start[order]
    # Kernels on one stream run one after the other: rows without distinct start times (tables
    # not from a profiler) are never merged.
    after = np.zeros(len(tr), dtype=bool)
    after[1:] = (ctx_code[1:] == ctx_code[:-1]) & (start[1:] > start[:-1])
    same = after.copy()
    same[1:] &= key_code[1:] == key_code[:-1]
    # A CALL_OPS op's run of kernels is one instance whatever their names and records.
    aten = tr["aten_op"].astype(str).to_numpy()
    call = np.isin(aten, list(CALL_OPS))
    joined = np.zeros(len(tr), dtype=bool)
    joined[1:] = after[1:] & call[1:] & (aten[1:] == aten[:-1])
    if not (same.any() or joined.any()):
        return df
    names = pd.factorize(tr["name"].astype(str))[0]
    new_op = ~same
    first = -1
    for i in np.flatnonzero(same | np.roll(same, -1)):  # only rows inside a run need the sequential rule
        if not same[i]:
            first = names[i]
        elif names[i] == first:
            new_op[i] = True
    new_op[call] = ~joined[call]
    op = np.cumsum(new_op) - 1
    tr["_op"] = op
    agg = tr.groupby("_op", sort=True)["time_s"].sum().to_numpy()
    ops = tr.drop_duplicates("_op").drop(columns=["_op"]).assign(time_s=agg)
    if call.any():
        # A call's instance has the record of its largest kernel (the op's own bytes: its memsets
        # record a few bytes of scratch) and the layout of its path.
        calls = tr[call]
        rep = calls.assign(_b=pd.to_numeric(calls["bytes"], errors="coerce").fillna(-1.0)).sort_values(
            ["_op", "_b"], ascending=[True, False], kind="stable").drop_duplicates("_op")
        path = calls.groupby("_op", sort=True).apply(
            lambda g: call_layout(str(g["aten_op"].iloc[0]), g["name"].astype(str).tolist()), include_groups=False)
        pos = rep["_op"].to_numpy()  # ops has one row per instance, in instance order
        cols = [c for c in SHAPE_COLUMNS if c in ops.columns and c != "layout"]
        ops = ops.reset_index(drop=True)
        for c in cols:
            ops.loc[pos, c] = rep[c].to_numpy()
        ops.loc[pos, "layout"] = path.to_numpy()  # both in instance order
    return pd.concat([df[bench], ops], ignore_index=True)


def shape_table(kernels: pd.DataFrame, instances: bool = False) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Collapse kernel rows to one row per distinct shape: (shapes, median op time_s, op count).

    Kernels of one op instance are summed first (op_instances; `instances`: the rows are op instances
    already). Held-out errors are computed over shapes, so the same GEMM seen 200 times counts once
    (see shape_folds for the folds).
    """
    df = _with_shape_columns(kernels if instances else op_instances(kernels))
    codes = df.groupby(SHAPE_COLUMNS, dropna=False, sort=True).ngroup().to_numpy()
    df = df.assign(_key=codes)
    agg = df.groupby("_key", sort=True).agg(time_s=("time_s", "median"), count=("time_s", "size"))
    first = df.drop_duplicates("_key").set_index("_key").loc[agg.index, SHAPE_COLUMNS]
    return first.reset_index(drop=True), agg["time_s"].to_numpy(float), agg["count"].to_numpy(int)


def shape_folds(shapes: pd.DataFrame, k: int, seed: int = 0) -> list[np.ndarray]:
    """k test folds over the rows of a shape table that hold out whole shapes: the rows of one
    shape from microbenchmarks and from profiled steps (`source` differs) fall in the same fold, so
    no fold is predicted from a measurement of one of its own shapes."""
    df = _with_shape_columns(shapes)
    codes = df.groupby([c for c in SHAPE_COLUMNS if c != "source"], dropna=False, sort=True).ngroup().to_numpy()
    groups = kfold_indices(int(codes.max()) + 1 if len(codes) else 0, k, seed)
    return [np.flatnonzero(np.isin(codes, g)) for g in groups]
