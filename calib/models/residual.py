"""The kernel model's learned residual: gradient-boosted trees on physically motivated features.

The roofline curves (calib.models.kernel) give a time per op from its work; what they cannot see is
how a kernel maps onto the GPU. The residual r = log(measured / curve) is learned by scikit-learn's
GradientBoostingRegressor (Huber loss) from these features of an op's shape:

  GEMM / attention  log10 m, n, k, batch; arithmetic intensity; wave quantisation of the output tiles
                    over the SMs for 128x128, 128x256 and 256x128 tiles (Hopper cuBLAS/nvjet tile
                    sizes; attention: 128 query rows per (batch x head) tile): tiles / (waves x SMs)
                    and log10 waves; alignment of m, n, k (multiples of 64/16/8 take the fast
                    vectorised paths, odd MoE token counts do not).
  memory / other    log10 bytes, element size, and the largest power of two dividing the element count (a scalar
                    or broadcast operand adds a few elements to the op's bytes, so same-shape
                    operands leave many factors of two and scalar/broadcast ones few: it tells the
                    vectorised elementwise kernels from the strided and scalar ones); a reduction's
                    log10 m (outputs) and k (elements reduced into each) where known: one reduction
                    kernel runs 6x slower per byte over rows of 4 than over rows of 14,336.
  all               op class, op family (coded in order of its mean residual; rare families share
                    one code), microbenchmark flag (never set when predicting).

Trees are constant outside the thresholds they learned; the residual is clipped to the range of the
training residuals, and beyond the measured work (FLOPs or bytes) of its op class it fades linearly
to 0 over TAPER_DECADES, so a full-size shape is timed by the clamped curves (the efficiency of the
largest measured kernel) rather than by a correction learned at the edge of the data.

The fitted trees are exported as plain numbers (no pickles): per tree two lists in preorder,
`feature` and `value` (split threshold or leaf value, learning rate folded in).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.ensemble import GradientBoostingRegressor

from calib.errors import CalibError
from calib.models.common import EVENT_BENCH, KERNEL_BENCH
from calib.models.peaks import normalize_dtype
from calib.ops import FLOP_CLASSES

FEATURES = ("cls", "fam", "bench", "log_flops", "log_bytes", "log_intensity", "log_m", "log_n", "log_k",
            "log_batch", "wq_128x128", "wq_128x256", "wq_256x128", "log_waves_128x128", "log_waves_128x256",
            "log_waves_256x128", "align_m", "align_n", "align_k", "pow2_elements", "element_bytes")
CLASS_CODE = {"gemm": 0, "attention": 1, "memory": 2, "other": 3}
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "float64": 8, "int64": 8, "int32": 4,
                 "bool": 1}
TILES = ((128, 128), (128, 256), (256, 128))
TAPER_DECADES = 2.0  # the residual fades to 0 over this much work beyond the class's measured range
MIN_FAMILY_POINTS = 5  # a family with fewer shapes shares the "rare" code -1
# Few, deep trees: fitted in 1-3 s on ~4,500 shapes, ~100 kB in the calibration file. Chosen by the
# 5-fold CV of benchmarks/kernel_accuracy.py on traces/h200 (MAPE over shapes: depth 5 / leaf 3 8.5%,
# depth 6 / leaf 4 8.0%, depth 7 / leaf 4 7.7%; 300 trees at rate 0.05 were slower and larger for
# less than depth adds).
GB_PARAMS = {"loss": "huber", "n_estimators": 80, "max_depth": 6, "learning_rate": 0.15, "subsample": 0.8,
             "min_samples_leaf": 4, "random_state": 0}


def _num(df: pd.DataFrame, name: str) -> np.ndarray:
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
    return np.full(len(df), np.nan)


def _log10(v: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(np.nan_to_num(v, nan=1.0), 1.0))


def _alignment(v: np.ndarray) -> np.ndarray:
    """3: multiple of 64, 2: of 16, 1: of 8, 0: otherwise."""
    i = np.nan_to_num(v, nan=0.0).astype(np.int64)
    return np.where(i % 64 == 0, 3, np.where(i % 16 == 0, 2, np.where(i % 8 == 0, 1, 0))).astype(float)


def residual_features(X: pd.DataFrame, families: dict[str, int], fam: np.ndarray, sms: int,
                      reductions: bool = True) -> np.ndarray:
    """The feature matrix (columns in FEATURES order) of op rows; `fam` = op family per row.
    `reductions` False: a reduction's m and k are not seen (trees fitted before they were)."""
    n = len(X)
    cls = X["op_class"].fillna("").astype(str).to_numpy() if "op_class" in X.columns else np.full(n, "")
    flops, nbytes = np.nan_to_num(_num(X, "flops")), np.nan_to_num(_num(X, "bytes"))
    m, nn, k = _num(X, "m"), _num(X, "n"), _num(X, "k")
    batch = np.nan_to_num(_num(X, "batch"), nan=1.0)
    batch = np.where(batch > 0, batch, 1.0)
    shaped = np.isin(cls, FLOP_CLASSES) & np.isfinite(m) & np.isfinite(nn) & np.isfinite(k)
    att = cls == "attention"
    reduced = (cls == "memory") & np.isfinite(m) & np.isfinite(k) & reductions
    src = X["source"].fillna("").astype(str).to_numpy() if "source" in X.columns else np.full(n, "")
    cols: dict[str, np.ndarray] = {
        "cls": np.array([CLASS_CODE.get(c, 3) for c in cls], dtype=float),
        "fam": np.array([families.get(str(f), -1) for f in fam], dtype=float),
        "bench": (src == EVENT_BENCH) + 2.0 * (src == KERNEL_BENCH),
        "log_flops": _log10(flops), "log_bytes": _log10(nbytes), "log_intensity": _log10(flops) - _log10(nbytes),
        "log_m": np.where(shaped | reduced, _log10(m), 0.0), "log_n": np.where(shaped, _log10(nn), 0.0),
        "log_k": np.where(shaped | reduced, _log10(k), 0.0), "log_batch": np.where(shaped, _log10(batch), 0.0),
    }
    mm, nv = np.nan_to_num(m, nan=1.0), np.nan_to_num(nn, nan=1.0)
    for tm, tn in TILES:
        # Flash attention tiles the queries only (each CTA walks all keys of one batch x head).
        tiles = np.where(att, np.ceil(mm / tm), np.ceil(mm / tm) * np.ceil(nv / tn)) * batch
        waves = np.ceil(tiles / sms)
        cols[f"wq_{tm}x{tn}"] = np.where(shaped, tiles / np.maximum(waves * sms, 1.0), 1.0)
        cols[f"log_waves_{tm}x{tn}"] = np.where(shaped, np.log10(np.maximum(waves, 1.0)), 0.0)
    for name, v in (("align_m", m), ("align_n", nn), ("align_k", k)):
        cols[name] = np.where(shaped, _alignment(v), 3.0)
    dt = X["dtype"].fillna("").astype(str).to_numpy() if "dtype" in X.columns else np.full(n, "")
    es = np.array([ELEMENT_BYTES.get(normalize_dtype(d), 2) for d in dt], dtype=float)
    el = np.floor(nbytes / es).astype(np.int64)
    low = np.log2(np.maximum(el & -el, 1)).clip(0, 24)
    cols["pow2_elements"] = np.where(shaped, 24.0, low)
    cols["element_bytes"] = es
    return np.column_stack([cols[f] for f in FEATURES])


def _work(X: pd.DataFrame) -> np.ndarray:
    """log10 of an op's work: FLOPs for GEMM/attention, bytes otherwise (as the curves use)."""
    cls = X["op_class"].fillna("").astype(str).to_numpy()
    fl, by = np.nan_to_num(_num(X, "flops")), np.nan_to_num(_num(X, "bytes"))
    return np.where(np.isin(cls, FLOP_CLASSES) & (fl > 0), _log10(fl), _log10(by))


def family_codes(fam: np.ndarray, r: np.ndarray, base: np.ndarray | None = None) -> dict[str, int]:
    """Op families with >= MIN_FAMILY_POINTS shapes, coded 0.. in order of their mean residual (so a
    tree split on the code groups families that deviate alike); the others share code -1. A family
    seen only split by layout (`fam` "copy#strided", `base` "copy") also maps to the code of its most
    frequent layout, for ops that come without one."""
    stats = pd.Series(r).groupby(np.asarray(fam, dtype=str)).agg(["mean", "size"])
    s = stats[stats["size"] >= MIN_FAMILY_POINTS]["mean"].sort_values(kind="stable")
    codes = {str(f): i for i, f in enumerate(s.index)}
    if base is not None:
        base_of = dict(zip(np.asarray(fam, dtype=str).tolist(), np.asarray(base, dtype=str).tolist(), strict=True))
        for b in sorted(set(base_of.values()) - set(codes) - {""}):
            split = stats[[base_of[str(f)] == b and str(f) != b for f in stats.index]]
            top = split["size"].idxmax() if len(split) else None
            if top is not None and str(top) in codes:
                codes[b] = codes[str(top)]
    return codes


def fit_residual(X: pd.DataFrame, fam: np.ndarray, r: np.ndarray, sms: int, base: np.ndarray | None = None) -> dict:
    """Fit the trees on residuals r (log measured / curve) of sized op rows; plain-number dict.
    `fam` is each row's op family as the model keys it (split by layout), `base` without layout."""
    families = family_codes(fam, r, base)
    F = residual_features(X, families, fam, sms)
    gb = GradientBoostingRegressor(**GB_PARAMS).fit(F, r)
    lr = float(gb.learning_rate)
    trees = [_preorder(est.tree_, lr) for est in gb.estimators_[:, 0]]
    init = float(np.asarray(gb.init_.predict(F[:1])).ravel()[0])
    lo, hi = float(np.min(r)), float(np.max(r))
    cls = X["op_class"].fillna("").astype(str).to_numpy()
    seen = sorted(set(cls.tolist()))
    work = _work(X)
    ranges = {c: [float(work[cls == c].min()), float(work[cls == c].max())] for c in seen}
    return {"features": list(FEATURES), "families": families, "classes": seen, "work_range": ranges,
            "sms": int(sms), "init": init,
            "clip": [float(lo), float(hi)], "trees": trees, "count": int(len(r)), "reduction_shapes": True}


def _short32(v: float) -> float:
    """The shortest decimal that reads back as the same float32 (keeps the YAML small)."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def _preorder(tree: object, scale: float) -> dict:
    """One fitted tree as two lists in preorder (children follow their parent, left first):
    `feature` (-1 for a leaf) and `value` (the split threshold, or the leaf's value times `scale`).
    A threshold is stored as the largest float32 not above it: scikit-learn compares float32
    features with it, so `x <= stored` in float32 splits exactly as the fitted tree did."""
    feat, thr = tree.feature, tree.threshold  # type: ignore[attr-defined]
    left, right, val = tree.children_left, tree.children_right, tree.value[:, 0, 0]  # type: ignore[attr-defined]
    fs: list[int] = []
    vs: list[float] = []
    stack = [0]
    while stack:
        i = stack.pop()
        if left[i] < 0:
            fs.append(-1)
            vs.append(_short32(round(scale * float(val[i]), 6)))
            continue
        t32 = np.float32(thr[i])
        if float(t32) > float(thr[i]):
            t32 = np.nextafter(t32, np.float32(-np.inf))
        fs.append(int(feat[i]))
        vs.append(_short32(float(t32)))
        stack += [int(right[i]), int(left[i])]
    return {"feature": fs, "value": vs}


def _links(feature: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Child indices of a preorder tree (see _preorder); ValueError when the lists are not a tree."""
    n = len(feature)
    left, right = np.full(n, -1), np.full(n, -1)
    open_: list[int] = []
    for i in range(n):
        if i > 0:
            if not open_:
                raise ValueError("kernel residual: a tree has nodes after its last leaf")
            parent = open_[-1]
            if left[parent] < 0:
                left[parent] = i
            else:
                right[parent] = i
                open_.pop()
        if feature[i] >= 0:
            open_.append(i)
    if open_:
        raise ValueError("kernel residual: a tree ends before all its splits have two children")
    return left, right


def checked_residual(d: dict) -> dict:
    """A residual section read from a file: refuse one that cannot make a prediction."""
    if list(d.get("features") or []) != list(FEATURES):
        raise ValueError(f"kernel residual: features {d.get('features')} are not this calib's {list(FEATURES)}")
    for i, t in enumerate(d.get("trees") or []):
        feat, val = list(t.get("feature") or []), list(t.get("value") or [])
        if not feat or len(feat) != len(val) or max(feat) >= len(FEATURES):
            raise ValueError(f"kernel residual: tree {i} needs `feature` and `value` lists of one length")
        _links([int(f) for f in feat])
    if len(d.get("clip") or []) != 2:
        raise ValueError("kernel residual: needs a clip [low, high]")
    return d


Tree = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # feature, value, threshold, left, right


def parsed_trees(d: dict) -> list[Tree]:
    """The residual section's trees as arrays, each with its child links (what `predict_residual` walks)."""
    out = []
    for t in d["trees"]:
        feat = np.asarray(t["feature"], dtype=np.int64)
        val = np.asarray(t["value"], dtype=float)
        out.append((feat, val, val.astype(np.float32), *_links(feat.tolist())))
    return out


def predict_residual(d: dict, X: pd.DataFrame, fam: np.ndarray, fallback: dict[str, str] | None = None,
                     trees: list[Tree] | None = None) -> np.ndarray:
    """log(time / curve) for op rows, clipped to the training residuals' range. A row of an op
    class the trees never saw is treated as its `fallback` class (the class whose curve times it).
    `trees`: `parsed_trees(d)`, for a caller predicting many times with one section."""
    seen = set(d.get("classes") or CLASS_CODE)
    if fallback and "op_class" in X.columns:
        cls = X["op_class"].fillna("").astype(str)
        if not cls.isin(seen).all():
            X = X.assign(op_class=[c if c in seen else fallback.get(c, c) for c in cls])
    F = residual_features(X, {str(k): int(v) for k, v in (d.get("families") or {}).items()}, fam, int(d["sms"]),
                          bool(d.get("reduction_shapes", False)))
    F32 = F.astype(np.float32)
    out = np.full(len(F), float(d["init"]))
    rows = np.arange(len(F))
    for feat, val, thr, left, right in trees if trees is not None else parsed_trees(d):
        node = np.zeros(len(F), dtype=np.int64)
        while True:
            inner = feat[node] >= 0
            if not inner.any():
                break
            go_left = F32[rows, np.where(inner, feat[node], 0)] <= thr[node]
            node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        out += val[node]
    if not np.all(np.isfinite(out)):
        raise CalibError("kernel residual: a prediction is not finite (corrupt residual trees)")
    out = np.clip(out, float(d["clip"][0]), float(d["clip"][1]))
    # Beyond the measured work of its class the residual fades out over TAPER_DECADES: a shape far
    # larger than any measured one is timed by the curves (which hold the largest measured
    # efficiency), not by the corrections learned at the edge of the data.
    ranges = d.get("work_range") or {}
    if ranges:
        cls = X["op_class"].fillna("").astype(str).to_numpy()
        lo = np.array([ranges.get(c, [-np.inf, np.inf])[0] for c in cls], dtype=float)
        hi = np.array([ranges.get(c, [-np.inf, np.inf])[1] for c in cls], dtype=float)
        w = _work(X)
        beyond = np.maximum(np.maximum(w - hi, lo - w), 0.0)
        out = out * np.clip(1.0 - beyond / TAPER_DECADES, 0.0, 1.0)
    return out
