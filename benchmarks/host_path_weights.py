"""How much the host fit depends on the code-path weights (docs/host.md, "The host's pace follows the
parallel code path").

    python benchmarks/host_path_weights.py [BUNDLE_DIR] [VARIANT ...]   (default: traces/h200, all variants)

Prepares every real training bundle's generated step once (calib.models.host.prepare_run, the
calibration in calib/data as the kernel and network models) and fits the host model (`fit_runs`, with
its leave-one-configuration-out error) with each run's code path taken differently: by the GPUs on its
host (log2 of the count, the pace per doubling of the eleventh to fifteenth sessions) or by weights for
TP, PP and EP (`PATH_WEIGHTS` is the one calib uses), each run at its trainer's own pace where it timed
one and the others at the reference pace (as `fit_host` prepared them until the forty-second session; since then
it takes an untimed run at the pace its profiled step gives, which benchmarks/profiled_pace.py compares), optionally
with more terms not in calib's
path: `sp` (sequence parallelism with TP), `dp` (data parallelism) and `gpus` (per doubling of the GPUs
on the host, on top of the path). Prints the fitted costs, pace and error per
variant, and each variant's largest held-out errors. About a minute per variant on 2 cores.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from calib.models.host import RunPaces

ROOT = Path(__file__).resolve().parent.parent

VARIANTS: dict[str, dict[str, float] | None] = {
    "gpus-per-host": None,
    "tp1-pp1-ep2": {"tp": 1, "pp": 1, "ep": 2},
    "tp1-pp1.5-ep2": {"tp": 1, "pp": 1.5, "ep": 2},  # PATH_WEIGHTS until the forty-first session
    "tp0-pp1.5-ep2": {"tp": 0, "pp": 1.5, "ep": 2},  # PATH_WEIGHTS (docs/host.md, "Tensor parallelism adds no pace")
    "tp0.25-pp1.5-ep2": {"tp": 0.25, "pp": 1.5, "ep": 2},
    "tp0.5-pp1.5-ep2": {"tp": 0.5, "pp": 1.5, "ep": 2},
    "tp0-pp1.5-ep1": {"tp": 0, "pp": 1.5, "ep": 1},
    "tp0-pp0-ep2": {"tp": 0, "pp": 0, "ep": 2},
    # TP cheaper than one GPU (negative weights; the fitted pace is at least 1): tried, not kept.
    "tp-0.5-pp1.5-ep2": {"tp": -0.5, "pp": 1.5, "ep": 2},
    "sp-1": {"tp": 1, "pp": 1.5, "ep": 2, "sp": -1.0},
    "tp1-pp1-ep3": {"tp": 1, "pp": 1, "ep": 3},
    "tp1-pp1-ep1.5": {"tp": 1, "pp": 1, "ep": 1.5},
    # Nineteenth session (docs/host.md, "Terms tried beside the code path"): PATH_WEIGHTS plus one term.
    "sp0.5": {"tp": 1, "pp": 1.5, "ep": 2, "sp": 0.5},
    "sp1": {"tp": 1, "pp": 1.5, "ep": 2, "sp": 1.0},
    "sp2": {"tp": 1, "pp": 1.5, "ep": 2, "sp": 2.0},
    "dp0.5": {"tp": 1, "pp": 1.5, "ep": 2, "dp": 0.5},
    "dp1": {"tp": 1, "pp": 1.5, "ep": 2, "dp": 1.0},
    "gpus0.25": {"tp": 1, "pp": 1.5, "ep": 2, "gpus": 0.25},
    "gpus0.5": {"tp": 1, "pp": 1.5, "ep": 2, "gpus": 0.5},
    "gpus1": {"tp": 1, "pp": 1.5, "ep": 2, "gpus": 1.0},
}


def training_bundles(dirs: list[str]) -> tuple[list, object]:
    """The real GPU training bundles under `dirs` and the bundled calibration of their GPU."""
    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration
    from calib.project import default_calibration_path
    from calib.validation.measured import is_real_gpu

    bundles = load_bundles(dirs or [str(ROOT / "traces" / "h200")])
    chosen = [b for b in bundles if b.manifest.kind == "training" and is_real_gpu(b) and b.manifest.spec is not None]
    return chosen, Calibration.load(str(default_calibration_path(chosen[0].manifest.gpu.name)))


def prepared_runs(chosen: list, cal: object) -> tuple[list, RunPaces]:
    """Each bundle's generated step (calib.models.host.prepare_run, not yet at its own pace) and the own launch
    paces calib.models.host.fit_host reads for them (`run_paces`: timed, else from the profiled step)."""
    from calib.models.host import collector_paused, prepare_run, run_paces

    kernel = cal.kernel_model()  # type: ignore[attr-defined]
    with collector_paused():
        runs = [prepare_run(b, kernel, cal) for b in chosen]
        return runs, run_paces(chosen, runs)


def print_fit(name: str, model: object, err: dict, seconds: float) -> None:
    """One variant's fitted host costs, its leave-one-configuration-out error and its worst held-out runs."""
    print(f"{name:14s} launch {model.launch_s * 1e6:5.1f} us  sync {model.sync_s * 1e6:5.1f} us  "  # type: ignore[attr-defined]
          f"p2p {(model.p2p_sync_s or 0) * 1e6:6.1f} us  pace {model.pace_per_path or 1:.3f}  "  # type: ignore[attr-defined]
          f"LOCO {err['mape']:.2f} / {err['max']:.2f} %  ({seconds:.0f} s)")
    worst = sorted(model.runs, key=lambda r: -abs(r["heldout_step_s"] / r["measured_s"] - 1))[:5]  # type: ignore[attr-defined]
    print("    " + ", ".join(f"{r['id']} {100 * (r['heldout_step_s'] / r['measured_s'] - 1):+.1f}" for r in worst))


def main(argv: list[str]) -> int:
    from calib.models.host import PATH_WEIGHTS, collector_paused, fit_runs, path_exponent

    names = [a for a in argv if a in VARIANTS] or list(VARIANTS)
    chosen, cal = training_bundles([a for a in argv if a not in VARIANTS])
    # Each run at the pace fit_host fits it at (until the forty-third session the untimed runs were left at the
    # reference here: docs/host.md's tables of this benchmark before it were computed so).
    prepared, paces = prepared_runs(chosen, cal)
    runs = [r.at_own_pace(f) for r, f in zip(prepared, paces.factors(), strict=True)]
    by_id = {b.id: b for b in chosen}
    for name in names:
        w = VARIANTS[name]

        def path(bid: str, w: dict[str, float] | None = w) -> float:
            m = by_id[bid].manifest
            doublings = math.log2(max(int(m.gpu.count), 1))
            if w is None:
                return doublings
            extra = (w.get("sp", 0.0) * (m.spec.sequence_parallel and m.spec.tp > 1)
                     + w.get("dp", 0.0) * (m.spec.dp > 1) + w.get("gpus", 0.0) * doublings)
            return path_exponent(m.spec.tp, m.spec.pp, m.spec.ep, {k: v for k, v in w.items() if k in PATH_WEIGHTS}) + extra

        t = time.perf_counter()
        with collector_paused():
            model, err = fit_runs([dataclasses.replace(r, path=path(r.id)) for r in runs])
        print_fit(name, model, err, time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
