"""What a kernel model fitted per clock would gain: kernel CV with the training steps' rows scaled to the top clock.

    python benchmarks/kernel_per_clock.py [--beta-gemm B] [--beta-attention B] [--no-bench] [BUNDLE_DIRS...]

A profiled step's kernels ran at its run's SM clock under the power cap (the H200 runs: 1.56-1.98 GHz), the
kernel-timed microbenchmark's at the top clock (traces/README.md, round 45). Here every training row of a compute
class is scaled by (its run's profiled-step SM clock / top clock)^beta (beta per class, from
measure/probes/clock_sensitivity.py: GEMMs 0.45, attention 0.77; memory-bound classes 0), rows of runs without a
clock reading left as they are, and the kernel model (curves + residual, no per-source level) is cross-validated over
distinct shapes as `calib fit` does it. `--beta-gemm 0 --beta-attention 0` is the model as fitted now (without the
level); `--no-bench` leaves the microbenchmark out. The errors are in the scaled times: a shape's median over runs at
one clock, which a prediction would scale back by the clock its run holds (not modelled here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def profiled_clocks(bundles: list) -> dict[str, float]:
    """Median SM clock (Hz) of each training bundle's profiled steps, where its telemetry has 3 or more samples."""
    from calib.validation.measured import steps_span_s

    out = {}
    for b in bundles:
        if b.manifest.kind != "training" or not b.has("telemetry"):
            continue
        tel, steps = b.table("telemetry"), b.table("steps")
        prof = steps["profiled"].astype(bool)
        if "sm_clock_hz" not in tel.columns or not prof.any():
            continue
        lo, hi = steps_span_s(steps[prof])
        w = tel.loc[(tel["t_s"] >= lo) & (tel["t_s"] <= hi), "sm_clock_hz"].dropna()
        if len(w) >= 3:
            out[b.id] = float(w.median())
    return out


def main(argv: list[str]) -> int:
    import calib.models.kernel as kernel
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, kernel_rows, select_bundles
    from calib.models.common import cross_validate
    from calib.models.kernel import KernelModel, shape_folds, shape_table
    from calib.models.peaks import peaks_for_gpu

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="*", default=[str(ROOT / "traces" / "h200")])
    p.add_argument("--beta-gemm", type=float, default=0.45)
    p.add_argument("--beta-attention", type=float, default=0.77)
    p.add_argument("--no-bench", action="store_true")
    args = p.parse_args(argv)
    bundles = select_bundles(load_bundles(args.dirs), FitOptions())
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    top = peaks.max_sm_clock_hz
    clock = profiled_clocks(bundles)
    rows, _ = kernel_rows(bundles)
    if args.no_bench:
        rows = rows[rows["source"].astype(str) == "trace"]
    kernel.LEVEL_SOURCES = ()  # the clock stands in for the microbenchmark's level
    ratio = rows["bundle"].map(clock).fillna(top).to_numpy(float) / top
    beta = rows["op_class"].astype(str).map({"gemm": args.beta_gemm, "attention": args.beta_attention}).fillna(0.0)
    scale = np.where(rows["source"].astype(str) == "trace", ratio ** beta.to_numpy(float), 1.0)
    shapes, t, counts = shape_table(rows.assign(time_s=rows["time_s"] * scale))
    folds = shape_folds(shapes, FitOptions().folds)
    pred = cross_validate(len(t), folds,
                          lambda tr, te: KernelModel(peaks=peaks).fit(shapes.iloc[tr], t[tr]).predict(shapes.iloc[te]))
    rel = np.abs(pred - t) / t
    src, cls = shapes["source"].astype(str).to_numpy(), shapes["op_class"].astype(str).to_numpy()
    print(f"betas gemm {args.beta_gemm} attention {args.beta_attention}; {len(clock)} runs with a clock; "
          f"microbenchmark {'left out' if args.no_bench else 'in'}")
    print(f"  {'subset':18s} {'shapes':>6s} {'MAPE %':>7s} {'time-weighted %':>16s}")
    for label, sel in (("all", np.ones(len(t), bool)), ("steps", src == "trace"),
                       ("steps gemm", (src == "trace") & (cls == "gemm")),
                       ("steps attention", (src == "trace") & (cls == "attention")),
                       ("microbenchmark", src == "bench-kernel")):
        ok = sel & np.isfinite(pred)
        if ok.any():
            print(f"  {label:18s} {int(ok.sum()):6d} {100 * rel[ok].mean():7.2f} "
                  f"{100 * np.average(rel[ok], weights=(counts * t)[ok]):16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
