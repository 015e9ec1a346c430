"""Held-out fit benchmark: one configuration of `calib validate`'s leave-one-configuration-out.

    python benchmarks/bench_heldout.py [--match TEXT] [BUNDLE_DIR]      # default: traces/h200, gpt3-1.3b

Leaves out the first configuration whose spec key contains TEXT, fits on every other bundle of the
folder as `calib validate` does (calib.validate._heldout_group, no cache) and prints the wall time,
the time Python's cyclic collector took, the steps generated, the workloads built from them and the
trial costs they served, and the peak resident memory.
`calib validate` runs one such fit per configuration (74 for H200), two at a time.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(ROOT / "traces" / "h200"))
    ap.add_argument("--match", default="gpt3-1.3b")
    args = ap.parse_args()

    import calib.workload.generate as generate_module
    from calib.bundle.io import read_bundle
    from calib.validate import _heldout_group

    paths = sorted(str(p) for p in Path(args.folder).iterdir() if (p / "manifest.json").is_file())
    keys = {p: (s.key() if (s := read_bundle(p).manifest.spec) else None) for p in paths}
    key = next(k for k in keys.values() if k and args.match in k)
    group = [p for p in paths if keys[p] == key]
    others = [p for p in paths if keys[p] != key]

    # Steps generated (one per run: calib.workload.generate.Relaunchable), workloads built from them
    # (host launches added at a new set of split points) and workloads asked for (trial costs).
    counts = {"generated": 0, "built": 0, "asked": 0}
    relaunchable = generate_module.Relaunchable
    for name, count in (("__init__", "generated"), ("_build", "built"), ("at", "asked")):
        def counted(*a: object, _f: object = getattr(relaunchable, name), _k: str = count, **kw: object) -> object:
            counts[_k] += 1
            return _f(*a, **kw)  # type: ignore[operator]

        setattr(relaunchable, name, counted)
    collector = [0.0, 0.0]  # total, start of the current collection

    def timed(phase: str, _info: dict) -> None:
        if phase == "start":
            collector[1] = time.perf_counter()
        else:
            collector[0] += time.perf_counter() - collector[1]

    gc.callbacks.append(timed)
    t0 = time.perf_counter()
    out = _heldout_group(key, group, others)
    wall = time.perf_counter() - t0
    print(f"left out {key} ({len(group)} runs), fitted on {len(others)} bundles")
    print(f"held-out fit: {wall:.1f} s wall, {collector[0]:.1f} s in the cyclic collector, "
          f"{counts['generated']} steps generated, {counts['built']} workloads built for {counts['asked']} trial costs "
          f"(the rest re-costed), peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for run, pred in sorted(out["predictions"].items()):
        print(f"  {run}: predicted {pred.get('step_s', float('nan')) * 1e3:.2f} ms {pred.get('note', '')}")


if __name__ == "__main__":
    main()
