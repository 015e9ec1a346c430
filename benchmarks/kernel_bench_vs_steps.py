"""How the kernel microbenchmarks time the training steps' own kernels (round 45, traces/README.md).

    python benchmarks/kernel_bench_vs_steps.py [GPU_DIR] [--with BUNDLE_DIR ...]    # default: traces/h200
    python benchmarks/kernel_bench_vs_steps.py --repeat FIRST AGAIN [--summary-out FILE]

For every GEMM shape a kernels bundle shares with the profiled training steps: its median time over the steps'
median, per bundle (its notes.timing_method: "events", CUDA events around each call; "kernel", each kernel from a
converted profile with the GPU idle before each call), and, for the kernel-timed one, per kernel name too (the same
cuBLAS kernel on the same shape). Round 45's kernel-timed bundle is committed packed, out of the fits: unpack it
(`tar -C /tmp -xJf traces/h200/_campaigns/x1-round45/kernels.tar.xz`) and add it with `--with /tmp/kernels-h200-kernel`. Then the GEMM-conditions probe (measure/probes/gemm_conditions.py) when the folder
has one: a GEMM's time, SM clock, power and clock-event reasons back to back on random inputs, on weight-scaled or
zero inputs, and with the GPU idle before each call; and the repeat of a kernel-timed kernels bundle on another lease
(`--repeat`: per shape, the second lease's median over the first's, by class; its summary is what
traces/h200/_probes/kernel-bench-repeat-1 keeps, the repeat's bundle itself not being committed for room).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's calib
    sys.path.insert(0, str(ROOT))

SHAPE = ["m", "n", "k", "batch"]


def _gemms(bundles: list) -> pd.DataFrame:
    from calib.fit import _kernel_frame, reference_clock_hz

    frames = []
    for b in bundles:
        df = _kernel_frame(b, reference_clock_hz(b.manifest.gpu.name))
        if df is None:
            continue
        g = df[(df["op_class"].astype(str) == "gemm") & df["aten_op"].astype(str).str.endswith("mm")]
        frames.append(g.assign(kernel=g["name"].astype(str).str.replace(r"\(.*", "", regex=True)))
    return pd.concat(frames, ignore_index=True)


def ratios(gemms: pd.DataFrame, by_kernel: bool) -> pd.DataFrame:
    """Per microbenchmark bundle, its median time per shape (and kernel name) over the training steps'."""
    key = SHAPE + (["kernel"] if by_kernel else [])
    steps = gemms[gemms["source"] == "trace"].groupby(key)["time_s"].median().rename("steps")
    rows = []
    for bid, g in gemms[gemms["source"] != "trace"].groupby("bundle"):
        j = g.groupby(key)["time_s"].median().rename("bench").to_frame().join(steps, how="inner")
        r = j["bench"] / j["steps"]
        rows.append({"bundle": bid, "shapes": len(r), "p10": r.quantile(0.1), "median": r.median(),
                     "p90": r.quantile(0.9), "max": r.max(), "within 5 %": float(np.mean(np.abs(r - 1) <= 0.05))})
    return pd.DataFrame(rows).round(3)


def flash_medians(bundles: list) -> pd.DataFrame:
    """Median flash-attention op time (s; its kernels summed, calib.models.kernel.op_instances) per pass and FLOPs,
    for the training steps (`steps`) and the kernel-timed microbenchmark (`bench`), where both measured it."""
    from calib.fit import _kernel_frame, reference_clock_hz
    from calib.models.kernel import op_instances

    frames = [df for df in (_kernel_frame(b, reference_clock_hz(b.manifest.gpu.name)) for b in bundles) if df is not None]
    ops = op_instances(pd.concat(frames, ignore_index=True))
    ops = ops[ops["aten_op"].astype(str).str.contains("flash_attention")]
    ops = ops.assign(**{"pass": np.where(ops["aten_op"].astype(str).str.contains("backward"), "bwd", "fwd")})
    med = ops.groupby(["pass", "flops", "source"])["time_s"].median().unstack("source")
    if not {"trace", "bench-kernel"} <= set(med.columns):
        return pd.DataFrame(columns=["steps", "bench"])
    return med[["trace", "bench-kernel"]].set_axis(["steps", "bench"], axis=1).dropna()


def flash_probe_table(path: Path, flash: pd.DataFrame) -> pd.DataFrame:
    """The flash-conditions probe: forward + backward ms per condition, with the microbenchmark's and the steps'
    forward + backward of the same shape (causal forward FLOPs 2 b h s^2 d, backward 2.5 times those)."""
    df = pd.DataFrame(json.loads(path.read_text())["points"])
    df["ms"] = df["median_s"] * 1e3
    df["GHz"] = df["sm_clock_hz"] / 1e9
    table = df.pivot_table(index="shape", columns="condition", values=["ms", "GHz", "power_w"], sort=False)
    shapes = df.drop_duplicates("shape").set_index("shape")
    fwd = 2.0 * shapes["batch"] * shapes["heads"] * shapes["seq"] ** 2 * shapes["head_dim"]

    def both(src: str) -> pd.Series:
        def one(pass_: str, f: float) -> float:
            rows = flash.loc[pass_] if pass_ in flash.index.get_level_values(0) else pd.DataFrame()
            hit = rows[np.isclose(rows.index.to_numpy(float), f, rtol=1e-3)] if len(rows) else rows
            return float(hit[src].iloc[0]) if len(hit) else np.nan
        return pd.Series([1e3 * (one("fwd", f) + one("bwd", 2.5 * f)) for f in fwd], index=shapes.index)

    table[("ms", "microbenchmark")] = both("bench")
    table[("ms", "steps")] = both("steps")
    return table.round(3)


def clock_table(path: Path) -> tuple[pd.DataFrame, pd.Series]:
    """The clock-sensitivity probe: per call and GEMM burst before it, median ms and median SM clock (GHz); and per
    call beta, the least-squares slope of log time on -log clock over its calls with a clock reading (time ~
    clock^-beta: 1 for a kernel the SM clock paces, 0 for one HBM paces)."""
    import lzma

    with lzma.open(path, "rt") as fh:
        df = pd.DataFrame(json.load(fh)["points"])
    df["ms"] = df["time_s"] * 1e3
    df["GHz"] = df["sm_clock_hz"] / 1e9
    table = df.groupby(["call", "burst"], sort=False)[["ms", "GHz"]].median().unstack("burst").round(3)
    ok = df.dropna(subset=["sm_clock_hz"])
    beta = ok.groupby("call", sort=False).apply(
        lambda g: float(np.polyfit(-np.log(g["sm_clock_hz"]), np.log(g["time_s"]), 1)[0]), include_groups=False)
    return table, beta.round(2).rename("beta")


def probe_table(path: Path) -> pd.DataFrame:
    data = json.loads(path.read_text())
    df = pd.DataFrame(data["points"])
    df["us"] = df["median_s"] * 1e6
    df["GHz"] = df["sm_clock_hz"] / 1e9
    df["power cap"] = [4 in r for r in df["clock_event_reasons"]]
    return df.pivot_table(index=["m", "n", "k", "layout"], columns="condition", values=["us", "GHz", "power_w"],
                          sort=False).round(3)


def repeat_summary(first: Path, again: Path) -> dict:
    """Per shape of two kernel-timed kernels bundles, |again / first - 1| in percent: overall and by op class."""
    from calib.bundle.io import load_bundles
    from calib.fit import _kernel_frame, reference_clock_hz
    from calib.models.kernel import shape_keys, shape_table

    medians = []
    for path in (first, again):
        b = load_bundles([path])[0]
        frame = _kernel_frame(b, reference_clock_hz(b.manifest.gpu.name))
        if frame is None:
            raise SystemExit(f"{path}: no kernel rows")
        shapes, t, _ = shape_table(frame)
        medians.append(pd.Series(t, index=shape_keys(shapes).to_numpy()))
    j = pd.concat([medians[0].rename("first"), medians[1].rename("again")], axis=1).dropna()
    diff = (j["again"] / j["first"] - 1) * 100
    cls = pd.Series([k.split("|")[0] for k in j.index], index=j.index)

    def stats(d: pd.Series) -> dict:
        a = d.abs()
        return {"shapes": len(d), "mean_abs_pct": round(float(a.mean()), 3), "median_abs_pct": round(float(a.median()), 3),
                "p90_abs_pct": round(float(a.quantile(0.9)), 3), "max_abs_pct": round(float(a.max()), 3),
                "median_signed_pct": round(float(d.median()), 3)}

    return {"first": first.name, "again": f"{again.name}, run again on another lease", "all": stats(diff),
            "by_class": {c: stats(diff[cls == c]) for c in sorted(set(cls))}}


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles

    if argv[:1] == ["--repeat"]:
        out = repeat_summary(Path(argv[1]), Path(argv[2]))
        if "--summary-out" in argv:
            Path(argv[argv.index("--summary-out") + 1]).write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(out, indent=1))
        return 0
    extra = [Path(a) for i, a in enumerate(argv) if i and argv[i - 1] == "--with"]
    rest = [a for i, a in enumerate(argv) if a != "--with" and not (i and argv[i - 1] == "--with")]
    folder = Path(rest[0]) if rest else ROOT / "traces" / "h200"
    bundles = [b for b in load_bundles([folder, *extra]) if b.manifest.kind in ("kernels", "training")]
    gemms = _gemms(bundles)
    pd.set_option("display.width", 220)
    print("GEMM shapes of the training steps timed by each kernel microbenchmark: bench / steps")
    print(ratios(gemms, by_kernel=False).to_string(index=False))
    print("\nthe same, shape and cuBLAS kernel both the same")
    print(ratios(gemms, by_kernel=True).to_string(index=False))
    for p in sorted((folder / "_probes").glob("gemm-conditions-*/gemm-conditions.json")):
        print(f"\n{p.parent.name}: median us, SM clock GHz, instantaneous power W per condition")
        print(probe_table(p).to_string())
    if any(b.manifest.kind == "kernels" and b.manifest.timing_method == "kernel" for b in bundles):
        flash = flash_medians(bundles)
        print("\nflash-attention ops of the training steps timed by the kernel-timed microbenchmark (ms)")
        print((flash * 1e3).assign(ratio=flash["bench"] / flash["steps"]).round(3).to_string())
        for p in sorted((folder / "_probes").glob("flash-conditions-*/flash-conditions.json")):
            print(f"\n{p.parent.name}: forward + backward median ms, SM clock GHz, instantaneous power W per condition")
            print(flash_probe_table(p, flash).to_string())
    for p in sorted((folder / "_probes").glob("clock-sensitivity-*/clock-sensitivity.json.xz")):
        table, beta = clock_table(p)
        print(f"\n{p.parent.name}: median ms and SM clock GHz per call after a burst of N 8192^3 GEMMs; beta")
        print(table.to_string())
        print(beta.to_string())
    for p in sorted((folder / "_probes").glob("kernel-bench-repeat-*/summary.json")):
        rep = json.loads(p.read_text())
        print(f"\n{p.parent.name}: {rep['first']} again on another lease, |again / first - 1| % per shape")
        print(pd.DataFrame({"all": rep["all"], **rep["by_class"]}).T.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
