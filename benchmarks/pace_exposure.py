"""Which timed runs the profiled-pace line is fitted over: each timed run's own host exposure and its configuration's.

    python benchmarks/pace_exposure.py h200|h100

Per timed training run (its trainer timed its own launch pace) with converted ETs: the share of its measured step
beyond its step simulated at no host cost (calib.models.profiled_pace.host_exposure), and the same for its
configuration's median steps over all its runs that `calib fit` takes, timed or not, with ETs or not
(host_path_weights.training_bundles; `config_exposures`, what the fit selects on, MIN_HOST_EXPOSURE), simulated with
the committed calibration's kernel and network models (docs/host.md, "The line over the runs their host paced").
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    from host_path_weights import training_bundles

    from calib.models.host import collector_paused, prepare_run
    from calib.models.profiled_pace import MIN_HOST_EXPOSURE, config_exposures, host_exposure
    from calib.validation.measured import measured_own_launch_s

    gpu = argv[0] if argv else "h200"
    bundles, cal = training_bundles([str(ROOT / "traces" / gpu)])  # the runs fit_host fits, ETs or not
    timed = {b.id for b in bundles if measured_own_launch_s(b) is not None and b.et_files()}
    configs = {b.manifest.spec.key() for b in bundles if b.id in timed}
    bundles = [b for b in bundles if b.manifest.spec.key() in configs]  # a configuration's other runs count too
    with collector_paused():
        runs = [prepare_run(b, cal.kernel_model(), cal) for b in bundles]  # type: ignore[attr-defined]
    zero = [r.step(0.0, 0.0, 0.0) for r in runs]
    # as fit_host selects the line's runs (calib.models.host.run_paces), without fitting the line
    by_config = config_exposures([r.key for r in runs], [r.measured_s for r in runs], zero)
    print(f"{'run':36s} {'own':>6s} {'config':>7s}  line (at least {MIN_HOST_EXPOSURE:.0%} by configuration)")
    for b, r, z, e in zip(bundles, runs, zero, by_config, strict=True):
        if b.id in timed:
            print(f"{b.id:36s} {host_exposure(r.measured_s, z):6.1%} {e:7.1%}  {'in' if e >= MIN_HOST_EXPOSURE else 'out'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
