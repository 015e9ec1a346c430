"""How the kernel model's error depends on the clock exponent: kernel CV with the training steps' rows scaled to the
top clock by other exponents than calib fit's (calib.models.clock.CLOCK_EXPONENT, one for both classes).

    python benchmarks/kernel_per_clock.py [--beta-gemm B] [--beta-attention B] [--no-bench] [BUNDLE_DIRS...]

A profiled step's kernels ran at its run's SM clock under the power cap (the H200 runs: 1.56-1.98 GHz), the
kernel-timed microbenchmark's at the top clock (traces/README.md, round 45). Here every training row of a compute
class is scaled by (its run's profiled-step SM clock / top clock)^beta (beta per class, from
measure/probes/clock_sensitivity.py: GEMMs 0.45, attention 0.77; memory-bound classes 0), rows of runs without a
clock reading left as they are, and the kernel model (curves + residual, no per-source level) is cross-validated over
distinct shapes as `calib fit` does it. `--beta-gemm 0 --beta-attention 0` is the model as fitted before the top clock
(without the level); `--no-bench` leaves the microbenchmark out. The errors are in the scaled times: a shape's median
over runs at one clock, which a prediction scales back by the clock its run holds (calib.models.clock). Measured on
traces/h200 without the microbenchmark (fifty-fourth session): unscaled 3.68 %, 0.45 / 0.77 3.65 %, 0.6 / 0.6 3.66 %,
1 / 1 3.69 %.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def profiled_clocks(bundles: list) -> dict[str, float]:
    """Each training bundle's profiled-step SM clock (Hz), where its telemetry says (calib.validation.measured)."""
    from calib.validation.measured import profiled_clock_hz

    clocks = {b.id: profiled_clock_hz(b) for b in bundles if b.manifest.kind == "training"}
    return {k: v for k, v in clocks.items() if v is not None}


def main(argv: list[str]) -> int:
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
    # calib fit's rows are at the top clock already (exponent calib.models.clock.CLOCK_EXPONENT): back to their
    # runs' clocks first, then scaled by this run's exponents.
    rows = rows.assign(time_s=rows["time_s"] / rows["clock_scale"].fillna(1.0))
    if args.no_bench:
        rows = rows[rows["source"].astype(str) == "trace"]
    ratio = rows["bundle"].map(clock).fillna(top).to_numpy(float) / top
    beta = rows["op_class"].astype(str).map({"gemm": args.beta_gemm, "attention": args.beta_attention}).fillna(0.0)
    scale = np.where(rows["source"].astype(str) == "trace", ratio ** beta.to_numpy(float), 1.0)
    shapes, t, counts = shape_table(rows.assign(time_s=rows["time_s"] * scale))
    folds = shape_folds(shapes, FitOptions().folds)
    pred = cross_validate(len(t), folds,
                          lambda tr, te: KernelModel(peaks=peaks, level_sources=()).fit(shapes.iloc[tr], t[tr]).predict(shapes.iloc[te]))
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
