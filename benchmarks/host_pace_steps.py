"""How a run's steps follow its host's pace, from the host-pace sampler in the committed bundles.

    python benchmarks/host_pace_steps.py [traces/h100 ...]

`calib measure` runs a second process beside every training from the thirty-fourth session on, timing
a fixed pure-Python workload about 43 times a second (host_pace.parquet; measure/telemetry/host_pace.py).
Per sampled run: its measured step (median over the measured, unprofiled steps, the slowest rank's),
the median host work over those steps, and the correlation of each step's time with the median work
sampled while it ran. Per configuration with several sampled runs: the pooled per-step line
step = a + b x work, and, each run left out in turn, its median step predicted from the others' line at
its own per-step work against the others' median step (what a model blind to the pace can do at best).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calib.bundle.io import Bundle, load_bundles
from calib.validation.measured import measured_host_work_s, measured_step

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SampledRun:
    id: str
    config: str
    step_s: float
    spread: float
    work_s: float
    steps_s: np.ndarray  # each measured step (slowest rank)
    steps_work_s: np.ndarray  # the median work sampled during it

    @property
    def r(self) -> float:
        ok = np.isfinite(self.steps_work_s)
        if ok.sum() < 3 or np.std(self.steps_work_s[ok]) == 0:
            return float("nan")
        return float(np.corrcoef(self.steps_work_s[ok], self.steps_s[ok])[0, 1])


def per_step(bundle: Bundle) -> tuple[np.ndarray, np.ndarray]:
    """Each measured, unprofiled step's time (max over ranks) and the median host work sampled from
    its first rank's start to its last rank's end (NaN where no sample fell inside)."""
    steps = bundle.table("steps")
    steps = steps[~steps["profiled"].astype(bool)]
    pace = bundle.table("host_pace")
    t, w = pace["t_s"].to_numpy(float), pace["work_s"].to_numpy(float)
    times, works = [], []
    for _, g in steps.groupby("step"):
        lo, hi = float(g["start_s"].min()), float((g["start_s"] + g["time_s"]).max())
        inside = w[(t >= lo) & (t <= hi)]
        times.append(float(g["time_s"].max()))
        works.append(float(np.median(inside)) if len(inside) else float("nan"))
    return np.array(times), np.array(works)


def sampled_runs(paths: list[str | Path]) -> list[SampledRun]:
    out = []
    for b in load_bundles(list(paths), kinds=("training",)):
        work = measured_host_work_s(b)
        if work is None:
            continue
        m = measured_step(b)
        times, works = per_step(b)
        out.append(SampledRun(b.id, b.manifest.spec.key(), m.time_s, m.spread, work, times, works))
    return sorted(out, key=lambda r: (r.config, r.id))


def line(runs: list[SampledRun]) -> tuple[float, float]:
    """(a, b) of the least-squares step = a + b x work over the runs' steps."""
    x = np.concatenate([r.steps_work_s for r in runs])
    y = np.concatenate([r.steps_s for r in runs])
    ok = np.isfinite(x)
    b, a = np.polyfit(x[ok], y[ok], 1)
    return float(a), float(b)


def leave_one_run_out(runs: list[SampledRun]) -> list[tuple[str, float, float]]:
    """(run, error of the others' line at its pace %, error of the others' median step %) per run."""
    out = []
    for r in runs:
        others = [o for o in runs if o is not r]
        a, b = line(others)
        ok = np.isfinite(r.steps_work_s)
        paced = float(np.median(a + b * r.steps_work_s[ok]))
        blind = float(np.median([o.step_s for o in others]))
        out.append((r.id, 100 * (paced - r.step_s) / r.step_s, 100 * (blind - r.step_s) / r.step_s))
    return out


def main(argv: list[str]) -> int:
    paths = argv or [ROOT / "traces"]
    runs = sampled_runs(paths)
    if not runs:
        print("no bundle with a host-pace table")
        return 1
    print(f"{'run':30s} {'step ms':>8s} {'spread':>7s} {'work ms':>8s} {'r/step':>7s}")
    for r in runs:
        print(f"{r.id:30s} {r.step_s * 1e3:8.1f} {r.spread * 100:6.1f}% {r.work_s * 1e3:8.2f} {r.r:+7.2f}")
    configs = sorted({r.config for r in runs})
    for c in configs:
        group = [r for r in runs if r.config == c]
        if len(group) < 3:
            continue
        a, b = line(group)
        print(f"\n{c}: step = {a * 1e3:.1f} ms + {b:.1f} x work over {sum(len(r.steps_s) for r in group)} steps")
        for rid, paced, blind in leave_one_run_out(group):
            print(f"  {rid:30s} others' line at its pace {paced:+6.1f}%   others' median {blind:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
