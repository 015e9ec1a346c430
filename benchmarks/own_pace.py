"""The trainer's own pace against the step it timed: the runs measured with it (rounds 30, 31 and 33 on one H200,
32 on two; rounds 32 and 33 on H100; docs/host.md, "The trainer's own pace, run by run" and "The trainer's own pace,
as a factor on the host costs").

    python benchmarks/own_pace.py [TRACES_GPU_DIR]   (default: traces/h200)

Every bundle whose steps carry the own pace (steps.parquet's own_launch_s, measure/own_pace.py) and whose
step was predicted before it ran (`_campaigns/<round>/predictions.json`, the committed calibration of the
day): its measured median step over the prediction (the ratio: above 1, slower than the calibration's
typical host), its own launch pace and Python work (medians over the measured steps, timed in the trainer's
main thread) and the host-pace sampler's work (a second process). Then how well each pace follows the ratio
(r, pooled and per round: each round one lease), and what a factor on the prediction from the own launch
pace would do: ratio = (launch / reference) ** slope fitted in log-log, scored leaving one run out, and
fitted on one round and applied to the others (does the scale carry between leases?). Last, the evidence for the
host model's factor (calib.models.host.OWN_PACE_SLOPE): per configuration, each timed run's root launch cost in the
committed calibration of that GPU (host.runs: the cost at which its simulated step meets its measured one, for its
own host) against its own launch pace, log against log.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PacedRun:
    run: str
    round: str  # the campaign round whose predictions hold it: one lease
    measured_s: float
    predicted_s: float
    own_launch_s: float
    own_work_s: float
    host_work_s: float | None  # the sampler's, None where not sampled

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


# The rounds measured for this study, each on one lease, their steps paced by their hosts (sequence 256). Later rounds
# time the own pace too (round 37: 4-GPU runs the GPU paces, predicted by another calibration); their step over its
# prediction does not ask how the host's pace moves a step, so they are left out.
STUDY_ROUNDS = ("x1-round30", "x1-round31", "x2-round32", "x1-round33")


def paced_runs(traces: Path, rounds: tuple[str, ...] = STUDY_ROUNDS) -> list[PacedRun]:
    from calib.bundle.io import read_bundle
    from calib.validation.measured import measured_host_work_s, measured_own_launch_s, measured_step

    predicted: dict[str, tuple[str, float]] = {}
    for f in sorted(traces.glob("_campaigns/*/predictions*.json")):
        for rid, p in json.loads(f.read_text()).items():
            if isinstance(p, dict) and p.get("step_time_s"):
                predicted.setdefault(rid, (f.parent.name, float(p["step_time_s"])))
    out = []
    for rid, (rnd, pred) in sorted(predicted.items()):
        if rnd not in rounds or not (traces / rid / "manifest.json").exists():
            continue
        b = read_bundle(traces / rid)
        launch = measured_own_launch_s(b)
        if launch is None:
            continue
        steps = b.table("steps")
        # The slowest rank's median, as measured_own_launch_s takes the launches (and traces/README.md's tables).
        work = steps.loc[~steps["profiled"].astype(bool)].groupby("rank")["own_work_s"].median().max()
        out.append(PacedRun(rid, rnd, measured_step(b).time_s, pred, launch, float(work), measured_host_work_s(b)))
    return out


def r(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x, y)[0, 1]) if len(x) >= 3 and np.std(x) > 0 and np.std(y) > 0 else float("nan")


def power_law(launch: np.ndarray, ratio: np.ndarray) -> tuple[float, float]:
    """(slope, reference launch s) of ratio = (launch / reference) ** slope, least squares in log-log."""
    slope, icpt = np.polyfit(np.log(launch), np.log(ratio), 1)
    return float(slope), float(np.exp(-icpt / slope))


def corrected_errors(runs: list[PacedRun], train: list[bool]) -> np.ndarray:
    """Percent errors of the before-run predictions of the runs not in `train`, each multiplied by the
    power law fitted on the runs in `train`."""
    launch = np.array([x.own_launch_s for x in runs])
    ratio = np.array([x.ratio for x in runs])
    t = np.array(train)
    slope, ref = power_law(launch[t], ratio[t])
    factor = (launch[~t] / ref) ** slope
    return 100 * (factor / ratio[~t] - 1)


def run_table(runs: list[PacedRun]) -> list[str]:
    lines = [f"{'run':26s} {'round':13s} {'measured ms':>11s} {'predicted ms':>12s} {'ratio':>6s} "
             f"{'own launch us':>13s} {'own work ms':>11s} {'sampler ms':>10s}"]
    for x in runs:
        side = "-" if x.host_work_s is None else f"{x.host_work_s * 1e3:.2f}"
        lines.append(f"{x.run:26s} {x.round:13s} {x.measured_s * 1e3:11.1f} {x.predicted_s * 1e3:12.1f} {x.ratio:6.3f} "
                     f"{x.own_launch_s * 1e6:13.2f} {x.own_work_s * 1e3:11.2f} {side:>10s}")
    return lines


def correlation_lines(runs: list[PacedRun]) -> list[str]:
    rounds = sorted({x.round for x in runs})
    lines = [f"{'r with the ratio':18s} {'pooled':>7s} " + " ".join(f"{rd:>13s}" for rd in rounds)]
    paces = {"own launch": lambda x: x.own_launch_s, "own work": lambda x: x.own_work_s,
             "sampler work": lambda x: np.nan if x.host_work_s is None else x.host_work_s}
    for name, get in paces.items():
        def corr(sel: list[PacedRun], get=get) -> float:
            pairs = np.array([(x.ratio, get(x)) for x in sel], dtype=float)
            pairs = pairs[~np.isnan(pairs).any(axis=1)]
            return r(pairs[:, 0], pairs[:, 1]) if len(pairs) else float("nan")

        lines.append(f"{name:18s} {corr(runs):+7.2f} " + " ".join(f"{corr([x for x in runs if x.round == rd]):+13.2f}"
                                                           for rd in rounds))
    return lines


def factor_lines(runs: list[PacedRun]) -> list[str]:
    before = np.abs(100 * (1 / np.array([x.ratio for x in runs]) - 1))
    loo = np.abs(np.concatenate([corrected_errors(runs, [j != i for j in range(len(runs))]) for i in range(len(runs))]))
    slope, ref = power_law(np.array([x.own_launch_s for x in runs]), np.array([x.ratio for x in runs]))
    lines = [f"before-run predictions: MAPE {before.mean():.1f} %, max {before.max():.1f} % over {len(runs)} runs",
             f"pooled power law: slope {slope:.2f}, reference {ref * 1e6:.2f} us per launch",
             f"with it, each run left out: MAPE {loo.mean():.1f} %, max {loo.max():.1f} %"]
    for rd in sorted({x.round for x in runs}):
        train = [x.round == rd for x in runs]
        if sum(train) >= 3 and not all(train):
            errs = np.abs(corrected_errors(runs, train))
            s, _ = power_law(np.array([x.own_launch_s for x in runs if x.round == rd]),
                             np.array([x.ratio for x in runs if x.round == rd]))
            other = np.abs(100 * (1 / np.array([x.ratio for x in runs if x.round != rd]) - 1))
            lines.append(f"fitted on {rd} (slope {s:.2f}), applied to the others: MAPE {errs.mean():.1f} % "
                         f"(before {other.mean():.1f} %)")
    return lines


def root_lines(traces: Path, runs: list[PacedRun]) -> list[str]:
    """Per configuration with runs on two or more rounds: slope and r of log(root launch cost) on log(own launch)."""
    import yaml

    cal = ROOT / "calib" / "data" / f"calibration-{traces.name}.yaml"
    if not cal.exists():
        return [f"{cal.name}: not found (no root launch costs)"]
    roots = {r["id"]: (r["config"], r.get("launch_s")) for r in yaml.safe_load(cal.read_text())["host"]["runs"]}
    by_config: dict[str, list[tuple[float, float, str]]] = {}
    for x in runs:
        config, root = roots.get(x.run, (None, None))
        if root:
            by_config.setdefault(config, []).append((x.own_launch_s, root, x.round))
    lines = [f"root launch cost vs own launch pace ({cal.name}), log-log per configuration:"]
    for config, rows in sorted(by_config.items()):
        if len({rd for *_, rd in rows}) < 2:
            continue
        lx, ly = np.log(np.array([(a, b) for a, b, _ in rows])).T
        slope = np.polyfit(lx, ly, 1)[0] if np.std(lx) > 0 else float("nan")
        ratio = np.array([b / a for a, b, _ in rows])
        short = "/".join(config.split("/")[:6])  # model and parallelism
        lines.append(f"  {short:40s} {len(rows):2d} runs  slope {slope:5.2f}  r {r(lx, ly):+.2f}  root/own "
                     f"{ratio.min():.2f}-{ratio.max():.2f}")
    return lines


def main(argv: list[str]) -> int:
    traces = Path(argv[0]) if argv else ROOT / "traces" / "h200"
    runs = paced_runs(traces)
    if len(runs) < 3:
        print(f"{traces}: {len(runs)} runs with the own pace and a prediction before the run; need 3")
        return 1
    for block in (run_table(runs), correlation_lines(runs), factor_lines(runs), root_lines(traces, runs)):
        print("\n".join(block) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
