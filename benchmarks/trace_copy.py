"""Seconds to copy converted ETs for a replay: copy.deepcopy against ExecutionTrace.copy, and that both give the same.

    python benchmarks/trace_copy.py [h200|h100] [RUN ...]   (default: h200, five runs of several parallelisms)

A replay (calib.validation.replay.replay_trace) copies each rank's converted ET before preparing it; `calib validate`
replays every committed training run, once in the walkthrough notebook and once in `calib validate --check`.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("gpt1.3b-1gpu-mbs4", "gpt13b-tp2", "llama70b-tp2pp2-sp", "mixtral-1gpu", "gpt6.7b-pp2-mbs2")


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.validation.replay import read_run_traces

    gpu = next((a for a in argv if a in ("h200", "h100")), "h200")
    runs = [a for a in argv if a not in ("h200", "h100")] or list(RUNS)
    traces = []
    for b in load_bundles([ROOT / "traces" / gpu / r for r in runs]):
        traces += list(read_run_traces(b, 0.0).traces.values())
    t0 = time.perf_counter()
    deep = [copy.deepcopy(t) for t in traces]
    t1 = time.perf_counter()
    own = [t.copy() for t in traces]
    t2 = time.perf_counter()
    same = deep == own == traces
    print(f"{len(traces)} ETs of {len(runs)} runs ({sum(len(t.nodes) for t in traces)} nodes): copy.deepcopy "
          f"{t1 - t0:.2f} s, ExecutionTrace.copy {t2 - t1:.2f} s; equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
