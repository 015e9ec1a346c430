"""What does the memory-layout label buy the kernel model?

Ops of one aten name and byte count run 2-3x apart when their operands are laid out differently
(two `aten::sum` of 10.5 MB in one llama8b-tp2 step: 10 us as `reduce_kernel<128, 4>`, 30 us as
`reduce_kernel<512, 1>`). `calib fit` labels every profiled memory-bound kernel with the layout its
name shows (calib.ops.kernel_layout: `layout` column of the fit's kernel rows) and the generator's
templates carry the layout of each role (calib.workload.ops.MEMOP_LAYOUT). This script prints the
errors of `calib fit`'s own 5-fold cross-validation (calib.fit.fit_kernels) with the labels and
with every label blanked: the gain of the label.

    python benchmarks/kernel_layout.py [BUNDLE_DIRS...]      # default: traces/h200
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's calib
    sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, fit_kernels, kernel_rows, select_bundles
    from calib.models.peaks import peaks_for_gpu

    bundles = select_bundles(load_bundles(argv or [str(ROOT / "traces" / "h200")]), FitOptions())
    rows, _ = kernel_rows(bundles)
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    print(f"{'':18} {'kernels':24} {'shapes':>6} {'MAPE %':>7}")
    for what, table in (("without layout", rows.assign(layout="")), ("with layout", rows)):
        errors = fit_kernels(table, peaks, FitOptions())[1]
        for name in ("kernel", "kernel.memory", "kernel.gemm", "kernel.time_weighted"):
            e = errors[name]
            print(f"{what:18} {name:24} {e.count:6d} {e.mape:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
