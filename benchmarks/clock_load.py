"""The power cap's clock on synthetic loads against the calibration's clock model (calib.models.clock).

    python benchmarks/clock_load.py [PROBE_DIR ...] [--calibration FILE]
        (default: traces/h200/_probes/clock-load-*, the bundled H200 calibration)

Reads measure/probes/clock_load.py's results (each load's busy share, GEMM and attention FLOP rates, median SM clock
and mean power over 2 s) and prints beside each the clock the calibration's model gives the load's input (its GEMM
FLOP rate over the peak, or its GEMM/attention share, `_flop_share`), then the mean and largest
error of the loads the GPU was busy all along (the training steps' case: their GPUs idle 10 % of the step on average)
and of those that idled between bursts.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _read(path: Path) -> dict:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _flop_share(pt: dict, call_s: dict[str, float]) -> float:
    """A load's GEMM/attention time over its window: the busy share of a GEMM-only or attention-only load, none of the
    adds'; of a GEMM followed by adds, its GEMM's call time (that of the load of the GEMM alone, as timed before it
    ran) times the calls over the window."""
    if pt["gemm_flop_rate"] + pt["attention_flop_rate"] <= 0:
        return 0.0
    if "+" not in pt["load"]:
        return float(pt["busy_share"])
    gemm_s = call_s["gemm/8192x8192x8192"]
    return min(gemm_s * pt["periods"] * pt["calls_per_period"] / pt["wall_s"], float(pt["busy_share"]))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from calib.calibration import Calibration
    from calib.project import default_calibration_path

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="*", type=Path)
    p.add_argument("--calibration", type=Path, default=None)
    args = p.parse_args(argv)
    dirs = args.dirs or sorted((ROOT / "traces" / "h200" / "_probes").glob("clock-load-*"))
    cal = Calibration.load(str(args.calibration or default_calibration_path("H200")))
    clock = cal.clock_model()
    if clock is None or not clock.from_top:
        print("the calibration has no clock model at the top clock (power.clock reference top): refit with calib fit")
        return 1
    busy_err: list[float] = []
    idle_err: list[float] = []
    for d in dirs:
        files = sorted(d.glob("clock-load.json*"))
        if not files:
            continue
        data = _read(files[0])
        print(f"{d.name} ({data['device']}; model input {clock.feature})")
        print(f"{'load':24s} {'duty':>5s} {'busy':>6s} {'GEMM':>6s} {'attn':>6s} {'clock':>6s} {'model':>6s} {'error':>7s}"
              f" {'power':>5s}")
        pure = {pt["load"]: pt["call_s"] for pt in data["points"]}
        for pt in data["points"]:
            gemm = pt["gemm_flop_rate"]
            share = _flop_share(pt, pure)
            x = clock.step_input(share, gemm)
            model_hz = clock.reference_clock_hz / clock.clock_ratio(x)
            err = 100 * (model_hz / pt["sm_clock_hz"] - 1)
            (busy_err if pt["duty_target"] == 1.0 else idle_err).append(err)
            print(f"{pt['load']:24s} {pt['duty_target']:5.2f} {pt['busy_share']:6.3f} {gemm / 1e12:6.0f} "
                  f"{pt['attention_flop_rate'] / 1e12:6.0f} {pt['sm_clock_hz'] / 1e9:6.3f} {model_hz / 1e9:6.3f} "
                  f"{err:+6.1f}% {pt['power_w'] or float('nan'):5.0f}")
    for name, errs in (("busy all along", busy_err), ("idle between bursts", idle_err)):
        if errs:
            print(f"{name}: {len(errs)} loads, clock error mean {sum(abs(e) for e in errs) / len(errs):.1f} %, "
                  f"largest {max(errs, key=abs):+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
