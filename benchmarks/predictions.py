"""Every prediction committed before its run, scored against the run: the calibration's error on
configurations it had not seen, measured prospectively.

    python benchmarks/predictions.py [TRACES_DIR]      # default: traces/

A campaign round that predicts its runs writes `calib project --json`'s step time and memory verdict
for each job to `traces/<gpu>/_campaigns/<round>/predictions*.json` and commits it before the device
call (measure/campaigns/predict.py). This reads each of them, finds the bundle of the same id in the
same GPU folder (a twin run on another GPU is another GPU's measurement, so it is not matched), and
prints per file and per GPU the step-time error (predicted over measured, less 1) and the memory
verdict against what happened: the run fitted, or its log says it ran out of memory. A prediction
with neither a bundle nor a log is counted as not run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OOM_MARKERS = ("out of memory", "OutOfMemoryError")


@dataclass
class Outcome:
    gpu: str
    round: str
    run: str
    verdict: str  # the predicted memory verdict ("" where the file has none)
    predicted_s: float
    measured_s: float | None  # None: no complete bundle
    spread: float | None
    ran_out: bool  # the run's log says it ran out of memory

    @property
    def error_pct(self) -> float | None:
        return None if self.measured_s is None else 100.0 * (self.predicted_s / self.measured_s - 1.0)


def entries(path: Path) -> dict[str, dict]:
    """{run id: prediction} of one predictions file (round 9's nests them under "predictions")."""
    data = json.loads(path.read_text())
    inner = data.get("predictions", data)
    return {k: v for k, v in inner.items() if isinstance(v, dict) and "step_time_s" in v}


def ran_out_of_memory(campaign: Path, run: str) -> bool:
    log = campaign / "logs" / f"{run}.log"
    return log.is_file() and any(m in log.read_text(errors="replace") for m in OOM_MARKERS)


def outcomes(traces: Path) -> list[Outcome]:
    from calib.bundle.io import load_bundles
    from calib.errors import CalibError
    from calib.validation.measured import measured_step

    out = []
    for path in sorted(traces.glob("*/_campaigns/*/predictions*.json")):
        campaign, gpu_dir = path.parent, path.parent.parent.parent
        for run, p in entries(path).items():
            measured = spread = None
            bundle_dir = gpu_dir / run
            if (bundle_dir / "manifest.json").is_file():
                try:
                    [b] = load_bundles([str(bundle_dir)])
                    if b.manifest.status == "complete":
                        m = measured_step(b)
                        measured, spread = m.time_s, m.spread
                except CalibError:
                    pass
            out.append(Outcome(gpu_dir.name, f"{campaign.name}/{path.name}", run, str(p.get("memory_verdict", "")),
                               float(p["step_time_s"]), measured, spread, ran_out_of_memory(campaign, run)))
    return out


def table(rows: list[Outcome]):  # noqa: ANN201 (pandas stays out of the module's import time)
    import pandas as pd

    return pd.DataFrame([{
        "gpu": r.gpu, "round": r.round, "run": r.run, "predicted_ms": round(r.predicted_s * 1e3, 1),
        "measured_ms": None if r.measured_s is None else round(r.measured_s * 1e3, 1),
        "error_pct": None if r.error_pct is None else round(r.error_pct, 1),
        "spread_pct": None if r.spread is None else round(100 * r.spread, 1),
        "verdict": r.verdict, "outcome": "ran" if r.measured_s is not None else
        ("out of memory" if r.ran_out else "not run"),
    } for r in rows])


def main(argv: list[str]) -> int:
    import pandas as pd

    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    traces = Path(argv[0]) if argv else ROOT / "traces"
    df = table(outcomes(traces))
    if df.empty:
        print(f"no predictions under {traces}")
        return 1
    print(df.to_string(index=False))
    ran = df[df["outcome"] == "ran"]
    print("\nper predictions file (|error| %):")
    print(ran.groupby(["gpu", "round"])["error_pct"].agg(
        mean=lambda e: e.abs().mean(), max=lambda e: e.abs().max(), runs="count").round(2).to_string())
    print("\nstep time, predicted before the run (|error| %):")
    summary = ran.groupby("gpu")["error_pct"].agg(
        mean=lambda e: e.abs().mean(), max=lambda e: e.abs().max(), runs="count").round(2)
    print(summary.to_string())
    print(f"all: mean {ran['error_pct'].abs().mean():.2f} %, max {ran['error_pct'].abs().max():.2f} % over {len(ran)} runs")
    print("\nmemory verdict against what happened (runs):")
    print(pd.crosstab(df["verdict"], df["outcome"]).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
