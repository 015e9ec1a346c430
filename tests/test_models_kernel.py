"""KernelModel on synthetic points from a known function (tests/fitdata.py): fit, CV, extrapolation, export."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from fitdata import gemm_time, kernel_frame
from sklearn.base import clone

from calib.errors import CalibError
from calib.models.kernel import KernelModel, shape_table
from calib.models.peaks import PEAKS, normalize_dtype, peaks_for_gpu


def _fit(df: pd.DataFrame) -> KernelModel:
    shapes, t, _ = shape_table(df)
    return KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)


def _gemm_rows(shapes: list[tuple[int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"op_class": "gemm", "aten_op": "aten::mm", "m": m, "n": n, "k": k, "batch": 1,
                          "flops": 2.0 * m * n * k, "bytes": 2.0 * (m * k + k * n + m * n), "dtype": "bfloat16"}
                         for m, n, k in shapes])


def test_fits_known_function_on_held_out_shapes() -> None:
    train = kernel_frame(seed=0, noise=0.01)
    test = kernel_frame(seed=1, noise=0.0)
    model = _fit(train)
    shapes, t, _ = shape_table(test)
    rel = np.abs(model.predict(shapes) - t) / t
    assert rel.mean() < 0.04, rel.mean()
    assert 0.6 < model.groups_["gemm"]["efficiency"] < 0.8  # the known function saturates at 0.7


def test_extrapolates_to_full_size_shapes_under_other_tp() -> None:
    """Fit on shapes up to 2^11 per dimension, predict llama3-70b MLP GEMMs at TP 1, 2, 4, 8 (up to 10^4x the FLOPs)."""
    model = _fit(kernel_frame(seed=0, noise=0.0, max_log2=11.0))
    tokens, hidden, ffn = 8192, 8192, 28672
    shapes = [(tokens, ffn // tp, hidden) for tp in (1, 2, 4, 8)] + [(tokens, hidden, ffn // tp) for tp in (1, 2, 4, 8)]
    pred = model.predict(_gemm_rows(shapes))
    truth = np.array([gemm_time(*s) for s in shapes])
    assert np.all(np.abs(pred - truth) / truth < 0.10), pred / truth
    # Time scales with the work: halving a dimension (TP x2) roughly halves the time.
    assert np.all(np.diff(pred[:4]) < 0) and 1.6 < pred[0] / pred[1] < 2.4


def test_yaml_round_trip_predicts_the_same() -> None:
    model = _fit(kernel_frame(seed=0))
    again = KernelModel.from_dict(yaml.safe_load(yaml.safe_dump(model.to_dict())))
    shapes, _, _ = shape_table(kernel_frame(seed=3))
    assert np.allclose(model.predict(shapes), again.predict(shapes), rtol=1e-12)


def test_sklearn_protocol() -> None:
    shapes, t, _ = shape_table(kernel_frame(seed=0))
    est = clone(KernelModel(peaks=PEAKS["H200"], max_segments=3))
    assert est.get_params()["max_segments"] == 3
    assert est.fit(shapes, t).score(shapes, t) > 0.95


def test_too_few_points_is_one_clear_error() -> None:
    shapes, t, _ = shape_table(kernel_frame(n_gemm=3, n_mem=2))
    with pytest.raises(CalibError, match="too few"):
        KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)


def test_unknown_class_without_data_is_refused_and_fallback_used() -> None:
    model = _fit(kernel_frame(seed=0))
    att = _gemm_rows([(2048, 2048, 128)]).assign(op_class="attention")
    assert model.predict(att)[0] == pytest.approx(model.predict(_gemm_rows([(2048, 2048, 128)]))[0])
    # An op doing no measurable work costs about the smallest measured kernel of its (fallback) class.
    tiny = model.predict(pd.DataFrame([{"op_class": "other", "aten_op": "aten::foo", "flops": 0, "bytes": 0, "dtype": ""}]))
    smallest = kernel_frame(seed=0)
    smallest = smallest[smallest["op_class"] == "memory"]["time_s"].min()
    assert 0.5 * smallest < tiny[0] < 2 * smallest
    with pytest.raises(CalibError, match="cannot predict"):
        model.predict(pd.DataFrame([{"op_class": "weird", "aten_op": "aten::foo", "flops": 0, "bytes": 0, "dtype": ""}]))


def test_peaks_and_dtypes() -> None:
    assert peaks_for_gpu("NVIDIA H100 80GB HBM3").name == "H100"
    assert normalize_dtype("bfloat16") == "bf16" and normalize_dtype("float32") == "fp32"
    with pytest.raises(CalibError, match="no configured peak"):
        peaks_for_gpu("Some GPU")


def test_microbenchmark_floor_is_not_predicted() -> None:
    """Kernel microbenchmark rows carry ~15 us of launch floor; predictions (no `source`) do not."""
    trace = kernel_frame(seed=0, noise=0.0).assign(source="trace")
    bench = kernel_frame(seed=1, noise=0.0)
    bench = bench.assign(source="bench", time_s=bench["time_s"] + 15e-6)
    shapes, t, _ = shape_table(pd.concat([trace, bench], ignore_index=True))
    model = KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)
    test = kernel_frame(seed=2, noise=0.0)
    tshapes, tt, _ = shape_table(test)
    rel = np.abs(model.predict(tshapes) - tt) / tt
    assert rel.mean() < 0.05, rel.mean()
    assert model.groups_["memory"]["t0_bench_s"] > 10e-6 > model.groups_["memory"]["t0_s"]


def test_foreach_chunks_are_timed_by_median() -> None:
    base = kernel_frame(seed=0)
    fe = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::_foreach_mul_", "bytes": b, "flops": 0.0,
                        "dtype": "float32", "time_s": 40e-6} for b in (1e8, 1e9, 1e10)])
    shapes, t, _ = shape_table(pd.concat([base, fe], ignore_index=True))
    model = KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)
    big = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::_foreach_mul_", "bytes": 1e11, "flops": 0.0,
                         "dtype": "float32"}])
    assert model.predict(big)[0] == pytest.approx(40e-6)


def test_foreach_kernel_time_saturates_with_list_bytes() -> None:
    base = kernel_frame(seed=0)
    sizes = [1e6, 1e7, 1e8, 1e9, 1e10, 1e11]
    fe = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::_foreach_mul_", "bytes": b, "flops": 0.0,
                        "dtype": "float32", "time_s": min(45e-6, 1.5e-6 + b / 2e12)} for b in sizes])
    shapes, t, _ = shape_table(pd.concat([base, fe], ignore_index=True))
    model = KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)
    probe = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::_foreach_mul_", "bytes": b, "flops": 0.0,
                           "dtype": "float32"} for b in (1e6, 1e12)])
    small, huge = model.predict(probe)
    assert small < 5e-6 and huge == pytest.approx(45e-6, rel=0.1)
