"""Round 44: every collective with its members released together on the GPU, and with one member late
(`calib measure collectives --timing kernel-released --late-us N`), by the training steps' split.

    python benchmarks/released_collectives.py [ROUND (folder of bundles or .tar.xz) ...]

Default: the committed rounds (traces/h200/_campaigns/x2-round44/released.tar.xz). Per host, group size, delay,
late member, kind and size (>= 1 MiB): the split with the members together (the together bundle of the same device
call) and with one late, their ratio, and the time the late member's wait saved (together less late), in us; then
how the together bundles of two leases repeat. A ratio under 1 is work the members already in the kernel did
before the last arrived, which a simulator that starts a collective when its last member arrives does not see.
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


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULTS
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
