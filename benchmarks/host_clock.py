"""What the power cap's SM clock does to the host fit (docs/host.md, "The power cap's clock in generated
steps").

    python benchmarks/host_clock.py [BUNDLE_DIR] [VARIANT ...]   (default: traces/h200, all variants)

Prepares every real training bundle's generated step (calib.models.host.prepare_run, the calibration in
calib/data as the kernel and network models) with GEMM and attention kernels scaled per run, fits the
host model (`fit_runs`, with its leave-one-configuration-out error) and prints the fitted costs, the
error and the largest held-out errors. Variants:
- `none`: kernels as the kernel model times them (its reference clock: the top clock, or the profiled steps'
  in files written before calib.models.clock's reference `top`);
- `measured`: each run at its own measured steps' clock (calib.models.clock.run_slowdown: its
  telemetry's ratio, the clock model at its measured share without telemetry), what `calib fit` does;
- `heldout`: each run at the clock model's slowdown for its measured input (GEMM/attention share or GEMM
  FLOP rate), the model fitted without the run's configuration (what a projection of an unmeasured run can
  know).
About a minute per variant on 2 cores.
"""

from __future__ import annotations

import dataclasses
import sys
import time

VARIANTS = ("none", "measured", "heldout")


class _Timed:
    """What prepare_run asks of a kernel model: predict."""

    def __init__(self, predict: object) -> None:
        self.predict = predict


def main(argv: list[str]) -> int:
    from host_path_weights import print_fit, training_bundles

    from calib.models.clock import ClockModel, clock_points, run_slowdown, throttled
    from calib.models.host import fit_runs, prepare_run

    names = [a for a in argv if a in VARIANTS] or list(VARIANTS)
    chosen, cal = training_bundles([a for a in argv if a not in VARIANTS])
    clock = cal.clock_model()
    if clock is None:
        print("the calibration has no clock model (power.clock): refit with `calib fit`")
        return 1
    # prepare_run applies the calibration's clock itself; without one it applies none, and each variant
    # scales the kernel model's times on its own.
    bare = dataclasses.replace(cal, power={k: v for k, v in cal.power.items() if k != "clock"})
    rate_peak = clock.peak_flops_per_s if clock.feature == "gemm_flop_rate" else None
    points = (clock_points(chosen, clock.reference_clock_hz, clock.exponent, rate_peak) if clock.from_top
              else clock_points(chosen))
    input_of = {p.bundle: p.x(clock.feature) for p in points}
    kernel = cal.kernel_model()

    def heldout(b: object) -> float:
        others = [p for p in points if p.config != b.manifest.spec.key()]  # type: ignore[attr-defined]
        model, _ = ClockModel.fit(others, clock.reference, clock.exponent, clock.reference_clock_hz, clock.feature,
                                  clock.peak_flops_per_s)
        x = input_of.get(b.id)  # type: ignore[attr-defined]
        if x is None:  # no telemetry: its profiled step's input, as run_slowdown takes it
            x = clock.measured_input(b)
        return 1.0 if x is None else model.slowdown(x)

    slowdown = {
        "none": lambda b: 1.0,
        "measured": lambda b: run_slowdown(b, clock),
        "heldout": heldout,
    }
    for name in names:
        t = time.perf_counter()
        runs = []
        for b in chosen:
            s = slowdown[name](b)
            runs.append(prepare_run(b, _Timed(throttled(kernel.predict, s)), bare))
        model, err = fit_runs(runs)
        print_fit(name, model, err, time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
