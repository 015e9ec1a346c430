"""The host model's leave-one-configuration-out error with the expert loop's forward launches weighted
(docs/host.md, "The expert loop's launches, weighted: tried, not kept", and "The expert loop's launches, measured").

    python benchmarks/expert_launches.py [h200|h100] [WEIGHT ...]   (default 1.5 and 1; a few minutes a pair)

A weight w charges each forward launch of megatron-core's expert loop (calib.workload.host.EXPERT_LOOP_OPS) w
launches of host time: after each such op the generated step gets (w - 1) launches of no GPU time per kernel
(carried over from op to op in whole launches), so that the extra host time delays the GPU only where the host is
behind it. calib's own weight is calib.workload.host.EXPERT_LOOP_LAUNCHES (1.5, measured by the host-phase probes:
benchmarks/expert_loop_weight.py); it is patched here. Fits the host model of generated steps on the committed
bundles of one GPU once per weight, with the committed calibration's kernel and network models (what `calib
fit` does, the weight aside). Prints each fit's costs, its error over all runs, the MoE runs and the others,
and each MoE configuration's mean held-out error (signed) and its runs' median sync root per weight.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def fit(gpu: str, weight: float) -> tuple[dict, list[dict]]:
    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration
    from calib.models import host
    from calib.workload import generate

    cal = Calibration.load(ROOT / "calib" / "data" / f"calibration-{gpu}.yaml")
    bundles = load_bundles([ROOT / "traces" / gpu])
    with mock.patch.object(generate, "EXPERT_LOOP_LAUNCHES", weight):
        model, err = host.fit_host(bundles, cal.kernel_model(), cal)
    return {"launch": model.launch_s, "sync": model.sync_s, "pace": model.pace_per_path,
            "mape": err.get("mape")}, model.runs


def main(argv: list[str]) -> int:
    gpu = next((a for a in argv if a in ("h200", "h100")), "h200")
    weights = [float(a) for a in argv if a not in ("h200", "h100")] or [1.5, 1.0]
    with ProcessPoolExecutor(min(2, len(weights))) as pool:
        fits = dict(zip(weights, pool.map(fit, [gpu] * len(weights), weights), strict=True))
    print(f"{gpu}, generated steps")
    per_config: dict[str, dict[float, list[float]]] = {}
    roots: dict[str, dict[float, list[float]]] = {}
    for w, (costs, runs) in fits.items():
        errs = [(100 * (r["heldout_step_s"] / r["measured_s"] - 1), r["config"]) for r in runs if r.get("heldout_step_s")]
        moe = np.array([abs(e) for e, c in errs if c.startswith("mixtral")])
        dense = np.array([abs(e) for e, c in errs if not c.startswith("mixtral")])
        every = np.concatenate([moe, dense])
        print(f"weight {w:<5g} launch {costs['launch'] * 1e6:.1f} us, sync {costs['sync'] * 1e6:.0f} us, pace "
              f"{costs['pace'] or 1:.3f}; held out: all {every.mean():.2f} % (max {every.max():.1f}, {len(every)})  "
              f"MoE {moe.mean():.2f} % (max {moe.max():.1f}, {len(moe)})  others {dense.mean():.2f} %")
        for e, c in errs:
            if c.startswith("mixtral"):
                per_config.setdefault(c, {}).setdefault(w, []).append(e)
        for r in runs:
            if r["config"].startswith("mixtral") and r.get("sync_s") is not None:
                roots.setdefault(r["config"], {}).setdefault(w, []).append(r["sync_s"] * 1e6)
    print(f"\n{'MoE configuration':64s} " + "  ".join(f"{'w ' + format(w, 'g'):>16s}" for w in weights)
          + "   median sync root (us) per weight")
    for c, by in sorted(per_config.items()):
        print(f"{c[:64]:64s} " + "  ".join(f"{np.mean(np.abs(by[w])):6.1f}% ({np.mean(by[w]):+6.1f})" for w in weights)
              + f"   ({len(by[weights[0]])} runs) "
              + " / ".join(f"{np.median(roots.get(c, {}).get(w, [np.nan])):.0f}" for w in weights))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
