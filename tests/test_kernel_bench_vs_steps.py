"""The reader of round 45's microbenchmark-against-steps comparisons (benchmarks/kernel_bench_vs_steps.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tests.conftest import ROOT, load_benchmark

PROBE = ROOT / "traces" / "h200" / "_probes" / "flash-conditions-1" / "flash-conditions.json"


def test_flash_probe_rows_meet_the_ops_of_their_shape() -> None:
    """A probe shape takes the forward and backward of its FLOPs (causal forward 2 b h s^2 d, backward 2.5x)."""
    bench = load_benchmark("kernel_bench_vs_steps")
    fwd = 2.0 * 16 * 2048**2 * 128  # llama3-8b at TP 2, seq 2048: 16 heads per rank
    flash = pd.DataFrame({"steps": [1e-4, 2.5e-4, 9.0], "bench": [1.1e-4, 2.4e-4, 9.0]},
                         index=pd.MultiIndex.from_tuples([("fwd", fwd), ("bwd", 2.5 * fwd), ("bwd", fwd)],
                                                         names=["pass", "flops"]))
    table = bench.flash_probe_table(PROBE, flash)
    assert table.loc["llama3-8b/tp2/seq2048", ("ms", "steps")] == 0.35
    assert table.loc["llama3-8b/tp2/seq2048", ("ms", "microbenchmark")] == 0.35
    assert np.isnan(table.loc["llama3-8b/tp1/seq8192", ("ms", "steps")])
    assert {"gapped", "back-to-back", "after-gemms", "gapped-late"} <= set(table["ms"].columns)


def test_clock_sensitivity_is_the_slope_of_log_time_on_log_clock(tmp_path: Path) -> None:
    """beta recovers a known time ~ clock^-beta per call; calls without a clock reading are left out of it."""
    import json
    import lzma

    bench = load_benchmark("kernel_bench_vs_steps")
    points = []
    for call, beta in (("gemm/a", 0.45), ("flash/b", 0.8)):
        for burst, ghz in zip((0, 4, 16), (1.98, 1.8, 1.6), strict=True):
            points.append({"call": call, "burst": burst, "time_s": 1e-3 * (1.98 / ghz) ** beta, "sm_clock_hz": ghz * 1e9})
        points.append({"call": call, "burst": 16, "time_s": 5.0, "sm_clock_hz": None})
    path = tmp_path / "clock-sensitivity.json.xz"
    with lzma.open(path, "wt") as fh:
        json.dump({"points": points}, fh)
    table, betas = bench.clock_table(path)
    assert betas.to_dict() == {"gemm/a": 0.45, "flash/b": 0.8}
    assert table.loc["gemm/a", ("GHz", 4)] == 1.8
