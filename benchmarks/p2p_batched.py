"""What measure.probes.p2p_batched found: a batched send one way and a send batched with a receive of the other
direction, with the members together and with the sender 200 us late.

    python benchmarks/p2p_batched.py [p2p_batched.json[.xz]] [--training]   # default: the committed probe's

Per size, mode and delay: medians over the calls of the arrival spread, the training steps' split
(calib.convert.run.transfer_split, averaged over the two ranks) and the ratio of both ways to one way. `--training`:
the H200 training steps' 2-GPU pipeline calls at the probe's sizes, by arrival, beside it.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "traces" / "h200" / "_probes" / "p2p-batched-1" / "p2p_batched.json.xz"


def table(path: Path) -> pd.DataFrame:
    from calib.convert.run import transfer_split
    from measure.collectives import call_starts

    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    rows = []
    for r in json.loads(raw)["results"]:
        start, dur = call_starts(r["calls"])
        _, transfer = transfer_split(start, dur)
        rows.append({"MiB": r["mib"], "mode": r["mode"], "delay_us": r["delay_us"],
                     "spread_us": float(np.median(start.max(axis=0) - start.min(axis=0))),
                     "split_us": float(np.median(transfer.mean(axis=0)))})
    df = pd.DataFrame(rows)
    one = df[df["mode"] == "one_way"].set_index(["MiB", "delay_us"])["split_us"]
    df["vs_one_way"] = df["split_us"].to_numpy() / one.loc[list(zip(df["MiB"], df["delay_us"], strict=True))].to_numpy()
    return df.round(3)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--training"]
    pd.set_option("display.width", 200)
    print(table(Path(args[0]) if args else DEFAULT).to_string(index=False))
    if "--training" in argv:
        import importlib.util

        spec = importlib.util.spec_from_file_location("released", ROOT / "benchmarks" / "released_collectives.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        calls = mod.training_calls()
        calls = calls[calls["kind"] == "sendrecv"].assign(MiB=lambda d: (d["bytes"] / 2**20).round(1),
                                                         apart=lambda d: d["spread_us"] > 50)
        print("\nH200 training steps' 2-GPU send/recv calls:")
        print(calls.groupby(["MiB", "apart", "receiver_last"])["split_us"].agg(["size", "median"]).round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
