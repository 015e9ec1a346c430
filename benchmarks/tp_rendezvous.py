"""What tensor-parallel runs' step-time errors say: step time the simulator lacks at TP rendezvous.

    python benchmarks/tp_rendezvous.py [reports/validation.json:traces/h200 reports/h100/validation.json:traces/h100]
    python benchmarks/tp_rendezvous.py --probe [traces/h100/_probes/tp-rendezvous-1]
    python benchmarks/tp_rendezvous.py --hosts [traces/h100/_probes/tp-rendezvous-2]
    python benchmarks/tp_rendezvous.py --probe|--hosts FOLDER --summary-out FOLDER/summary.json


Reads a `calib validate` report and the bundles it validated. Per run with TP > 1: the blocking collectives
of its tensor-parallel group in one step (rank 0's all-reduce / all-gather / reduce-scatter rows of group
size TP in collectives.parquet, from the profiled step) and the time the replay or held-out prediction falls
short of the measured step, per such collective. Then what one constant per collective, taken as the median
over the other configurations' runs and added as n x constant, would do to each kind's mean and maximum
error: a first-order estimate (the host costs were fitted without it, and a simulated cost would hide
under host slack where an added one cannot), to size the term before modelling it.

`--summary-out FILE` writes, from a probe round's results, both tables that `--probe` and `--hosts` print, as JSON;
a round whose folder holds that `summary.json` and no results (tp-rendezvous-1 to -3 since the forty-fourth
session) is printed from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calib.bundle.io import read_bundle

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "traces" / "h100" / "_probes" / "tp-rendezvous-1"
# The committed bundle of each probed configuration on the same GPU model, for its profiled step's
# NCCL transfer time at the same message size.
PROBE_BUNDLES = {"llama8b-tp2": ROOT / "traces" / "h100" / "llama8b-tp2-r21",
                 "llama8b-tp2-s256": ROOT / "traces" / "h100" / "llama8b-tp2-s256-r21",
                 "gpt13b-tp2": ROOT / "traces" / "h100" / "gpt13b-tp2-r21"}
HEAD_CALLS = 9  # the first micro-batch's forward: the embedding's all-reduce and two per layer of four
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


def load_probe(path: Path) -> dict:
    from calib.compressed import decompress

    return json.loads(decompress(path.read_bytes(), str(path)))


def bundle_of(name: str) -> Path:
    """The committed bundle whose profiled step times a probed configuration's transfer (the longest
    PROBE_BUNDLES key the name starts with: llama8b-tp2-m16 -> llama8b-tp2)."""
    return PROBE_BUNDLES[max((k for k in PROBE_BUNDLES if name.startswith(k)), key=len)]


def transfer_us(bundle: Path, size: int) -> float:
    """Median transfer time (us) of rank 0's collectives of `size` bytes in the bundle's profiled step."""
    c = read_bundle(bundle).table("collectives")
    rows = c[(c["rank"] == 0) & (c["bytes"] == size)]
    return float(1e6 * rows["transfer_s"].median())


def probe_rows(folder: Path = PROBE) -> list[dict]:
    """Per configuration and rank of measure/probes/tp_rendezvous.py: the plain step, and for the largest
    all-reduce (the layers' activations) the compute stream's wait per call in the step's first
    `HEAD_CALLS` calls and in the rest, against the profiled step's transfer of that size, and what the
    calls cost the step beyond their transfer."""
    out = []
    for path in sorted(folder.glob("*.rank*.json.xz")):
        d = load_probe(path)
        size = max(int(b) for s in d["calls_bytes_us"] for b, _ in s if int(b) < 2**31)
        per_step = [np.array([us for b, us in s if int(b) == size]) for s in d["calls_bytes_us"]]
        head = np.concatenate([s[:HEAD_CALLS] for s in per_step])
        rest = np.concatenate([s[HEAD_CALLS:] for s in per_step])
        transfer = transfer_us(bundle_of(d["name"]), size)
        beyond_ms = float(np.mean([(s - transfer).sum() for s in per_step]) / 1e3)
        head_ms = float(np.mean([(s[:HEAD_CALLS] - transfer).sum() for s in per_step]) / 1e3)
        out.append({"name": d["name"], "rank": d["rank"], "plain_ms": float(1e3 * np.median(d["plain_step_s"])),
                    "events_ms": float(1e3 * np.median(d["events_step_s"])), "bytes": size,
                    "calls": len(per_step[0]), "transfer_us": transfer, "head_us": float(np.median(head)),
                    "rest_us": float(np.median(rest)), "beyond_ms": beyond_ms, "head_share": head_ms / beyond_ms})
    return out


def host_lag_rows(folder: Path) -> list[dict]:
    """Per configuration of a probe run that kept its hosts' times (`calls_host_ns`, `step_start_ns`; the
    second run on): when each rank's host reached the first micro-batch's last timed forward call
    (`HEAD_CALLS`), from its own step start, and how far behind the other the later host was there
    (medians over the steps). The ranks share one CLOCK_MONOTONIC, so the hosts line up."""
    out = []
    names = sorted({p.name.split(".rank")[0] for p in folder.glob("*.rank*.json.xz")})
    for name in names:
        ranks = [load_probe(folder / f"{name}.rank{k}.json.xz") for k in (0, 1)]
        if any("calls_host_ns" not in r for r in ranks):
            continue
        reach = [[], []]
        lag, start_skew, later_waits = [], [], []
        for s in range(len(ranks[0]["step_start_ns"])):
            at = [r["step_start_ns"][s] + r["calls_host_ns"][s][HEAD_CALLS - 1] for r in ranks]
            for k in (0, 1):
                reach[k].append((at[k] - ranks[k]["step_start_ns"][s]) / 1e3)
            lag.append(abs(at[1] - at[0]) / 1e3)
            start_skew.append(abs(ranks[1]["step_start_ns"][s] - ranks[0]["step_start_ns"][s]) / 1e3)
            early = 0 if at[0] < at[1] else 1  # the rank whose host got there first waits on its GPU
            later_waits.append(sum(us for _, us in ranks[early]["calls_bytes_us"][s][:HEAD_CALLS]) / 1e3)
        out.append({"name": name, "steps": len(lag), "reach_us": [float(np.median(x)) for x in reach],
                    "lag_us": float(np.median(lag)), "start_skew_us": float(np.median(start_skew)),
                    "lag_share": float(np.median(np.array(lag) / np.maximum(reach[0], reach[1]))),
                    "early_head_ms": float(np.median(later_waits))})
    return out


SUMMARY = "summary.json"


def results(folder: Path) -> list[Path]:
    """A probe round's per-rank results."""
    return sorted(folder.glob("*.rank*.json.xz"))


def probe_summary(folder: Path) -> dict:
    """What `--probe` and `--hosts` print of a round, computed from its results: their rows, not the events, so that
    the round can be committed without its results (the probe tables also need the H100 bundles' transfers)."""
    return {"what": "benchmarks/tp_rendezvous.py's rows of one probe round: --probe (per configuration and rank) "
                    "and --hosts (per configuration; none where the round kept no host times)",
            "probe": probe_rows(folder), "hosts": host_lag_rows(folder)}


def round_rows(folder: Path, table: str) -> list[dict]:
    """The rows of `table` ("probe" or "hosts") of a round: from its results where they are committed, else from
    its summary.json."""
    if not results(folder) and (folder / SUMMARY).is_file():
        return json.loads((folder / SUMMARY).read_text())[table]
    return probe_rows(folder) if table == "probe" else host_lag_rows(folder)


def _summary_out(argv: list[str]) -> tuple[list[str], Path | None]:
    """`argv` without `--summary-out FILE`, and FILE (None without the option)."""
    if "--summary-out" not in argv:
        return argv, None
    i = argv.index("--summary-out")
    return argv[:i] + argv[i + 2:], Path(argv[i + 1])


def write_summary(folder: Path, out: Path) -> int:
    """Write `probe_summary` of `folder` to `out`; a round without results is refused rather than summarised as
    empty, which would overwrite its summary with nothing."""
    if not results(folder):
        print(f"{folder}: no probe results to summarise", file=sys.stderr)
        return 1
    out.write_text(json.dumps(probe_summary(folder), indent=1) + "\n")
    return 0


def print_hosts(rows: list[dict]) -> None:
    print(f"{'config':12s} {'steps':>5s} {'rank 0 to call 9 us':>19s} {'rank 1':>8s} {'start skew us':>13s} "
          f"{'lag at call 9 us':>16s} {'lag share':>9s} {'first rank waits ms':>19s}")
    for r in rows:
        print(f"{r['name']:12s} {r['steps']:5d} {r['reach_us'][0]:19.0f} {r['reach_us'][1]:8.0f} "
              f"{r['start_skew_us']:13.0f} {r['lag_us']:16.0f} {r['lag_share']:9.1%} {r['early_head_ms']:19.2f}")


def print_probe(rows: list[dict]) -> None:
    print(f"{'config':12s} {'rank':>4s} {'step ms':>8s} {'+events':>8s} {'MiB':>4s} {'calls':>5s} "
          f"{'transfer us':>11s} {'first 9 us':>10s} {'rest us':>8s} {'beyond ms':>9s} {'in first 9':>10s}")
    for r in rows:
        print(f"{r['name']:12s} {r['rank']:4d} {r['plain_ms']:8.1f} {r['events_ms']:8.1f} {r['bytes'] / 2**20:4.0f} "
              f"{r['calls']:5d} {r['transfer_us']:11.1f} {r['head_us']:10.1f} {r['rest_us']:8.1f} "
              f"{r['beyond_ms']:9.2f} {r['head_share']:10.0%}")


def main(argv: list[str]) -> int:
    argv, out = _summary_out(argv)
    if argv[:1] in (["--hosts"], ["--probe"]):
        table = argv[0][2:]
        default = PROBE.parent / "tp-rendezvous-2" if table == "hosts" else PROBE
        folder = Path(argv[1]) if len(argv) > 1 else default
        (print_hosts if table == "hosts" else print_probe)(round_rows(folder, table))
        return write_summary(folder, out) if out is not None else 0
    if out is not None:
        print("--summary-out goes with --probe or --hosts", file=sys.stderr)
        return 2
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
