"""The host model's leave-one-configuration-out error with one host wait per MoE routing against one per
routing-count copy (calib.workload.host.GROUPED_SYNCS; docs/host.md, "One wait per routing").

    python benchmarks/routing_sync.py [h200|h100] [generated|replay]   (about 2 x 4 min for the H200)

Fits the host model twice on the committed bundles of one GPU, with the committed calibration's kernel and
network models: as `calib fit` does (megatron-core's routing copies issued together and waited for once), and
with every copy a sync of its own (the model before the thirty-ninth session). `replay` fits the replays'
costs instead (calib.models.host.fit_replay_launch on the converted ETs). Prints each fit's costs, its error
over all runs, over the MoE runs and over the others, and each MoE configuration's held-out errors both ways.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def per_copy() -> Iterator[None]:
    """Every routing-count copy a sync of its own, generated and converted."""
    from calib.workload import generate, host

    with mock.patch.object(generate, "GROUPED_SYNCS", frozenset()), \
            mock.patch.object(host, "routing_copy_groups", lambda _nodes: []):
        yield


def fit(gpu: str, grouped: bool, part: str) -> tuple[dict, list[dict]]:
    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration
    from calib.models import host

    cal = Calibration.load(ROOT / "calib" / "data" / f"calibration-{gpu}.yaml")
    bundles = load_bundles([ROOT / "traces" / gpu])
    with contextlib.nullcontext() if grouped else per_copy():
        model, err = host.fit_host(bundles, cal.kernel_model(), cal)
        if part == "replay":
            model, err = host.fit_replay_launch(bundles, cal, model)
    costs = ({"launch": model.replay_launch_s, "sync": model.replay_sync_s} if part == "replay" else
             {"launch": model.launch_s, "sync": model.sync_s})
    return {**costs, "mape": err.get("mape")}, model.runs


def main(argv: list[str]) -> int:
    gpu = next((a for a in argv if a in ("h200", "h100")), "h200")
    part = "replay" if "replay" in argv else "generated"
    step = "replay_step_s" if part == "replay" else "heldout_step_s"
    names = ("one wait per routing", "one per copy")
    with ProcessPoolExecutor(2) as pool:
        fits = dict(zip(names, pool.map(fit, [gpu, gpu], [True, False], [part, part]), strict=True))
    print(f"{gpu}, {part} steps")
    per_config: dict[str, dict[str, list[float]]] = {}
    roots: dict[str, dict[str, list[float]]] = {}  # each run's own sync cost (its root), microseconds
    for name, (costs, runs) in fits.items():
        errs = {r["id"]: (100 * (r[step] / r["measured_s"] - 1), r["config"]) for r in runs if r.get(step)}
        moe = np.array([abs(e) for e, c in errs.values() if c.startswith("mixtral")])
        dense = np.array([abs(e) for e, c in errs.values() if not c.startswith("mixtral")])
        every = np.concatenate([moe, dense])
        print(f"{name:22s} launch {costs['launch'] * 1e6:.1f} us, sync {costs['sync'] * 1e6:.0f} us; held out: "
              f"all {every.mean():.2f} % (max {every.max():.1f}, {len(every)})  MoE {moe.mean():.2f} % "
              f"(max {moe.max():.1f}, {len(moe)})  others {dense.mean():.2f} %")
        for e, c in errs.values():
            if c.startswith("mixtral"):
                per_config.setdefault(c, {}).setdefault(name, []).append(e)
        for r in runs:
            if r["config"].startswith("mixtral") and r.get("sync_s") is not None:
                roots.setdefault(r["config"], {}).setdefault(name, []).append(r["sync_s"] * 1e6)
    print(f"\n{'MoE configuration':70s} " + "  ".join(f"{n:>22s}" for n in names))
    for c, by in sorted(per_config.items()):
        print(f"{c[:70]:70s} " + "  ".join(f"{np.mean(np.abs(by.get(n, [np.nan]))):21.1f}%" for n in names)
              + f"   ({len(by[names[0]])} runs; signed {np.mean(by[names[0]]):+.1f} / {np.mean(by[names[1]]):+.1f};"
              + " median sync root " + " / ".join(f"{np.median(roots.get(c, {}).get(n, [np.nan])):.0f}" for n in names)
              + " us)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
