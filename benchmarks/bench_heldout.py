"""Held-out fit benchmark: one configuration of `calib validate`'s leave-one-configuration-out.

    python benchmarks/bench_heldout.py [--match TEXT] [BUNDLE_DIR]      # default: traces/h200, gpt3-1.3b

Leaves out the first configuration whose spec key contains TEXT, fits on every other bundle of the
folder as `calib validate` does (calib.validate._heldout_group, no cache) and prints the wall time,
the time Python's cyclic collector took, the workloads generated and the peak resident memory.
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

    generated = [0]
    original = generate_module.generate

    def counted(*a: object, **kw: object) -> object:
        generated[0] += 1
        return original(*a, **kw)

    generate_module.generate = counted
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
          f"{generated[0]} workloads generated, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for run, pred in sorted(out["predictions"].items()):
        print(f"  {run}: predicted {pred.get('step_s', float('nan')) * 1e3:.2f} ms {pred.get('note', '')}")


if __name__ == "__main__":
    main()
