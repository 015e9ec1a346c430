"""KernelModel on synthetic points from a known function (tests/fitdata.py): fit, CV, extrapolation, export."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from fitdata import PEAK_B, PEAK_F, gemm_time, kernel_frame
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


def test_kernel_timed_microbenchmarks_shape_the_curve_and_the_steps_set_its_level() -> None:
    """Steps measured GEMMs up to 2^11 per dimension; a kernel-timed microbenchmark measured up to 2^13, its work
    term 10 % shorter throughout (flash attention ran 9 % under the steps in round 45): full-size shapes are
    predicted at the steps' level, and the microbenchmark's rows at their own."""
    rng = np.random.default_rng(0)

    def timed(top: float, work_scale: float, source: str) -> pd.DataFrame:
        df = _gemm_rows([tuple(int(2 ** rng.uniform(9, top)) for _ in range(3)) for _ in range(200)])
        work = np.maximum(df["flops"] / (0.7 * PEAK_F), df["bytes"] / (0.8 * PEAK_B))
        return df.assign(time_s=2e-6 + work_scale * work, source=source)

    steps, bench = timed(11.0, 1.0, "trace"), timed(13.0, 0.9, "bench-kernel")
    big = _gemm_rows([(8192, 8192, 8192), (8192, 4096, 8192), (4096, 8192, 6144)])
    truth = (2e-6 + big["flops"] / (0.7 * PEAK_F)).to_numpy()
    model = KernelModel(peaks=PEAKS["H200"], residual=False).fit(*shape_table(pd.concat([steps, bench]))[:2])
    assert model.groups_["gemm"]["source_levels"]["bench-kernel"] == pytest.approx(np.log(0.9), abs=0.01)
    for m in (model, KernelModel.from_dict(yaml.safe_load(yaml.safe_dump(model.to_dict())))):
        assert np.all(np.abs(m.predict(big) / truth - 1) < 0.02), m.predict(big) / truth
        as_bench = m.predict(big.assign(source="bench-kernel"))
        assert np.all(np.abs(as_bench / (2e-6 + 0.9 * (truth - 2e-6)) - 1) < 0.02)
    # The steps alone fit no level.
    assert "source_levels" not in KernelModel(peaks=PEAKS["H200"], residual=False).fit(
        *shape_table(steps)[:2]).groups_["gemm"]


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


def test_kernels_of_one_op_are_summed_before_the_median() -> None:
    """A split-K GEMM launches the GEMM and a splitKreduce kernel with the op's shape: the op's time
    is their sum; a back-to-back repeat of the same op (its first kernel name again) is a new op."""
    from calib.models.kernel import op_instances

    shape = {"op_class": "gemm", "aten_op": "aten::mm", "m": 4096, "n": 8, "k": 4096, "batch": 1,
             "flops": 2.0 * 4096 * 8 * 4096, "bytes": 1e6, "dtype": "bfloat16", "rank": 0, "step": 1, "stream": 7}
    names = ["gemm_splitK", "splitKreduce", "gemm_splitK", "splitKreduce"]
    times = [9e-6, 2e-6, 9.2e-6, 2.1e-6]
    df = pd.DataFrame([{**shape, "name": n, "start_s": 1e-5 * i, "time_s": t, "source": "trace"}
                       for i, (n, t) in enumerate(zip(names, times, strict=True))])
    bench = pd.DataFrame([{**shape, "name": "mm/label", "start_s": 0.0, "time_s": 30e-6, "source": "bench"}])
    ops = op_instances(pd.concat([df, bench], ignore_index=True))
    assert sorted(ops["time_s"].round(9).tolist()) == [11e-6, 11.3e-6, 30e-6]
    shapes, t, counts = shape_table(df)
    assert len(shapes) == 1 and t[0] == pytest.approx(11.15e-6) and counts[0] == 2


def test_shape_folds_hold_out_a_shape_from_both_sources() -> None:
    from calib.models.kernel import shape_folds

    trace = kernel_frame(seed=0).assign(source="trace")
    both = pd.concat([trace, trace.assign(source="bench")], ignore_index=True)
    shapes, _, _ = shape_table(both)
    folds = shape_folds(shapes, 5)
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(shapes)))
    key = shapes.drop(columns="source").map(str).agg("|".join, axis=1).to_numpy()
    for fold in folds:
        rest = np.setdiff1d(np.arange(len(shapes)), fold)
        assert not set(key[fold]) & set(key[rest])


def _wave_frame(seed: int, n: int = 400) -> pd.DataFrame:
    """GEMMs from a known function with wave quantisation: 128x128 tiles over 132 SMs, the last
    partial wave costing a full one (synthetic; checks that the residual can learn it)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        m, nn = (int(128 * rng.integers(4, 40)) for _ in range(2))
        k = int(2 ** rng.uniform(10, 13))
        tiles = np.ceil(m / 128) * np.ceil(nn / 128)
        waves = np.ceil(tiles / 132)
        t = 3e-6 + waves * 132 * (2.0 * 128 * 128 * k) / (0.75 * 989.4e12)
        rows.append({"rank": 0, "step": 0, "stream": 7, "name": "nvjet", "op_class": "gemm", "start_s": 1e-3 * i,
                     "time_s": t, "aten_op": "aten::mm", "m": m, "n": nn, "k": k, "batch": 1,
                     "flops": 2.0 * m * nn * k, "bytes": 2.0 * (m * k + k * nn + m * nn), "dtype": "bfloat16"})
    return pd.DataFrame(rows)


def test_residual_learns_wave_quantisation_on_held_out_shapes() -> None:
    shapes, t, _ = shape_table(_wave_frame(0))
    test, tt, _ = shape_table(_wave_frame(1))
    err = {}
    for residual in (False, True):
        model = KernelModel(peaks=PEAKS["H200"], residual=residual).fit(shapes, t)
        err[residual] = float(np.mean(np.abs(model.predict(test) - tt) / tt))
    assert err[True] < 0.5 * err[False], err
    assert err[True] < 0.05, err


def test_calibration_without_a_residual_predicts_with_the_curves() -> None:
    """A kernel section written before the residual existed (no `residual` key) still loads."""
    model = _fit(kernel_frame(seed=0))
    data = model.to_dict()
    assert "residual" in data and data["residual"]["trees"]
    old = KernelModel.from_dict({k: v for k, v in data.items() if k != "residual"})
    shapes, _, _ = shape_table(kernel_frame(seed=3))
    assert np.allclose(old.predict(shapes), model._predict_curves(shapes), rtol=1e-12)
    broken = {**data, "residual": {**data["residual"], "trees": [{"feature": [0], "value": [1.0, 2.0]}]}}
    with pytest.raises(ValueError, match="tree 0"):
        KernelModel.from_dict(broken)


def test_exported_trees_predict_as_scikit_learn_does() -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    from calib.models import residual as res

    rng = np.random.default_rng(0)
    F = rng.normal(size=(400, len(res.FEATURES)))
    y = np.sin(F[:, 3]) + 0.3 * (F[:, -1] > 0.2)
    gb = GradientBoostingRegressor(n_estimators=30, max_depth=4, learning_rate=0.1, random_state=0).fit(F, y)
    trees = [res._preorder(e.tree_, 0.1) for e in gb.estimators_[:, 0]]
    out = np.full(len(F), float(gb.init_.predict(F[:1]).ravel()[0]))
    F32 = F.astype(np.float32)
    for tr in trees:
        left, right = res._links(tr["feature"])
        feat, val = np.asarray(tr["feature"]), np.asarray(tr["value"])
        for i in range(len(F)):
            node = 0
            while feat[node] >= 0:
                node = left[node] if F32[i, feat[node]] <= np.float32(val[node]) else right[node]
            out[i] += val[node]
    assert np.abs(out - gb.predict(F)).max() < 1e-4


def test_residual_fades_out_beyond_the_measured_work() -> None:
    """Far above the largest measured GEMM the curves alone time a shape; inside the range the
    residual applies (and stays within the training residuals' range)."""
    from calib.models.residual import TAPER_DECADES

    model = KernelModel(peaks=PEAKS["H200"]).fit(*shape_table(_wave_frame(0))[:2])
    hi = model.residual_["work_range"]["gemm"][1]
    side = int(round((10 ** (hi + TAPER_DECADES + 0.3) / 2) ** (1 / 3)))
    far = _gemm_rows([(side, side, side)])
    assert np.log10(far["flops"].iloc[0]) > hi + TAPER_DECADES
    assert model.predict(far)[0] == pytest.approx(model._predict_curves(far)[0], rel=1e-12)
    inside, _, _ = shape_table(_wave_frame(1))
    ratio = np.log(model.predict(inside) / model._predict_curves(inside))
    lo, top = model.residual_["clip"]
    assert np.all((ratio >= lo - 1e-9) & (ratio <= top + 1e-9)) and np.abs(ratio).max() > 0.01


def test_memory_ops_are_timed_by_their_layout() -> None:
    """Two layouts of one aten op at the same bytes, 3x apart (a reduction over the inner or the outer
    axis): each is predicted at its own time on held-out sizes; an op without a layout is timed by
    the family as a whole, between the two."""
    rng = np.random.default_rng(0)
    rows = []
    for nb in 2 ** rng.uniform(20, 30, 80):
        for layout, slow in (("reduce128x4", 1.0), ("reduce512x1", 3.0)):
            rows.append({"op_class": "memory", "aten_op": "aten::sum", "bytes": float(int(nb)), "flops": 0.0,
                         "dtype": "bfloat16", "layout": layout, "time_s": 2e-6 + slow * nb / 3.0e12})
    base = kernel_frame(seed=0)
    shapes, t, _ = shape_table(pd.concat([base, pd.DataFrame(rows)], ignore_index=True))
    model = KernelModel(peaks=PEAKS["H200"]).fit(shapes, t)
    nb = 3.0e8
    probe = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::sum", "bytes": nb, "flops": 0.0, "dtype": "bfloat16",
                           "layout": layout} for layout in ("reduce128x4", "reduce512x1", "")])
    fast, slow, unknown = model.predict(probe)
    assert fast == pytest.approx(2e-6 + nb / 3.0e12, rel=0.1)
    assert slow == pytest.approx(2e-6 + 3 * nb / 3.0e12, rel=0.1)
    assert fast < unknown < slow
    again = KernelModel.from_dict(yaml.safe_load(yaml.safe_dump(model.to_dict())))
    assert np.allclose(again.predict(probe), model.predict(probe))


def test_layouts_split_one_shape_in_two() -> None:
    rows = pd.DataFrame([{"op_class": "memory", "aten_op": "aten::copy_", "bytes": 1e8, "flops": 0.0, "dtype": "bfloat16",
                          "layout": layout, "time_s": t} for layout, t in (("memcpy", 40e-6), ("strided", 90e-6))])
    shapes, t, counts = shape_table(rows)
    assert sorted(t.tolist()) == [40e-6, 90e-6] and counts.tolist() == [1, 1]
    assert shape_table(rows.drop(columns=["layout"]))[2].tolist() == [2]


def _fill_rows(dtype: str, sizes: list[float], bw: float, op: str = "aten::fill_") -> pd.DataFrame:
    return pd.DataFrame([{"op_class": "memory", "aten_op": op, "bytes": b, "dtype": dtype,
                          "time_s": 1e-6 + b / bw} for b in sizes])


FP32_FILL = "memory:fill/fp32"


def test_a_curve_does_not_predict_inside_a_gap_of_its_measurements() -> None:
    """A dtype's curve measured at 8 bytes and at gigabytes has seen nothing in between: a size there
    is timed by the family's curve over all dtypes, measured there (traces/h200: fp32 fill_ of 33 MB,
    interpolated at 9x its time before the rule)."""
    dense = [2.0 ** e for e in range(10, 34)]
    df = pd.concat([_fill_rows("bfloat16", dense, 4e12), _fill_rows("bfloat16", dense, 3e12, "aten::add"),
                    _fill_rows("float32", [8.0, 1e9, 1.5e9, 2e9, 3e9, 4e9, 6e9, 8e9], 4e12)], ignore_index=True)
    model = _fit(df)
    gaps = model.groups_[FP32_FILL]["gaps"]
    assert len(gaps) == 1 and gaps[0][0] < np.log10(8.1) and gaps[0][1] > 8.9
    q = _fill_rows("float32", [3.3e7, 2.5e9], 4e12)
    shapes = q[["op_class", "aten_op", "bytes", "dtype"]].assign(flops=0.0)
    pred = model.predict(shapes)
    assert abs(pred[0] / q["time_s"][0] - 1) < 0.25, pred / q["time_s"]
    old = model.to_dict()
    del old["classes"][FP32_FILL]["gaps"]  # a file written before the rule: no gaps, predicts as before
    before = KernelModel.from_dict(old).predict(shapes)
    assert before[0] > 2 * q["time_s"][0]  # the fp32 curve across its 8-decade gap
    assert before[1] == pytest.approx(pred[1])  # inside its measured sizes nothing changes


def test_knots_move_onto_measured_sizes_next_to_a_gap() -> None:
    """The fp32 softmax of the H200 training steps (traces/h200), measured at 8 and 34 MB and from 537 MB
    up, nothing between: a knot at a quantile inside the gap bent the curve where nothing was measured,
    and the 537 MB kernel of every Llama-3 TP 2 step came out 19 % short of its own measurement (5.6 %
    held out). Now the curve's interior knots sit on measured sizes, and every size from 537 MB up is
    predicted within 5 %, in sample and held out. Round 19's one-layer GPT-3 175B put a 3.2 GB softmax
    among them, 5.1 % short in sample and 6.8 % held out; round 21's repeats moved its neighbours'
    median times, and it is 7.06 % held out: within 6 % in sample, 7.5 % held out (3 % on mean). Runs at sequence 2048 only: the softmax of longer rows (6144 and 8192, rounds 18-19) is
    slower per byte at one size, which bytes alone do not tell."""
    import json

    from conftest import TRACES

    frames = []
    for path in sorted((TRACES / "h200").glob("*/kernels.parquet")):
        spec = json.loads((path.parent / "manifest.json").read_text()).get("spec") or {}
        if spec.get("seq_length") != 2048:
            continue
        k = pd.read_parquet(path, columns=["rank", "op_class", "aten_op", "bytes", "dtype", "time_s", "flops"])
        frames.append(k[(k["rank"] == 0) & (k["aten_op"] == "aten::_softmax") & (k["dtype"] == "float32")])
    rows = pd.concat(frames, ignore_index=True).drop(columns=["rank"])
    assert rows["bytes"].between(4e7, 5e8).sum() == 0 and (rows["bytes"] == 2**29).any()
    shapes, t, _ = shape_table(rows)
    big = np.flatnonzero(shapes["bytes"].to_numpy(float) >= 2**29)
    model = KernelModel(peaks=PEAKS["H200"], residual=False).fit(shapes, t)
    ratio = model.predict(shapes.iloc[big]) / t[big]
    assert np.all(np.abs(ratio - 1) < 0.06), ratio
    measured = np.log10(shapes["bytes"].to_numpy(float))
    assert all(np.min(np.abs(measured - k)) < 1e-9 for k in model.groups_["memory"]["knots"][1:-1])
    held_out = []
    for i in big:
        train = np.setdiff1d(np.arange(len(t)), [i])
        pred = KernelModel(peaks=PEAKS["H200"], residual=False).fit(shapes.iloc[train], t[train]).predict(shapes.iloc[[i]])
        held_out.append(abs(pred[0] / t[i] - 1))
    assert max(held_out) < 0.075 and np.mean(held_out) < 0.03, held_out


def test_refine_knots_finds_a_kink_between_measured_sizes_and_keeps_segments_filled() -> None:
    """A flat line that bends at x = 6 (a measured size), sampled densely below 3 and from 6 up: the
    quantile knot falls in the empty stretch; refined, it sits on the kink, the fit is exact, and no
    segment is left with fewer than its minimum of measured values."""
    from calib.models.common import choose_knots, hinge_basis, refine_knots

    x = np.concatenate([np.linspace(0.0, 3.0, 12), np.linspace(6.0, 9.0, 12)])
    y = np.where(x < 6.0, 0.0, x - 6.0)

    def sse(kn: list[float]) -> float:
        a = hinge_basis(x, kn)
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        return float(np.sum((a @ coef - y) ** 2))

    start = choose_knots(x, 2)
    assert 3.0 < start[1] < 6.0 and sse(start) > 1e-3
    knots = refine_knots(x, start, sse, min_points_per_segment=3)
    assert knots[0] == start[0] and knots[-1] == start[-1]
    assert knots[1] == pytest.approx(6.0) and sse(knots) < 1e-12
    tight = refine_knots(x, start, sse, min_points_per_segment=13)  # no interior size leaves 13 either side
    assert tight == start
