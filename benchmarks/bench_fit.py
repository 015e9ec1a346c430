"""Fit-time benchmark: how long `calib fit` takes on the bundled traces (or the bundles given).

    python benchmarks/bench_fit.py [--memory] [BUNDLE_DIRS...]      # default: traces/h200

Prints wall seconds for reading the bundles and for each model's fit with its cross-validation;
with --memory also the peak Python memory (tracemalloc, which slows the run several-fold).
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import (
        FitOptions,
        collective_points,
        fit_kernels,
        fit_network,
        fit_power,
        kernel_rows,
        select_bundles,
    )
    from calib.models.peaks import peaks_for_gpu

    memory = "--memory" in argv
    paths = [a for a in argv if a != "--memory"] or [str(ROOT / "traces" / "h200")]
    if memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    bundles = select_bundles(load_bundles(paths), FitOptions())
    t_read = time.perf_counter() - t0
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    opts = FitOptions()
    timings = {"read bundles": t_read}
    t = time.perf_counter()
    rows, _ = kernel_rows(bundles)
    if not rows.empty:
        fit_kernels(rows, peaks, opts)
        timings[f"kernel model ({len(rows)} kernel rows, k-fold)"] = time.perf_counter() - t
    t = time.perf_counter()
    micro, train = collective_points(bundles)
    if not micro.empty or not train.empty:
        fit_network(micro, train, bundles[0].manifest.gpu.count or 8, opts)
        timings[f"network model ({len(micro) + len(train)} points, k-fold + ASTRA-sim fit)"] = time.perf_counter() - t
    t = time.perf_counter()
    fit_power(bundles, peaks)
    timings["power model (leave-one-configuration-out)"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    print(f"bundles: {len(bundles)} from {', '.join(paths)}")
    for name, sec in timings.items():
        print(f"  {name:60s} {sec:8.3f} s")
    extra = f"   peak Python memory {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB" if memory else ""
    print(f"  {'total':60s} {total:8.3f} s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
