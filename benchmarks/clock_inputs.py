"""Which number of a step predicts the SM clock the power cap leaves it (calib.models.clock)?

    python benchmarks/clock_inputs.py [BUNDLE_DIR ...]   (default: traces/h200 and traces/h100)

For every real training bundle whose telemetry gives both clocks (calib.models.clock.clock_points: the top clock over
the measured steps' clock), fits the hinge of calib.models.clock over each candidate input and prints its
leave-one-configuration-out error (mean / max of |predicted - measured| / measured ratio): none (a ratio of 1), the
GEMM/attention share at the top clock and as profiled, GEMM and attention FLOPs per second, GEMM FLOPs per second
with attention's at half weight, GEMM FLOPs per second (calib fit's), and GEMM and attention FLOPs per second with a
tenth of the memory-bound share added. About 20 s per folder on 2 cores. docs/host.md, "The clock model reads the
GEMM FLOP rate".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _loco(x: np.ndarray, ratio: np.ndarray, configs: np.ndarray) -> tuple[float, float]:
    """calib.models.clock's own leave-one-configuration-out error of the hinge over input x (mean, max %)."""
    from calib.models.clock import ClockModel, ClockPoint

    points = [ClockPoint(str(i), str(c), float(v), float(r))
              for i, (v, r, c) in enumerate(zip(x, ratio, configs, strict=True))]
    _, err = ClockModel.fit(points)
    return err.mape, err.max


def inputs(folder: Path) -> tuple[str, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The GPU's name, each candidate input per point, the points' ratios and configurations."""
    import pandas as pd

    from calib.bundle.io import load_bundles
    from calib.models.clock import CLOCK_EXPONENT, clock_points
    from calib.models.peaks import peaks_for_gpu
    from calib.models.power import flops_per_step, measured_shares
    from calib.validation.measured import is_real_gpu, measured_step

    bundles = [b for b in load_bundles([folder]) if b.manifest.kind == "training" and is_real_gpu(b)]
    peaks = peaks_for_gpu(bundles[0].manifest.gpu.name)
    peak = peaks.flops_for("bf16")
    points = clock_points(bundles, peaks.max_sm_clock_hz, CLOCK_EXPONENT, peak)
    by_id = {b.id: b for b in bundles}
    rows = []
    for p in points:
        b = by_id[p.bundle]
        k = b.table("kernels")
        # GEMM and attention FLOPs per rank and step as the power model counts them (an attention op's kernels,
        # which all carry its record, once per op instance): less the GEMMs', attention's.
        both = np.mean([flops_per_step(k, r) for r in sorted(k["rank"].unique())])
        shares = measured_shares(b)
        rows.append({"share_top": p.share, "share_profiled": float(shares["compute"]), "gemm": p.gemm_rate,
                     "attention": max(both / measured_step(b).time_s / peak - p.gemm_rate, 0.0),
                     "memory": float(shares["memory"]), "ratio": p.ratio, "config": p.config})
    df = pd.DataFrame(rows)
    cands = {
        "GEMM/attention share at the top clock": df["share_top"].to_numpy(),
        "GEMM/attention share as profiled": df["share_profiled"].to_numpy(),
        "GEMM and attention FLOPs per second": (df["gemm"] + df["attention"]).to_numpy(),
        "GEMM FLOPs per second, attention's at half weight": (df["gemm"] + 0.5 * df["attention"]).to_numpy(),
        "GEMM FLOPs per second (calib fit's)": df["gemm"].to_numpy(),
        "GEMM and attention FLOPs per second + 0.1 x memory share":
            (df["gemm"] + df["attention"] + 0.1 * df["memory"]).to_numpy(),
    }
    return bundles[0].manifest.gpu.name, cands, df["ratio"].to_numpy(), df["config"].to_numpy()


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    folders = [Path(a) for a in argv] or [ROOT / "traces" / "h200", ROOT / "traces" / "h100"]
    for folder in folders:
        gpu, cands, ratio, configs = inputs(folder)
        flat = np.abs(1 / ratio - 1) * 100
        print(f"{gpu}: {len(ratio)} runs, {len(set(configs))} configurations; none (ratio 1): {flat.mean():.2f} %")
        for name, x in cands.items():
            mean, top = _loco(x, ratio, configs)
            print(f"  {name:58s} {mean:5.2f} / {top:5.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
