"""The host model's leave-one-configuration-out error with and without the own-pace factor (calib.models.host,
`own_launch_ref_s`; docs/host.md, "The trainer's own pace, as a factor on the host costs").

    python benchmarks/own_pace_fit.py [h200|h100] [--slope S]   (default: h200; about 2 x 4 min for the H200)

Fits the host model twice on the committed bundles of one GPU, with the committed calibration's kernel and network
models: as `calib fit` does (the runs that timed their trainer's own pace scaled by it; with --slope, by
(own / reference) ** S instead of calib.models.host.OWN_PACE_SLOPE), and with no run scaled (as before the
thirty-eighth session). Prints each fit's costs and its error over all runs, over the timed runs and over the
others, and each timed run's held-out error both ways.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def fit(gpu: str, scaled: bool, slope: float | None = None) -> tuple[object, dict]:
    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration
    from calib.models import host

    cal = Calibration.load(ROOT / "calib" / "data" / f"calibration-{gpu}.yaml")
    bundles = load_bundles([ROOT / "traces" / gpu])
    if scaled:
        with mock.patch.object(host, "OWN_PACE_SLOPE", host.OWN_PACE_SLOPE if slope is None else slope):
            return host.fit_host(bundles, cal.kernel_model(), cal)
    with mock.patch.object(host, "own_pace_reference", lambda _paces: None):
        return host.fit_host(bundles, cal.kernel_model(), cal)


def errors(model: object, ids: set[str]) -> dict[str, float]:
    return {r["id"]: 100 * (r["heldout_step_s"] / r["measured_s"] - 1) for r in model.runs  # type: ignore[attr-defined]
            if r["id"] in ids and r.get("heldout_step_s")}


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.validation.measured import measured_own_launch_s

    slope = float(argv[argv.index("--slope") + 1]) if "--slope" in argv else None
    args = [a for i, a in enumerate(argv) if a != "--slope" and (i == 0 or argv[i - 1] != "--slope")]
    gpu = args[0] if args else "h200"
    timed = {b.id for b in load_bundles([ROOT / "traces" / gpu]) if measured_own_launch_s(b) is not None}
    name = "with the factor" if slope is None else f"slope {slope:g}"
    fits = {name: fit(gpu, True, slope), "without": fit(gpu, False)}
    every = {r["id"] for r in next(iter(fits.values()))[0].runs}
    print(f"{gpu}: {len(every)} training runs, {len(timed)} of them timed their own pace")
    for name, (model, err) in fits.items():
        ref = model.own_launch_ref_s
        parts = {k: np.abs(list(errors(model, v).values()))
                 for k, v in (("all", every), ("timed", timed & every), ("others", every - timed))}
        stats = "  ".join(f"{k} {e.mean():.2f} % (max {e.max():.1f})" for k, e in parts.items())
        print(f"{name:16s} launch {model.launch_s * 1e6:.1f} us, sync {model.sync_s * 1e6:.0f} us, reference "
              f"{'-' if ref is None else f'{ref * 1e6:.2f} us'}; held out: {stats}  [fit's own: {err['mape']:.2f} %]")
    with_f, without = (errors(m, timed) for m, _ in fits.values())
    print(f"\n{'timed run':28s} {'with %':>8s} {'without %':>10s}")
    for rid in sorted(with_f):
        print(f"{rid:28s} {with_f[rid]:+8.1f} {without.get(rid, float('nan')):+10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
