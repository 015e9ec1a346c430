"""Round 44: every collective with its members released together on the GPU, and with one member late
(`calib measure collectives --timing kernel-released --late-us N`), by the training steps' split.

    python benchmarks/released_collectives.py [ROUND (folder of bundles or .tar.xz) ...] [--training]

Default: the committed rounds (traces/h200/_campaigns/x2-round44/released.tar.xz). Per host, group size, delay,
late member, kind and size (>= 1 MiB): the split with the members together (the together bundle of the same device
call) and with one late, their ratio, and the time the late member's wait saved (together less late), in us; then
how the together bundles of two leases repeat. A ratio under 1 is work the members already in the kernel did
before the last arrived, which a simulator that starts a collective when its last member arrives does not see.
`--training`: the H200 training steps' 2-GPU calls against the harness with the members together and with one late,
by how far apart the call's members arrived.
"""

from __future__ import annotations

import re
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = [ROOT / "traces" / "h200" / "_campaigns" / "x2-round44" / "released.tar.xz"]
RELEASED = re.compile(r"^collectives-(\d+)gpu-released-")


def bundles(folder: Path) -> pd.DataFrame:
    """Every released bundle in `folder`: one row per (bundle, kind, group size, bytes): its split, with the bundle's
    host GPUs, late member's delay and which member was late (-1: the group's last, a send/recv's receiver; 0: its
    first, the sender), and when it was written."""
    from calib.bundle.io import read_bundle

    rows = []
    for d in sorted(p for p in folder.iterdir() if RELEASED.match(p.name)):
        b = read_bundle(d)
        notes = b.manifest.notes
        if notes.get("timing_method") != "kernel-released":
            raise SystemExit(f"{d}: not timed --timing kernel-released")
        df = pd.read_parquet(d / "collectives.parquet")
        rows.append(df.assign(bundle=d.name, host_gpus=int(RELEASED.match(d.name).group(1)),
                              late_us=float(notes["late_us"]), late_member=int(notes.get("late_member", -1)),
                              created=pd.Timestamp(b.manifest.created_utc))[
            ["bundle", "host_gpus", "late_us", "late_member", "created", "kind", "group_size", "bytes", "transfer_s"]])
    return pd.concat(rows, ignore_index=True)


def read(path: Path) -> pd.DataFrame:
    if path.is_dir():
        return bundles(path)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
        return bundles(Path(tmp))


def table(paths: list[Path]) -> pd.DataFrame:
    """Each late bundle's points against the together bundle (late 0) of its host written closest in time (one
    device call: the same lease), at sizes >= 1 MiB: together and late split (us), their ratio and the us saved."""
    df = pd.concat([read(p) for p in paths], ignore_index=True)
    df = df[df["bytes"] >= 2**20]
    key = ["kind", "group_size", "bytes"]
    together = df[df["late_us"] == 0]
    out = []
    for bundle, late in df[df["late_us"] > 0].groupby("bundle"):
        same_host = together[together["host_gpus"] == late["host_gpus"].iloc[0]]
        gap = (same_host["created"] - late["created"].iloc[0]).abs()
        ref = same_host[same_host["bundle"] == same_host.loc[gap.idxmin(), "bundle"]]
        m = late.merge(ref[key + ["transfer_s", "bundle"]], on=key, suffixes=("", "_together"))
        out.append(pd.DataFrame({
            "bundle": bundle, "together_bundle": m["bundle_together"], "host_gpus": m["host_gpus"],
            "late_us": m["late_us"], "late_member": m["late_member"], **{k: m[k] for k in key},
            "together_split_us": m["transfer_s_together"] * 1e6, "late_split_us": m["transfer_s"] * 1e6}))
    res = pd.concat(out, ignore_index=True)
    res["late/together"] = res["late_split_us"] / res["together_split_us"]
    res["saved_us"] = res["together_split_us"] - res["late_split_us"]
    return res


def repeat(paths: list[Path]) -> pd.DataFrame:
    """The together bundles of one host against each other (two leases): |second / first - 1| per point, %."""
    df = pd.concat([read(p) for p in paths], ignore_index=True)
    together = df[(df["late_us"] == 0) & (df["bytes"] >= 2**20)]
    wide = together.pivot_table(index=["host_gpus", "kind", "group_size", "bytes"], columns="bundle", values="transfer_s")
    return wide.apply(lambda r: abs(r.dropna().iloc[-1] / r.dropna().iloc[0] - 1) * 100 if r.count() > 1 else float("nan"),
                      axis=1).rename("repeat_pct").reset_index()


def training_calls(traces: Path = ROOT / "traces" / "h200", group_size: int = 2) -> pd.DataFrame:
    """Every profiled training call of `group_size` members at >= 1 MiB in the training bundles under `traces`: its
    kind (calib.models.network.normalize_kind), bytes, split (mean over the members of transfer_s), how far apart the
    members arrived (the largest wait, us) and, for a send/recv, whether the receiver arrived last."""
    from calib.models.network import normalize_kind

    rows = []
    for f in sorted(traces.glob("*/collectives.parquet")):
        c = pd.read_parquet(f)
        if not {"pg_name", "seq", "wait_s"} <= set(c.columns):
            continue  # a microbenchmark bundle's table
        c = c[(c["group_size"] == group_size) & (c["bytes"] >= 2**20) & c["wait_s"].notna()]
        for _, g in c.groupby(["pg_name", "seq"]):
            if len(g) != group_size:
                continue
            last = g.loc[g["wait_s"].idxmin()]
            rows.append({"run": f.parent.name, "kind": normalize_kind(str(g["kind"].iloc[0])), "bytes": g["bytes"].max(),
                         "split_us": g["transfer_s"].mean() * 1e6, "spread_us": g["wait_s"].max() * 1e6,
                         "receiver_last": last["kind"] == "recv"})
    return pd.DataFrame(rows)


def harness_at(points: pd.DataFrame, kind: str, nbytes: float) -> float:
    """A released bundle's split (us) at `nbytes`, log-log between its sizes (factors of 2), NaN outside them."""
    import numpy as np

    p = points[points["kind"] == kind].sort_values("bytes")
    if p.empty or not p["bytes"].min() <= nbytes <= p["bytes"].max():
        return float("nan")
    return float(np.exp(np.interp(np.log(nbytes), np.log(p["bytes"]), np.log(p["transfer_s"] * 1e6))))


def against_training(paths: list[Path], traces: Path = ROOT / "traces" / "h200", apart_us: float = 50.0) -> pd.DataFrame:
    """Each 2-GPU training call against the 2-GPU released harness: members together (late 0) and one member 200 us
    late (the receiver, or for a send/recv whose sender arrived last, the sender); the call counts as apart when its
    members arrived more than `apart_us` apart (the collectives' head start is all there by 50 us late). Per kind and
    arrival: calls, the median training / harness ratio for each harness, and which is closer on the mean."""
    from calib.models.network import normalize_kind

    df = pd.concat([read(p) for p in paths], ignore_index=True)
    df = df[df["host_gpus"] == 2].assign(kind=lambda d: [normalize_kind(k) for k in d["kind"]])
    first = df["created"].min()
    call1 = df[(df["created"] - first).dt.total_seconds() < 180]  # the first device call: together and 200 us late
    together = call1[call1["late_us"] == 0]
    late = call1[(call1["late_us"] == 200) & (call1["late_member"] == -1)]
    sender_late = df[(df["late_us"] == 200) & (df["late_member"] == 0)]
    calls = training_calls(traces)
    rows = []
    for _, c in calls.iterrows():
        apart = c["spread_us"] > apart_us
        late_pts = sender_late if c["kind"] == "sendrecv" and not c["receiver_last"] else late
        rows.append({"kind": c["kind"] + ("" if c["kind"] != "sendrecv" else
                                          " (receiver last)" if c["receiver_last"] else " (sender last)"),
                     "arrival": "apart" if apart else "together", "split_us": c["split_us"],
                     "together_us": harness_at(together, c["kind"], c["bytes"]),
                     "late_us": harness_at(late_pts, c["kind"], c["bytes"])})
    out = pd.DataFrame(rows).dropna()
    out["vs_together"] = out["split_us"] / out["together_us"]
    out["vs_late"] = out["split_us"] / out["late_us"]
    out["err_together_pct"] = (out["together_us"] / out["split_us"] - 1).abs() * 100
    out["err_late_pct"] = (out["late_us"] / out["split_us"] - 1).abs() * 100
    return (out.groupby(["kind", "arrival"])
            .agg(calls=("split_us", "size"), median_vs_together=("vs_together", "median"),
                 median_vs_late=("vs_late", "median"), err_together_pct=("err_together_pct", "mean"),
                 err_late_pct=("err_late_pct", "mean"))
            .round(3).reset_index())


def main(argv: list[str]) -> int:
    training = "--training" in argv
    paths = [Path(a) for a in argv if a != "--training"] or DEFAULTS
    df = table(paths)
    pd.set_option("display.width", 220)
    df["MiB"] = df["bytes"] / 2**20
    for (host, n, late, member), g in df.groupby(["host_gpus", "group_size", "late_us", "late_member"]):
        who = "the last member (a send's receiver)" if member == -1 else f"member {member} (a send's sender)"
        print(f"\n{host}-GPU host, groups of {n}, {who} {late:g} us late: late / together (us saved)")
        ratio = g.pivot_table(index="MiB", columns="kind", values="late/together").round(3)
        saved = g.pivot_table(index="MiB", columns="kind", values="saved_us").round(1)
        print(ratio.astype(str).add(" (").add(saved.astype(str)).add(")").to_string())
    rep = repeat(paths).dropna()
    if len(rep):
        print("\nmembers together on two leases, |repeat / first - 1| %: mean "
              f"{rep['repeat_pct'].mean():.2f}, max {rep['repeat_pct'].max():.2f} ({len(rep)} points)")
    if training:
        print("\nthe H200 training steps' 2-GPU calls >= 1 MiB against the 2-GPU released harness (first call):")
        print(against_training(paths).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
