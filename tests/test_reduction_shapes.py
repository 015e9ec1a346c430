"""Reductions timed by their shape, not only their bytes (issue 5, fourteenth session).

One kernel (reduce_kernel<512, 1>) sums a GQA gradient over query groups of 4 at ~350 GB/s and an
MoE expert's scaled activations over rows of 14,336 at ~2.3 TB/s: the same bytes, 6x the time. The
converter records a reduction's outputs (m) and reduced length (k); tables converted before it get
them from the bundle's configuration (calib.fit.reduction_shapes); the generator's reductions carry
them; the kernel model's residual sees them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from calib.bundle.io import read_bundle
from calib.fit import kernel_rows, reduction_shapes
from calib.models.kernel import KernelModel, shape_table
from calib.models.peaks import peaks_for_gpu
from calib.models.residual import FEATURES, residual_features
from calib.ops import classify, reduction_shape
from calib.validation.engine import model_of, parallel_of
from calib.workload.generate import generate
from tests.conftest import TRACES

BF16 = "Tensor(c10::BFloat16)"
H200 = TRACES / "h200"


def test_converter_records_outputs_and_reduced_length() -> None:
    r = classify("aten::sum", [[183, 14336], [-1], False], [BF16, "GenericList[Int]", "Bool"], [[183]], [BF16])
    assert (r.op_class, r.m, r.k, r.bytes) == ("memory", 183, 14336, 2 * 183 * 14337)
    r = classify("aten::sum", [[2048, 1, 8, 4, 128], [3]], [BF16, "GenericList[Int]"], [[2048, 1, 8, 128]], [BF16])
    assert (r.m, r.k) == (2048 * 8 * 128, 4)
    assert reduction_shape([64, 1024], []) == (1, 64 * 1024)  # to a scalar
    assert reduction_shape([64, 1024], [3]) == (0, 0)  # an output that does not divide the input
    r = classify("aten::sum", [[64, 1024]], ["Tensor(float)"])  # output unknown
    assert math.isnan(r.m) and math.isnan(r.k)
    r = classify("aten::add", [[8, 8], [8, 8]], [BF16] * 2, [[8, 8]], [BF16])  # not a reduction
    assert math.isnan(r.m) and math.isnan(r.k)


def test_generated_reductions_carry_their_shape_and_the_recorded_bytes() -> None:
    b = read_bundle(H200 / "llama8b-tp2")  # llama3-8b: 32 heads, 8 K/V groups, TP 2
    gen = generate(model_of(b.manifest.spec), parallel_of(b.manifest.spec), lambda t: np.zeros(len(t)))
    gqa = gen.ops[gen.ops["name"] == "attn.gqa.bwd.v"].iloc[0]
    tokens, kv = 2048, 4 * 128  # one micro-batch of 2,048 tokens; 4 local K/V heads of 128
    assert (gqa["m"], gqa["k"]) == (tokens * kv, 4)
    measured = b.table("kernels")
    assert gqa["bytes"] in set(measured.loc[measured["aten_op"] == "aten::sum", "bytes"])
    gemm = gen.ops[gen.ops["op_class"] == "gemm"].iloc[0]
    assert gemm["k"] > 0 and not gen.ops.loc[gen.ops["name"] == "attn.norm", "k"].notna().any()


def _sums(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["aten_op"] == "aten::sum") & (df["op_class"] == "memory")]


def test_old_tables_get_the_shapes_their_configuration_gives() -> None:
    dense = read_bundle(H200 / "llama8b-tp2")
    before = dense.table("kernels")
    assert _sums(before)["k"].isna().all()  # converted before the converter recorded them
    after = _sums(reduction_shapes(before, dense))
    gqa = after[after["bytes"] == 10485760]
    assert len(gqa) and (gqa["k"] == 4).all() and (gqa["m"] == 2048 * 512).all()
    assert after.loc[after["bytes"] != 10485760, "k"].isna().all()  # nothing else is one of its reductions

    moe = read_bundle(H200 / "mixtral-1gpu")
    after = _sums(reduction_shapes(moe.table("kernels"), moe))
    routed = after[after["k"] == 14336]
    assert len(routed) >= 16  # the experts' routed rows differ per expert and layer
    assert np.allclose(routed["bytes"], 2 * routed["m"] * 14337) and (routed["m"] % 1 == 0).all()
    assert set(routed["m"]) >= {183}  # 5,247,342 bytes: 183 rows of 14,336

    bench = read_bundle(H200 / "kernels-h200")  # no configuration: nothing to go by
    pd.testing.assert_frame_equal(reduction_shapes(bench.table("kernels"), bench), bench.table("kernels"))


def test_residual_sees_a_reduction_shape_and_nothing_else_changes() -> None:
    rows = pd.DataFrame([
        {"op_class": "memory", "aten_op": "aten::sum", "bytes": 1e7, "flops": 0.0, "dtype": "bfloat16",
         "m": 1000.0, "k": 4.0},
        {"op_class": "memory", "aten_op": "aten::sum", "bytes": 1e7, "flops": 0.0, "dtype": "bfloat16",
         "m": np.nan, "k": np.nan},
        {"op_class": "memory", "aten_op": "aten::add", "bytes": 1e7, "flops": 0.0, "dtype": "bfloat16",
         "m": np.nan, "k": np.nan},
    ])
    f = residual_features(rows, {}, np.array(["sum", "sum", "add"]), 132)
    lm, lk, ln = (FEATURES.index(c) for c in ("log_m", "log_k", "log_n"))
    assert f[0, lm] == 3.0 and np.isclose(f[0, lk], np.log10(4)) and f[0, ln] == 0.0
    assert (f[1:, [lm, lk]] == 0).all()
    old = residual_features(rows, {}, np.array(["sum", "sum", "add"]), 132, reductions=False)
    assert (old[:, [lm, lk]] == 0).all()  # trees of a file written before they were recorded never saw them


def test_fitted_model_times_a_short_reduction_slower_than_a_long_one_of_the_same_bytes() -> None:
    """Measured: 10.5 MB summed over groups of 4 in ~30 us (llama8b-tp2), ~10 MB over rows of 14,336
    in ~5 us (mixtral-1gpu). Bytes alone gave both one curve."""
    bundles = [read_bundle(H200 / n) for n in ("llama8b-tp2", "mixtral-1gpu", "llama8b-1gpu-s256", "mixtral-ep2-mbs2")]
    rows, _ = kernel_rows(bundles)
    shapes, t, _ = shape_table(rows)
    model = KernelModel(peaks=peaks_for_gpu("NVIDIA H200"), residual=True).fit(shapes, t)
    nbytes = 10485760.0
    ask = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::sum", "bytes": nbytes, "flops": 0.0,
                         "dtype": "bfloat16", "layout": "reduce512x1", "m": m, "k": k, "n": np.nan, "batch": np.nan}
                        for m, k in ((nbytes / 10, 4), (nbytes / (2 * 14337), 14336))])
    short, long = model.predict(ask)
    assert short > 3 * long
    assert 15e-6 < short < 60e-6 and long < 10e-6  # within 2x of the measured ~30 and ~5 us
