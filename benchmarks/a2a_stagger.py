"""What measure.probes.a2a_stagger found: an all-to-all's time after its last member arrives, by how far apart its
members arrived.

    python benchmarks/a2a_stagger.py [a2a_stagger.json[.xz]]    # default: the committed probe's

Per group size, size, pattern and set delay, medians over the calls of: the members' arrival spread (last kernel
start less first, us), the training steps' split (calib.convert.run.transfer_split, averaged over the members as
a training call's are), the last member's kernel, and the split over the same size's at no delay. Then the
committed Mixtral EP 4 steps' 4-GPU all-to-alls the same way (`--training`: their split by arrival spread).
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "traces" / "h200" / "_probes" / "a2a-stagger-2" / "a2a_stagger.json.xz"


def call_rows(calls: list[list[list[float]]]) -> pd.DataFrame:
    """Per call: arrival spread, training split (mean over members) and the last member's kernel, in us."""
    from calib.convert.run import transfer_split
    from measure.collectives import call_starts

    start, dur = call_starts(calls)
    _, transfer = transfer_split(start, dur)
    last = start.argmax(axis=0)
    return pd.DataFrame({"spread_us": start.max(axis=0) - start.min(axis=0), "split_us": transfer.mean(axis=0),
                         "last_kernel_us": dur[last, np.arange(dur.shape[1])]})


def table(path: Path) -> pd.DataFrame:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    rows = []
    for r in json.loads(raw)["results"]:
        med = call_rows(r["calls"]).median()
        rows.append({"group": r["group_size"], "MiB": r["mib"], "pattern": r["pattern"], "delay_us": r["delay_us"],
                     **med.round(1).to_dict()})
    df = pd.DataFrame(rows)
    base = df[df["delay_us"] == 0].set_index(["group", "MiB", "pattern"])["split_us"]
    keys = list(zip(df["group"], df["MiB"], df["pattern"], strict=True))
    df["split/no delay"] = (df["split_us"].to_numpy() / base.loc[keys].to_numpy()).round(3)
    return df


def training(traces: Path = ROOT / "traces" / "h200") -> pd.DataFrame:
    """The committed EP 4 steps' 4-GPU all-to-alls of >= 1 MiB: per call its size, spread and split (us)."""
    rows = []
    for f in sorted(traces.glob("mixtral-ep4*/collectives.parquet")):
        c = pd.read_parquet(f)
        c = c[(c["kind"] == "alltoall") & (c["group_size"] == 4) & (c["bytes"] >= 2**20)]
        for _, g in c.groupby(["pg_name", "seq"]):
            if len(g) == 4:
                rows.append({"run": f.parent.name, "MiB": g["bytes"].mean() / 2**20, "spread_us": g["wait_s"].max() * 1e6,
                             "split_us": g["transfer_s"].mean() * 1e6})
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv and not argv[0].startswith("--") else DEFAULT
    pd.set_option("display.width", 200)
    print(table(path).to_string(index=False))
    if "--training" in argv:
        tr = training()
        tr["together"] = np.where(tr["spread_us"] < 20, "within 20 us", "apart")
        print("\nMixtral EP 4 training steps, 4-GPU all-to-alls:")
        print(tr.assign(MiB=tr["MiB"].round(1)).groupby(["MiB", "together"])
              .agg(calls=("split_us", "size"), spread_us=("spread_us", "median"), split_us=("split_us", "median"))
              .round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
