"""What measure.probes.a2a_context found: an all-to-all's time at one size in each context, by both conventions.

    python benchmarks/a2a_context.py [a2a_context.json[.xz]]    # default: the committed probe's

Per group size, size and context (measure/probes/a2a_context.py): the harness's convention (per call the
fastest member's kernel, median over the calls) and the training steps' (per call each member's kernel end less
the last member's start, averaged over the members, median over the calls), in us; and the training convention
over the harness context's, which the model would have to carry if training all-to-alls ran as these contexts do.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "traces" / "h200" / "_probes" / "a2a-context-1" / "a2a_context.json.xz"


def conventions(calls: list[list[list[float]]]) -> tuple[float, float, float]:
    """(harness, training, largest member's) medians over the calls, in us, of members' (base, start, dur) rows
    (measure.collectives.call_times: the harness's and the training steps' conventions)."""
    from measure.collectives import call_times

    slow, fast, training = call_times(calls)
    return float(np.median(fast)) * 1e6, float(np.median(training)) * 1e6, float(np.median(slow)) * 1e6


def table(path: Path) -> pd.DataFrame:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    data = json.loads(raw)
    rows = []
    for r in data["results"]:
        h, tr, slow = conventions(r["calls"])
        rows.append({"group": r["group_size"], "MiB": r["mib"], "context": r["context"], "harness_us": h,
                     "training_us": tr, "slowest_us": slow})
    df = pd.DataFrame(rows)
    base = df[df["context"] == "harness"].set_index(["group", "MiB"])["harness_us"]
    df["training/harness"] = df["training_us"].to_numpy() / base.loc[list(zip(df["group"], df["MiB"], strict=True))].to_numpy()
    return df


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    df = table(path)
    pd.set_option("display.width", 200)
    for col in ("harness_us", "training_us", "training/harness"):
        print(f"\n{col}:")
        print(df.pivot_table(index=["group", "MiB"], columns="context", values=col, sort=False).round(3 if "/" in col else 1)
              .to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
