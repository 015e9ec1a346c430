"""Seconds per held-out fit of `calib validate`, with every fit reading its bundles afresh and with the bundles
read once per process (calib.validate._read_once, Bundle.derived), and that both give the same results.

    python benchmarks/heldout_fit.py [h200|h100] [N]   (default: h100, 3 configurations; 24-40 s a fit)

Runs the held-out entries of the first N configurations (in `calib validate`'s order) one after another in
this process, as one worker of `calib validate --jobs` runs its share of them: first each with its own freshly
read bundles, then with the bundles read once, and compares every prediction and per-model error.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tasks(gpu: str, n: int) -> list[tuple[str, list[str], list[str]]]:
    from calib.bundle.io import load_bundles
    from calib.validation import engine
    from calib.validation.measured import is_real_gpu

    real = [b for b in load_bundles([ROOT / "traces" / gpu]) if is_real_gpu(b)]
    groups: dict[str, list] = {}
    for b in real:
        if b.manifest.kind == "training" and b.manifest.spec is not None:
            groups.setdefault(b.manifest.spec.key(), []).append(b)
    out = []
    for key, group in list(groups.items())[:n]:
        fam = engine.gpu_family(group[0].manifest.gpu.name)
        others = [x for x in real if engine.gpu_family(x.manifest.gpu.name) == fam
                  and (x.manifest.spec is None or x.manifest.spec.key() != key)]
        out.append((key, [str(b.path) for b in group], [str(x.path) for x in others]))
    return out


def run(todo: list[tuple[str, list[str], list[str]]], fresh: bool) -> tuple[list[dict], list[float]]:
    from calib import validate

    validate._READ.clear()
    results, seconds = [], []
    for task in todo:
        if fresh:
            validate._READ.clear()
        t0 = time.perf_counter()
        results.append(validate._heldout_group(*task))
        seconds.append(time.perf_counter() - t0)
    return results, seconds


def main(argv: list[str]) -> int:
    gpu = next((a for a in argv if a in ("h200", "h100")), "h100")
    n = next((int(a) for a in argv if a.isdigit()), 3)
    todo = tasks(gpu, n)
    fresh, t_fresh = run(todo, fresh=True)
    once, t_once = run(todo, fresh=False)
    same = all(a["predictions"] == b["predictions"] and a["kernel"] == b["kernel"] and a["collective"] == b["collective"]
               and a["energy"] == b["energy"] for a, b in zip(fresh, once, strict=True))
    print(f"{gpu}: {len(todo)} held-out configurations, each fitted on {len(todo[0][2])} bundles")
    print("read afresh   " + "  ".join(f"{t:6.1f}" for t in t_fresh) + f"   s (mean {sum(t_fresh) / len(t_fresh):.1f})")
    print("read once     " + "  ".join(f"{t:6.1f}" for t in t_once) + f"   s (mean {sum(t_once) / len(t_once):.1f})")
    print(f"the same predictions and per-model errors: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
