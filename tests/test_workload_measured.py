"""The workload model against the real H200 training runs (traces/h200/): peak memory per GPU and
the GEMM kernels of a profiled step.

The memory estimate's structure (Megatron model state, Korthikanti et al. activations, the transient
peaks of the loss, of one layer's backward and of the optimizer step) was checked against these runs
when it was written, so the memory test is a regression guard on real data, not a held-out accuracy
claim.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from calib.bundle import read_bundle
from calib.validation.engine import model_of, parallel_of
from calib.workload import memory
from tests.conftest import TRACES


def _training_bundles() -> list:
    out = []
    for manifest in sorted((TRACES / "h200").glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        if data.get("kind") == "training" and data.get("status") == "complete" and data.get("memory"):
            out.append(manifest.parent)
    return out


BUNDLES = _training_bundles()


@pytest.mark.skipif(not BUNDLES, reason="no measured H200 training bundles in traces/h200")
@pytest.mark.parametrize("path", BUNDLES, ids=[p.name for p in BUNDLES])
def test_peak_memory_within_ten_percent_of_measured(path) -> None:
    bundle = read_bundle(path)
    spec = bundle.manifest.spec
    est = memory.estimate(model_of(spec), parallel_of(spec), capacity_bytes=141e9)
    measured = max(m["peak_allocated_bytes"] for m in json.loads((path / "manifest.json").read_text())["memory"])
    assert est.total_bytes == pytest.approx(measured, rel=0.10)


DENSE = [p for p in BUNDLES if json.loads((p / "manifest.json").read_text())["notes"]["model_arch"]["experts"] == 0]


@pytest.mark.skipif(not DENSE, reason="no measured H200 dense training bundles in traces/h200")
@pytest.mark.parametrize("path", DENSE, ids=[p.name for p in DENSE])
def test_generated_gemms_are_the_measured_ones(path) -> None:
    """Every GEMM kernel rank 0 ran in its profiled step (shape and count) is one the generator emits
    for that rank's pipeline stage, and nothing else: TP, PP, VPP, SP, DP, recomputation variants."""
    import numpy as np
    import pandas as pd

    from calib.fit import split_k_reductions
    from calib.workload.generate import generate

    bundle = read_bundle(path)
    gen = generate(model_of(bundle.manifest.spec), parallel_of(bundle.manifest.spec), lambda df: np.full(len(df), 1e-6))
    generated = Counter()
    for op, n in gen.op_counts(0).items():
        if op.op_class == "gemm":
            generated[(op.aten_op, op.m, op.n, op.k, op.batch)] += n
    k = split_k_reductions(pd.read_parquet(path / "kernels.parquet"))  # cuBLAS split-K sums are not GEMMs
    g = k[(k["rank"] == 0) & (k["op_class"] == "gemm") & k["m"].notna()]
    measured = Counter(zip(g["aten_op"], g["m"].astype(int), g["n"].astype(int), g["k"].astype(int),
                           g["batch"].astype(int), strict=True))
    assert generated == measured
