"""The host model's leave-one-configuration-out error with the runs that did not time their trainer's own pace
taken at a factor u of the reference pace instead of at it (docs/host.md, "Tensor parallelism adds no pace",
last paragraph).

    python benchmarks/untimed_pace.py [h200|h100] [U ...]   (default: h200, 1 0.9 1.1; 20-40 s a factor)

calib takes an untimed run at the reference pace (`own_launch_ref_s`, the median timed pace), as projections
are: its host costs times 1. Here they are times u (`_Run.at_own_pace(u)`), the timed runs as calib takes them,
and the host model is fitted on the committed bundles of one GPU with the committed calibration's kernel and
network models, as `calib fit` does. Prints, per u, the fit's error over all runs, over the timed runs and over
the others, and the fitted costs. A u that fitted the untimed runs better would be a fitted pace for them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    from host_path_weights import prepared_runs, training_bundles

    from calib.models import host

    gpu = next((a for a in argv if a in ("h200", "h100")), "h200")
    factors = [float(a) for a in argv if a not in ("h200", "h100")] or [1.0, 0.9, 1.1]
    bundles, cal = training_bundles([str(ROOT / "traces" / gpu)])
    prepared, rp = prepared_runs(bundles, cal)
    paces, ref = rp.timed, rp.reference  # the untimed runs at the factor tried, not their profiled step's pace
    print(f"{gpu}: {len(bundles)} runs, {sum(p is not None for p in paces)} timed their own pace")
    for u in factors:
        runs = [r.at_own_pace(host.own_pace_factor(p, ref) if p is not None else u)
                for r, p in zip(prepared, paces, strict=True)]
        with host.collector_paused():
            model, err = host.fit_runs(runs)
        errors = np.array([abs(r["heldout_step_s"] / r["measured_s"] - 1) * 100 for r in model.runs])
        timed = np.array([p is not None for p in paces])
        print(f"u {u:<5g} LOCO {err['mape']:.2f} / {err['max']:.1f} %  timed {errors[timed].mean():.2f} %  "
              f"untimed {errors[~timed].mean():.2f} %  launch {model.launch_s * 1e6:.1f} us  "
              f"sync {model.sync_s * 1e3:.2f} ms  pace {model.pace_per_path or 1:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
