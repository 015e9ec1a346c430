"""What tensor-parallel runs' step-time errors say: a cost per blocking TP collective the simulator lacks.

    python benchmarks/tp_rendezvous.py [reports/validation.json:traces/h200 reports/h100/validation.json:traces/h100]

Reads a `calib validate` report and the bundles it validated. Per run with TP > 1: the blocking collectives
of its tensor-parallel group in one step (rank 0's all-reduce / all-gather / reduce-scatter rows of group
size TP in collectives.parquet, from the profiled step) and the time the replay or held-out prediction falls
short of the measured step, per such collective. Then what one constant per collective, taken as the median
over the other configurations' runs and added as n x constant, would do to each kind's mean and maximum
error: a first-order estimate (the host costs were fitted without it, and a simulated cost would hide
under host slack where an added one cannot), to size the term before modelling it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calib.bundle.io import read_bundle

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [f"{ROOT}/reports/validation.json:{ROOT}/traces/h200", f"{ROOT}/reports/h100/validation.json:{ROOT}/traces/h100"]
BLOCKING = ("allreduce", "allgather", "reducescatter", "all_reduce", "all_gather", "reduce_scatter")


def tp_collectives(bundle_dir: Path, tp: int) -> int:
    """Blocking collectives of the TP group on rank 0 in the profiled step (0 without TP or the table)."""
    if tp <= 1:
        return 0
    b = read_bundle(bundle_dir)
    if not b.has("collectives"):
        return 0
    c = b.table("collectives")
    if "rank" not in c.columns:
        return 0
    kind = c["kind"].astype(str).str.lower()
    return int(((c["rank"] == 0) & (c["group_size"] == tp) & kind.isin(BLOCKING)).sum())


def runs_of(report: Path, traces: Path, kind: str) -> pd.DataFrame:
    data = json.loads(report.read_text())
    rows = []
    for r in data["runs"]:
        if r["kind"] != kind or r["error_pct"] is None:
            continue
        n = tp_collectives(traces / r["run"], int(r["tp"]))
        rows.append({"run": r["run"], "config": r["config"], "n": n, "spread": r["measured_spread"] or 0.0,
                     "measured_s": r["measured_step_s"], "predicted_s": r["predicted_step_s"]})
    df = pd.DataFrame(rows)
    df["short_per_call_s"] = (df["measured_s"] - df["predicted_s"]) / df["n"].replace(0, np.nan)
    return df


def with_constant(df: pd.DataFrame) -> pd.Series:
    """Each TP run's prediction plus n x the median shortfall per collective of the other configurations."""
    out = df["predicted_s"].copy()
    tp = df[df["n"] > 0]
    for i, row in tp.iterrows():
        k = float(np.median(tp.loc[tp["config"] != row["config"], "short_per_call_s"]))
        out[i] = row["predicted_s"] + k * row["n"]
    return out


def summary(df: pd.DataFrame) -> dict[str, float]:
    err = 100 * (df["predicted_s"] - df["measured_s"]).abs() / df["measured_s"]
    new = 100 * (with_constant(df) - df["measured_s"]).abs() / df["measured_s"]
    tp = df["n"] > 0
    steady = tp & (df["spread"] < 0.05)
    return {"runs": len(df), "tp_runs": int(tp.sum()),
            "tp_signed_mean_pct": float((100 * (df["predicted_s"] - df["measured_s"]) / df["measured_s"])[tp].mean()),
            "per_call_median_us": float(1e6 * df.loc[steady, "short_per_call_s"].median()),
            "mape": float(err.mean()), "mape_with": float(new.mean()), "max": float(err.max()), "max_with": float(new.max()),
            "tp_mape": float(err[tp].mean()), "tp_mape_with": float(new[tp].mean())}


def main(argv: list[str]) -> int:
    for pair in argv or DEFAULT:
        report, traces = (Path(p) for p in pair.split(":"))
        for kind in ("replay", "heldout"):
            s = summary(runs_of(report, traces, kind))
            print(f"{traces.name} {kind:8s} TP runs {s['tp_runs']:3d}/{s['runs']}: signed mean {s['tp_signed_mean_pct']:+.2f} %, "
                  f"shortfall per TP collective {s['per_call_median_us']:.0f} us (steady runs, median); "
                  f"MAPE {s['mape']:.2f} -> {s['mape_with']:.2f} %, TP runs {s['tp_mape']:.2f} -> {s['tp_mape_with']:.2f} %, "
                  f"max {s['max']:.2f} -> {s['max_with']:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
