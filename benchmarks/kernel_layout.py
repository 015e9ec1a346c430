"""How much would a memory layout label on memory-bound ops buy the kernel model?

Ops of one aten name and byte count run 2-3x apart when their operands are laid out differently
(two `aten::sum` of 10.5 MB in one llama8b-tp2 step: 10 us as `reduce_kernel<128, 4>`, 30 us as
`reduce_kernel<512, 1>`). The op records the generator emits carry no layout, so the kernel model
cannot tell them apart. Profiled kernels name it: PyTorch picks `vectorized_elementwise_kernel`
for contiguous aligned operands, `unrolled_elementwise_kernel` for unaligned or casting ones,
`elementwise_kernel<...>` for strided or broadcast ones, and a reduction's block shape from the
reduced axis. This script labels the memory-bound rows of `calib fit`'s kernel table that way
(appended to `aten_op`, so shapes split by label and the residual sees it) and prints the same
5-fold cross-validation as `calib fit`, without and with the label: the gain a generator that
labels its memory ops could have.

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


def cross_validated(rows: pd.DataFrame, peaks: object) -> dict[str, tuple[int, float, float]]:
    """Per class: (shapes, MAPE %, time-weighted MAPE %) of calib fit's 5-fold cross-validation."""
    from calib.fit import roofline_scored
    from calib.models.common import cross_validate
    from calib.models.kernel import KernelModel, shape_folds, shape_table

    shapes, t, counts = shape_table(rows)
    make = lambda: KernelModel(peaks=peaks, min_points=8)  # noqa: E731
    pred = cross_validate(len(t), shape_folds(shapes, 5),
                          lambda tr, te: make().fit(shapes.iloc[tr], t[tr]).predict(shapes.iloc[te]))
    ok = np.isfinite(pred) & roofline_scored(shapes)
    rel, w = np.abs(pred - t) / t, counts * t
    cls = shapes["op_class"].astype(str).to_numpy()
    out = {}
    for c, sel in (("all", ok), ("memory", ok & (cls == "memory")), ("gemm", ok & (cls == "gemm"))):
        out[c] = (int(sel.sum()), float(100 * rel[sel].mean()), float(100 * np.average(rel[sel], weights=w[sel])))
    return out


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, kernel_rows, select_bundles
    from calib.models.peaks import peaks_for_gpu

    bundles = select_bundles(load_bundles(argv or [str(ROOT / "traces" / "h200")]), FitOptions())
    rows, _ = kernel_rows(bundles)
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    print(f"{'':18} {'class':8} {'shapes':>6} {'MAPE %':>7} {'time-weighted %':>16}")
    for what, table in (("as fitted", rows), ("with layout label", labelled(rows))):
        for c, (n, mape, tw) in cross_validated(table, peaks).items():
            print(f"{what:18} {c:8} {n:6d} {mape:7.2f} {tw:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
