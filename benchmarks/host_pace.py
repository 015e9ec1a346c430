"""Does a profiled step's own host pace predict the launch cost its unprofiled step needs?

For each H200 training run of the bundled calibration, the script sets the launch cost at which the
run's replay equals its measured (unprofiled) step (`replay_launch_s` of the calibration's
per-run table, written by `calib fit`) beside the host pace of its profiled step, read from its
converted rank-0 ET: where two consecutive kernels both waited for the host (gap before each),
their start-to-start interval is one launch of the profiled host. If that interval, scaled by one
profiler factor, gave each run's needed cost, replays could take their host pace from the trace
instead of one fitted constant. The printed ratio (needed / profiled median) says whether it does.

    python benchmarks/host_pace.py [calib/data/calibration-h200.yaml] [traces/h200]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

from calib.bundle.io import read_bundle
from calib.chakra.codec import read_et

MIN_GAP_NS = 2_000  # a kernel that started this long after its stream went idle waited for its launch


def profiled_pace_us(et_path: Path) -> tuple[float, int, float]:
    """(median start-to-start interval of consecutive host-bound compute kernels in us, pairs,
    span of the profiled step in ms)."""
    trace = read_et(et_path)
    nodes = sorted((n for n in trace.nodes if not n.attr("is_cpu_op", False)), key=lambda n: n.id)
    pairs = [b.start_time_micros - a.start_time_micros for a, b in zip(nodes, nodes[1:], strict=False)
             if a.attr("category") == b.attr("category") == "compute"
             and int(a.attr("gap_ns", 0)) > MIN_GAP_NS and int(b.attr("gap_ns", 0)) > MIN_GAP_NS]
    end = max(n.start_time_micros + int(n.attr("duration_ns", 0)) / 1e3 for n in nodes)
    span_ms = (end - min(n.start_time_micros for n in nodes)) / 1e3
    return (statistics.median(pairs) if pairs else float("nan")), len(pairs), span_ms


def main(cal_path: str, traces: str) -> None:
    cal = yaml.safe_load(Path(cal_path).read_text())
    runs = cal["host"]["runs"]
    print(f"{'run':30} {'measured ms':>11} {'profiled ms':>11} {'needed us':>9} {'profiled us':>11} {'pairs':>6} {'ratio':>6}")
    ratios = []
    for r in runs:
        path = Path(traces) / r["id"]
        ets = read_bundle(path).et_files() if (path / "manifest.json").is_file() else []
        if not ets or r.get("replay_launch_s") is None:
            continue
        pace, pairs, span = profiled_pace_us(ets[0])
        needed = 1e6 * r["replay_launch_s"]
        ratio = needed / pace if pace == pace and pace > 0 else float("nan")
        if pairs >= 100 and needed > 0:
            ratios.append(ratio)
        print(f"{r['id']:30} {1e3 * r['measured_s']:11.1f} {span:11.1f} {needed:9.1f} {pace:11.1f} {pairs:6d} {ratio:6.2f}")
    if ratios:
        print(f"needed / profiled over {len(ratios)} runs with >= 100 host-bound pairs: "
              f"{min(ratios):.2f} .. {max(ratios):.2f} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main(*(sys.argv[1:] or ["calib/data/calibration-h200.yaml", "traces/h200"]))
