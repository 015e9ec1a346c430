"""The MoE expert loop's host time per launch against the rest of the step's, from the host-phase probes
(calib.workload.host.EXPERT_LOOP_LAUNCHES; docs/host.md, "The expert loop's launches, measured").

    python benchmarks/expert_loop_weight.py [RESULT_DIR ...]   (default: traces/*/_probes/host-phases-*)

Per probed MoE run with the modules table (rank 0's host, medians over the timed steps): the exclusive host time
of megatron-core's expert loop (`moe.routed_experts_compute`) per launch it made in the profiled step, the host time
per launch of the micro-batches' other launches (forward and backward less the loop), and their ratio; then per GPU
the median ratio over the runs at sequence 256, where the loop's host time is its own work. At sequence 2048 the
host also blocks inside the loop on work queued before it (docs/host.md, "Where the one-GPU MoE steps idle"), so
those runs are listed but not in the median.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_phases  # noqa: E402 (a sibling benchmark: the probe results' reader)

ROOT = Path(__file__).resolve().parent.parent
LOOP = "moe.routed_experts_compute"


def _runs(d: Path) -> list[tuple[str, dict, dict | None]]:
    """(run, phases, modules) of one probe round, from its results or, where only that is committed, its summary."""
    runs, kept = host_phases.load_round(d)
    if kept is not None:
        return [(name, v["phases"], v.get("modules")) for name, v in kept.items()]
    return [(r["name"], host_phases.phases(r), host_phases.modules(r).to_dict(orient="index")) for r in runs]


def ratios(dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for d in dirs:
        for name, ph, mods in _runs(d):
            loop = (mods or {}).get(LOOP)
            if not loop or not loop["launches"]:
                continue
            host_ms = ph["forward_ms"] + ph["backward_ms"]
            launches = ph["forward_launches"] + ph["backward_launches"]
            loop_us = loop["host_ms"] * 1e3 / loop["launches"]
            rest_us = (host_ms - loop["host_ms"]) * 1e3 / (launches - loop["launches"])
            rows.append({"gpu": d.parent.parent.name, "round": d.name, "run": name, "loop_launches": loop["launches"],
                         "loop_us_per_launch": loop_us, "rest_us_per_launch": rest_us, "ratio": loop_us / rest_us})
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or sorted((ROOT / "traces").glob("*/_probes/host-phases-*"))
    df = ratios(dirs)
    if df.empty:
        print("no MoE run with a modules table")
        return 1
    pd.set_option("display.width", 200)
    print(df.round(2).to_string(index=False))
    for gpu, sub in df.groupby("gpu"):
        s256 = sub[sub.run.str.contains("s256")]
        print(f"{gpu}: loop / rest per launch at sequence 256, median {s256.ratio.median():.2f} over {len(s256)} runs "
              f"(range {s256.ratio.min():.2f}-{s256.ratio.max():.2f}); all {len(sub)} runs {sub.ratio.median():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
