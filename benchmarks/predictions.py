"""Every prediction committed before its run, scored against the run: the calibration's error on
configurations it had not seen, measured prospectively.

    python benchmarks/predictions.py [TRACES_DIR]      # default: traces/

The predictions files are read by calib.validation.prospective, whose step-time errors `calib validate`
reports as "predicted before the run" (over the runs it validates). This adds what the report leaves
out: each memory verdict against what happened (the run fitted, or its log says it ran out of memory;
neither bundle nor log: not run), the predictions whose run never came, and a table per file.
"""

from __future__ import annotations

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


def ran_out_of_memory(campaign: Path, run: str) -> bool:
    from measure.campaigns.logs import read_log

    log = read_log(campaign, run)
    return log is not None and any(m in log for m in OOM_MARKERS)


def outcomes(traces: Path) -> list[Outcome]:
    from calib.bundle.io import read_bundle
    from calib.errors import CalibError
    from calib.validation.measured import measured_step
    from calib.validation.prospective import prediction_files, read_predictions

    out = []
    for gpu_dir in sorted(p for p in traces.iterdir() if p.is_dir()):
        for path in prediction_files(gpu_dir):
            for p in read_predictions(path):
                measured = spread = None
                if (gpu_dir / p.run / "manifest.json").is_file():
                    try:
                        b = read_bundle(gpu_dir / p.run)
                        if b.manifest.status == "complete":
                            m = measured_step(b)
                            measured, spread = m.time_s, m.spread
                    except CalibError:
                        pass
                out.append(Outcome(gpu_dir.name, p.source, p.run, p.memory_verdict, p.step_s, measured, spread,
                                   ran_out_of_memory(path.parent, p.run)))
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
