"""Kernel-model accuracy: held-out error per op class, source, size band and op family.

    python benchmarks/kernel_accuracy.py [--curves-only] [--families] [BUNDLE_DIRS...]   # default: traces/h200

Cross-validation as `calib fit` does it (calib.models.kernel.shape_folds: 5 folds over distinct
shapes, a shape's microbenchmark and profiled rows held out together), for the curves alone and
for the curves with the learned residual, plus the extrapolation checks: the largest 20% of shapes
by work per class predicted from the rest, and full-size GEMMs of GPT-3 175B and Llama-3 70B at
TP 1..8 (predicted vs the largest measured GEMM's throughput: a sanity bound, not a measurement).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without `pip install -e .`


def _cv(shapes: pd.DataFrame, t: np.ndarray, make: object, folds: list[np.ndarray]) -> np.ndarray:
    from calib.models.common import cross_validate

    return cross_validate(len(t), folds, lambda tr, te: make().fit(shapes.iloc[tr], t[tr]).predict(shapes.iloc[te]))  # type: ignore[operator]


def _table(name: str, pred: np.ndarray, shapes: pd.DataFrame, t: np.ndarray, counts: np.ndarray, ok: np.ndarray,
           families: bool) -> None:
    from calib.models.kernel import op_family

    rel = np.abs(pred - t) / t
    cls = shapes["op_class"].astype(str).to_numpy()
    src = shapes["source"].astype(str).to_numpy()
    w = counts * t
    print(f"\n== {name}")
    print(f"  {'subset':34s} {'count':>6s} {'MAPE %':>8s} {'max %':>8s} {'time-weighted %':>16s}")

    def line(label: str, sel: np.ndarray) -> None:
        sel = sel & ok
        if sel.any():
            print(f"  {label:34s} {int(sel.sum()):6d} {100 * rel[sel].mean():8.2f} {100 * rel[sel].max():8.1f} "
                  f"{100 * np.average(rel[sel], weights=w[sel]):16.2f}")

    line("all", np.ones(len(t), dtype=bool))
    for c in ("gemm", "attention", "memory", "other"):
        line(f"class {c}", cls == c)
    for s in ("trace", "bench", "bench-kernel"):
        line(f"source {s}", src == s)
    lt = np.log10(t)
    for lo, hi in ((-9, -5), (-5, -4.5), (-4.5, -4), (-4, -3), (-3, 0)):
        line(f"time 1e{lo:g}..1e{hi:g} s", (lt >= lo) & (lt < hi))
    if families:
        fam = np.array([f"{c}:{op_family(a)}" for c, a in zip(cls, shapes["aten_op"].astype(str), strict=True)])
        share = pd.Series(np.where(ok, rel, 0.0)).groupby(fam).sum().sort_values(ascending=False)
        for f in share.index[:15]:
            line(f"  {f}"[:34], fam == f)


def _full_size(model: object) -> None:
    """GEMMs of full-size layers (tokens = micro batch 1 x seq 4096 / 2048): predicted TFLOP/s."""
    from calib.workload.models import PRESETS

    rows = []
    for name, tokens in (("gpt3-175b", 2048), ("llama3-70b", 4096)):
        spec = PRESETS[name]
        h = spec.hidden
        ffn = spec.ffn_hidden
        for tp in (1, 2, 4, 8):
            for label, (m, n, k) in (("fc1", (tokens, ffn // tp, h)), ("fc2", (tokens, h, ffn // tp)),
                                     ("fc1 wgrad", (ffn // tp, h, tokens))):
                rows.append({"model": name, "tp": tp, "gemm": label, "op_class": "gemm", "aten_op": "aten::mm",
                             "m": m, "n": n, "k": k, "batch": 1, "flops": 2.0 * m * n * k,
                             "bytes": 2.0 * (m * k + k * n + m * n), "dtype": "bfloat16"})
    df = pd.DataFrame(rows)
    df["time_s"] = model.predict(df)  # type: ignore[attr-defined]
    df["tflops"] = df["flops"] / df["time_s"] / 1e12
    print("\n== full-size GEMMs (predicted; dense BF16 peak 989 TFLOP/s)")
    print(df.pivot_table(index=["model", "gemm"], columns="tp", values="tflops").round(0).to_string())


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, kernel_rows, roofline_scored, select_bundles
    from calib.models.kernel import KernelModel, shape_folds, shape_table
    from calib.models.peaks import peaks_for_gpu

    curves_only = "--curves-only" in argv
    families = "--families" in argv
    paths = [a for a in argv if not a.startswith("--")] or [str(ROOT / "traces" / "h200")]
    bundles = select_bundles(load_bundles(paths), FitOptions())
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    rows, _ = kernel_rows(bundles)
    shapes, t, counts = shape_table(rows)
    folds = shape_folds(shapes, FitOptions().folds)
    scored = roofline_scored(shapes)
    variants = [("curves only", False)] + ([] if curves_only else [("curves + learned residual", True)])
    for name, residual in variants:
        make = lambda r=residual: KernelModel(peaks=peaks, residual=r)  # noqa: E731
        t0 = time.perf_counter()
        model = make().fit(shapes, t)
        fit_s = time.perf_counter() - t0
        pred = _cv(shapes, t, make, folds)
        ok = np.isfinite(pred) & scored
        _table(f"{name}: 5-fold over distinct shapes (fit on all {len(t)} shapes: {fit_s:.2f} s)", pred, shapes, t,
               counts, ok, families)
        work = np.where(shapes["op_class"].isin(["gemm", "attention"]), shapes["flops"], shapes["bytes"])
        work = np.nan_to_num(pd.to_numeric(pd.Series(work), errors="coerce").to_numpy(float))
        big = np.zeros(len(t), dtype=bool)
        cls = shapes["op_class"].astype(str).to_numpy()
        for c in ("gemm", "attention", "memory", "other"):
            sel = (cls == c) & (work > 0)
            if sel.sum() >= 16:
                big |= sel & (work >= np.quantile(work[sel], 0.8))
        ext = make().fit(shapes[~big], t[~big]).predict(shapes[big])
        full = np.full(len(t), np.nan)
        full[big] = ext
        _table(f"{name}: extrapolation (largest 20% by work per class from the rest)", full, shapes, t, counts,
               big & scored, False)
        _full_size(model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
