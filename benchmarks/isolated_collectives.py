"""Round 42: collectives timed each alone (`--timing kernel-isolated`) against back to back, and both against the
training steps' own calls.

    python benchmarks/isolated_collectives.py [ROUND42 (folder of bundles or .tar.xz)] [TRAINING_DIRS...]

Default: the committed round (traces/h200/_campaigns/x4-round42/dense-iso.tar.xz) and the training bundles of
traces/h200. Prints, at sizes >= 1 MiB: the two isolated passes against each other; isolated over back to back on
the same lease, per kind, group size and size band; then every training call of groups of 2 and 4 (one point per
call, calib.fit.collective_points) against each harness's time at its size (log-log interpolation between the
grid's sizes, which are 1.19x apart), as the median ratio training / harness and the mean absolute error.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "traces" / "h200" / "_campaigns" / "x4-round42" / "dense-iso.tar.xz"
PASSES = {"iso": "collectives-4gpu-dense-iso", "iso-b": "collectives-4gpu-dense-iso-b",
          "b2b": "collectives-4gpu-dense-b2b"}
MIB = 2**20


def grid(folder: Path) -> pd.DataFrame:
    """The round's three bundles, one row per (pass, kind, group size, bytes): the transfer time."""
    from calib.models.network import normalize_kind

    rows = []
    for name, bid in PASSES.items():
        df = pd.read_parquet(folder / bid / "collectives.parquet")
        rows.append(pd.DataFrame({"pass": name, "kind": [normalize_kind(k) for k in df["kind"]],
                                  "group_size": df["group_size"].astype(int), "bytes": df["bytes"].astype(float),
                                  "time_s": df["transfer_s"].astype(float)}))
    return pd.concat(rows, ignore_index=True)


def interpolate(g: pd.DataFrame, nbytes: np.ndarray) -> np.ndarray:
    """Log-log interpolation of one series' median time per size at `nbytes` (NaN outside its sizes)."""
    med = g.groupby("bytes")["time_s"].median()
    x, y = np.log(med.index.to_numpy(float)), np.log(med.to_numpy(float))
    q = np.log(nbytes)
    out = np.exp(np.interp(q, x, y))
    return np.where((q >= x[0]) & (q <= x[-1]), out, np.nan)


def band(nbytes: pd.Series) -> pd.Categorical:
    return pd.cut(np.log2(nbytes), [20, 23, 26, 31], right=False, labels=["1-8 MiB", "8-64 MiB", "64 MiB-1 GiB"])


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles
    from calib.fit import FitOptions, collective_points, select_bundles

    src = Path(argv[0]) if argv else DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        folder = src
        if src.is_file():
            with tarfile.open(src) as tar:
                tar.extractall(tmp, filter="data")
            folder = Path(tmp)
        pts = grid(folder)
    big = pts[pts["bytes"] >= MIB]
    wide = big.pivot_table(index=["kind", "group_size", "bytes"], columns="pass", values="time_s").reset_index()
    wide["band"] = band(wide["bytes"])
    pd.set_option("display.width", 200)
    wide["passes_pct"] = 100 * (wide["iso-b"] / wide["iso"] - 1).abs()
    print("isolated, two passes: |iso-b / iso - 1| in %, sizes >= 1 MiB")
    print(wide.groupby(["kind", "group_size"])["passes_pct"].agg(["mean", "max"]).round(2).to_string())
    wide["iso_over_b2b"] = np.sqrt(wide["iso"] * wide["iso-b"]) / wide["b2b"]
    print("\nisolated / back to back on the same lease (median per band)")
    print(wide.groupby(["kind", "group_size", "band"], observed=True)["iso_over_b2b"].median().round(3)
          .unstack("band").to_string())

    dirs = argv[1:] or [str(ROOT / "traces" / "h200")]
    _, train = collective_points(select_bundles(load_bundles(dirs), FitOptions()))
    train = train[(train["group_size"].isin([2, 4])) & (train["bytes"] >= MIB)].copy()
    iso = pts[pts["pass"].isin(["iso", "iso-b"])]
    b2b = pts[pts["pass"] == "b2b"]
    for name, ref in (("isolated", iso), ("back to back", b2b)):
        col = np.full(len(train), np.nan)
        for (kind, n), idx in train.groupby(["kind", "group_size"]).groups.items():
            g = ref[(ref["kind"] == kind) & (ref["group_size"] == n)]
            if len(g):
                col[train.index.get_indexer(idx)] = interpolate(g, train.loc[idx, "bytes"].to_numpy(float))
        train[name] = col
    train = train.dropna(subset=["isolated", "back to back"])
    train["band"] = band(train["bytes"])
    for name in ("isolated", "back to back"):
        train[f"ratio {name}"] = train["time_s"] / train[name]
        train[f"err {name}"] = 100 * (train[name] / train["time_s"] - 1).abs()
    cols = ["ratio isolated", "ratio back to back", "err isolated", "err back to back"]
    print(f"\ntraining calls of groups of 2 and 4 (>= 1 MiB, {len(train)} calls): training / harness (median), "
          "|harness / training - 1| in % (mean)")
    summary = train.groupby(["kind", "group_size"]).agg(
        calls=("time_s", "size"), **{c: (c, "median" if c.startswith("ratio") else "mean") for c in cols})
    print(summary.round(3).to_string())
    print(train.groupby(["kind", "band"], observed=True)[cols].agg("median").round(3).to_string())
    print("\nall calls: mean error isolated {:.2f} %, back to back {:.2f} %".format(
        train["err isolated"].mean(), train["err back to back"].mean()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
