"""Speed of `calib project` (issue 6 targets, on a 2-core machine):

- one 8,192-GPU projection end to end (the `calib` process, imports included) <= 5 s;
- 16,384 and 32,768 GPUs work;
- a sweep of 100 configurations at 8,192 GPUs <= 2 minutes.

Run: python benchmarks/bench_project.py [--calibration PATH|none] [--skip-sweep]
Uses the bundled calibration for H200 when it exists (else pass --calibration); prints one line per
measurement and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MAIN = ["--model", "gpt3-175b", "--tp", "8", "--pp", "16", "--mbs", "1", "--cluster", "dgx-h200"]


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args: list[str]) -> tuple[float, dict | None]:
    """Wall seconds of one `calib project` process (and its workers) and its JSON; prints the CPU
    seconds too, since a machine shared with other jobs stretches the wall time."""
    t0 = time.perf_counter()
    c0 = _children_cpu_s()
    proc = subprocess.run([sys.executable, "-m", "calib", "project", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(f"  ({wall:.2f} s wall, {_children_cpu_s() - c0:.2f} CPU s, load average {os.getloadavg()[0]:.1f})",
          flush=True)
    if proc.returncode != 0:
        print(proc.stderr.strip(), file=sys.stderr)
        raise SystemExit(f"calib project {' '.join(args)} failed with status {proc.returncode}")
    try:
        return wall, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return wall, None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibration", default=None, help="calibration file, or 'none' (default: the bundled one)")
    ap.add_argument("--skip-sweep", action="store_true")
    a = ap.parse_args()
    cal = ["--calibration", a.calibration] if a.calibration else []
    ok = True
    for gpus, gbs in ((8192, 1536), (16384, 3072), (32768, 6144)):
        wall, out = run([*MAIN, "--gpus", str(gpus), "--gbs", str(gbs), "--json", *cal])
        assert out is not None
        sim = out["sim"]
        line = (f"project gpt3-175b {gpus} GPUs: {wall:.2f} s end to end (generate {sim['generate_s']:.2f} s, "
                f"simulate {sim['simulate_s']:.2f} s, {sim['nodes']} nodes in {sim['rank_classes']} classes); "
                f"step {out['step_time_s']:.3f} s, MFU {100 * out['mfu']:.1f}%")
        if gpus == 8192:
            ok &= wall <= 5.0
            line += "  [target <= 5 s: " + ("met" if wall <= 5.0 else "MISSED") + "]"
        print(line, flush=True)
    if not a.skip_sweep:
        wall, out = run(["--model", "gpt3-175b", "--gpus", "8192", "--gbs", "1536", "--cluster", "dgx-h200", "--sweep",
                         "--sweep-max", "100", "--json", *cal])
        assert out is not None
        n = len(out["ranked"])
        best = out["ranked"][0]
        print(f"sweep gpt3-175b 8192 GPUs gbs 1536: {n} configurations simulated ({len(out['out_of_memory'])} out of "
              f"memory discarded) in {wall:.1f} s; best TP {best['tp']} PP {best['pp']} DP {best['dp']} mbs "
              f"{best['micro_batch']} {best['recompute']}: {best['step_time_s']:.3f} s"
              + "  [target 100 in <= 120 s: " + ("met" if wall <= 120 and n >= 100 else "MISSED") + "]", flush=True)
        ok &= wall <= 120 and n >= 100
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
