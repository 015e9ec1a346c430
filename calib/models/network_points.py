"""Training collectives -> one network-model point per collective instance.

A converted training bundle's collectives.parquet holds one row per member rank of each NCCL
call, keyed by (pg_name, seq) as PyTorch numbers them. The rows of one call are merged into one
point before fitting:

- time: the mean of the members' transfer times. Each member's transfer runs from the last
  member's arrival to its own end (calib.convert.run), so members differ by their end times and
  by how far the ranks' clocks disagree; the mean cancels an offset between two ranks' clocks.
- bytes: the largest member's nccl-tests size. PyTorch records an all-gather's output as its
  own input times the group size (reduce-scatter likewise from its own output), so the members of
  an uneven all-gather-v / reduce-scatter-v / all-to-all-v (Megatron's MoE token dispatch) carry
  different sizes. The call ends when its largest share has moved (a ring all-gather or
  reduce-scatter passes every member's chunk through every step; an all-to-all-v waits for its
  largest sender), so it times like an even call of the largest member's size: the size the
  replays simulate it at (calib.validation.replay). On the H200 bundles this
  took the collectives' 5-fold error at sizes >= 1 MiB from 7.30 to 7.10 % (the members' mean
  size, used before). For an even call every member carries the same size and nothing changes.

Rows without a (pg_name, seq) key, P2P send/recv (which PyTorch numbers apart from collectives)
and calls whose member count is not the group size keep one point per row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from calib.units import MIB

if TYPE_CHECKING:
    from calib.bundle.io import Bundle

INSTANCE_KEY = ("pg_name", "seq")
REPEAT_ID = re.compile(r"(.+)-r\d+")  # a campaign's repeat of bundle X on another lease: X-rNN


def merge_instances(points: pd.DataFrame) -> pd.DataFrame:
    """Points (kind, group_size, bytes, time_s, plus any other columns constant within a call,
    e.g. bundle and domain) with optional pg_name and seq -> one row per collective instance,
    without the key columns."""
    if points.empty or not set(INSTANCE_KEY) <= set(points.columns):
        return points.drop(columns=[c for c in INSTANCE_KEY if c in points.columns])
    pts = points.reset_index(drop=True)
    keyed = pts["pg_name"].notna() & pts["seq"].notna() & (pts["kind"] != "sendrecv")
    other = [c for c in pts.columns if c not in (*INSTANCE_KEY, "bytes", "time_s")]
    by = [*INSTANCE_KEY, *other]
    grouped = pts[keyed].groupby(by, dropna=False, sort=False)
    merged = grouped.agg(bytes=("bytes", "max"), time_s=("time_s", "mean"), members=("time_s", "size")).reset_index()
    complete = merged["members"] == merged["group_size"]
    # A call with a member missing (or extra) is not one instance as seen by all its ranks:
    # keep its rows as they are.
    incomplete_keys = merged.loc[~complete, list(by)]
    loose = pts[~keyed]
    if not incomplete_keys.empty:
        rows = pts[keyed].merge(incomplete_keys, on=list(by), how="inner")
        loose = pd.concat([loose, rows], ignore_index=True)
    out = pd.concat([merged.loc[complete].drop(columns="members"), loose], ignore_index=True)
    return out.drop(columns=list(INSTANCE_KEY))[list(c for c in points.columns if c not in INSTANCE_KEY)]


def host_repeats(bundles: Sequence[Bundle]) -> pd.DataFrame:
    """The same microbenchmark harness run again on another host (bundle `X-rNN` beside `X`): per kind,
    group size and size >= 1 MiB, the first host's median time (`first`) and the repeat's (`again`), with
    `harness` X. No model enters it: no function of (kind, group size, bytes) can come closer to both
    hosts than they are to each other, so it is the floor under the collective model's error there."""
    by_id = {b.id: b for b in bundles if b.manifest.kind == "collectives" and b.has("collectives")}
    key = ["kind", "group_size", "bytes"]
    rows = []
    for rid, b in sorted(by_id.items()):
        m = REPEAT_ID.fullmatch(rid)
        if not m or m.group(1) not in by_id:
            continue
        first = by_id[m.group(1)].table("collectives").groupby(key)["time_s"].median()
        again = b.table("collectives").groupby(key)["time_s"].median()
        j = pd.concat([first.rename("first"), again.rename("again")], axis=1).dropna().reset_index()
        rows.append(j[j["bytes"] >= MIB].assign(harness=m.group(1)))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=[*key, "first", "again", "harness"])
