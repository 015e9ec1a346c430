"""How much would a memory layout label on memory-bound ops buy the kernel model?

Ops of one aten name and byte count run 2-3x apart when their operands are laid out differently
(two `aten::sum` of 10.5 MB in one llama8b-tp2 step: 10 us as `reduce_kernel<128, 4>`, 30 us as
`reduce_kernel<512, 1>`). The op records the generator emits carry no layout, so the kernel model
cannot tell them apart. Profiled kernels name it: PyTorch picks `vectorized_elementwise_kernel`
for contiguous aligned operands, `unrolled_elementwise_kernel` for unaligned or casting ones,
`elementwise_kernel<...>` for strided or broadcast ones, and a reduction's block shape from the
reduced axis. This script labels the memory-bound rows of `calib fit`'s kernel table that way
(appended to `aten_op`, so shapes split by label and the residual sees it) and prints the errors
of `calib fit`'s own 5-fold cross-validation (calib.fit.fit_kernels), without and with the label:
the gain a generator that labels its memory ops could have.

    python benchmarks/kernel_layout.py [BUNDLE_DIRS...]      # default: traces/h200
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def layout_of(kernel_name: object) -> str:
    name = str(kernel_name)
    if "vectorized_elementwise_kernel" in name:
        return "contiguous"
    if "unrolled_elementwise_kernel" in name:
        return "unrolled"
    if re.search(r"\belementwise_kernel<", name):
        return "strided"
    m = re.search(r"reduce_kernel<(\d+), (\d+)", name)
    if m:
        return f"reduce{m.group(1)}x{m.group(2)}"
    return ""


def labelled(rows: pd.DataFrame) -> pd.DataFrame:
    out = rows.copy()
    mem = out["op_class"].astype(str) == "memory"
    label = out.loc[mem, "name"].map(layout_of)
    out.loc[mem, "aten_op"] = out.loc[mem, "aten_op"].astype(str) + np.where(label != "", "#" + label, "")
    return out


def cross_validated(rows: pd.DataFrame, peaks: object) -> dict[str, object]:
    """calib fit's own kernel cross-validation (calib.fit.fit_kernels) on these rows: its errors."""
    from calib.fit import FitOptions, fit_kernels

    return fit_kernels(rows, peaks, FitOptions())[1]  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, kernel_rows, select_bundles
    from calib.models.peaks import peaks_for_gpu

    bundles = select_bundles(load_bundles(argv or [str(ROOT / "traces" / "h200")]), FitOptions())
    rows, _ = kernel_rows(bundles)
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    print(f"{'':18} {'kernels':24} {'shapes':>6} {'MAPE %':>7}")
    for what, table in (("as fitted", rows), ("with layout label", labelled(rows))):
        errors = cross_validated(table, peaks)
        for name in ("kernel", "kernel.memory", "kernel.gemm", "kernel.time_weighted"):
            e = errors[name]
            print(f"{what:18} {name:24} {e.count:6d} {e.mape:7.2f}")  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
