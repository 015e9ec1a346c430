"""CollectiveModel and the ASTRA-sim export on synthetic series from known functions."""

from __future__ import annotations

import numpy as np
import pytest
from fitdata import allreduce_time

from calib.errors import CalibError
from calib.models.network import (
    BEND_MAX_GAP,
    FORM_VERSION,
    Bends,
    CollectiveModel,
    Series,
    astra_collective_time_s,
    bus_factor,
    fit_astra,
    normalize_kind,
)

SIZES = 2.0 ** np.arange(10, 31)


def test_series_recovers_alpha_beta_and_predicts_held_out_sizes() -> None:
    t = allreduce_time(SIZES, 8)
    s = Series.fit("intra", "allreduce", 8, SIZES[::2], t[::2])
    assert s.alpha_s == pytest.approx(30e-6, rel=1e-3)
    assert s.busbw_bytes_per_s == pytest.approx(350e9, rel=1e-3)
    rel = np.abs(s.predict(SIZES[1::2]) - t[1::2]) / t[1::2]
    assert rel.max() < 1e-3
    # Beyond the largest measured size the bandwidth regime holds.
    big = 2.0**34
    assert s.predict(np.array([big]))[0] == pytest.approx(allreduce_time(np.array([big]), 8)[0], rel=1e-3)


def test_unmeasured_group_size_borrows_nearest_with_constant_busbw() -> None:
    m = CollectiveModel(gpus_per_node=8)
    m.series[m.key("intra", "allreduce", 8)] = Series.fit("intra", "allreduce", 8, SIZES, allreduce_time(SIZES, 8))
    got = m.predict("all_reduce", 4, 2.0**30)
    assert float(got) == pytest.approx(float(allreduce_time(np.array([2.0**30]), 4)[0]), rel=1e-3)
    with pytest.raises(CalibError, match="inter"):
        m.predict("allreduce", 16, 2.0**20)
    with pytest.raises(CalibError, match="no all_to_all|alltoall"):
        CollectiveModel().predict("alltoall", 8, 1024)


def test_astra_fit_recovers_parameters_of_its_own_formula() -> None:
    pts = []
    for kind in ("allreduce", "allgather", "reducescatter"):
        for n in (2, 8):
            impl = "direct" if kind == "allgather" else "ring"
            pts.append((kind, n, SIZES, astra_collective_time_s(kind, n, SIZES, 280.0, 700.0, impl)))
    fit = fit_astra("intra", pts)
    assert fit.bandwidth_gbps == pytest.approx(280.0, rel=1e-6)
    assert fit.latency_ns == pytest.approx(700.0, rel=1e-6)
    assert fit.implementation["allgather"] == "direct" and fit.implementation["allreduce"] == "ring"
    assert fit.error_all["mape"] < 1e-6


def test_astra_fit_reports_what_one_latency_costs() -> None:
    pts = [("allreduce", n, SIZES, allreduce_time(SIZES, n)) for n in (2, 8)]
    fit = fit_astra("intra", pts)
    # Large messages are bandwidth-bound, so the bandwidth comes out close to the bus bandwidth ...
    assert fit.bandwidth_gbps * 2**30 == pytest.approx(350e9, rel=0.1)
    # ... and the error of one latency for both group sizes is reported, not hidden.
    assert fit.error_all["mape"] > 5.0


def test_kinds_and_bus_factors() -> None:
    assert normalize_kind("all_gather_into_tensor") == "allgather"
    assert normalize_kind("reduce_scatter_tensor") == "reducescatter"
    assert normalize_kind("all_to_all_single") == "alltoall"
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    with pytest.raises(CalibError, match="not one of"):
        normalize_kind("gossip")


def test_model_round_trip() -> None:
    m = CollectiveModel(gpus_per_node=8)
    m.series[m.key("intra", "allreduce", 2)] = Series.fit("intra", "allreduce", 2, SIZES, allreduce_time(SIZES, 2))
    m.astra["intra"] = fit_astra("intra", [("allreduce", 2, SIZES, allreduce_time(SIZES, 2))])
    again = CollectiveModel.from_dict(m.to_dict())
    assert np.allclose(again.predict("allreduce", 2, SIZES), m.predict("allreduce", 2, SIZES))
    assert again.astra_params()["intra"]["bandwidth_gbps"] == m.astra_params()["intra"]["bandwidth_gbps"]


@pytest.mark.parametrize("impl", ["ring", "direct", "halvingDoubling"])
def test_astra_formula_agrees_with_the_embedded_simulator(impl: str) -> None:
    """The closed forms fitted here are the ones calib.sim simulates (one Switch dimension, one chunk)."""
    from calib.sim.collectives import CollectiveTimer
    from calib.sim.config import Dim, NetworkConfig, SystemConfig
    from calib.sim.network import MultiDimTopology

    for n in (2, 8):
        timer = CollectiveTimer(
            MultiDimTopology(NetworkConfig((Dim("Switch", n, 300.0, 700.0),))),
            SystemConfig(endpoint_delay_ns=10, all_reduce_impl=[impl], all_gather_impl=[impl],
                         reduce_scatter_impl=[impl], all_to_all_impl=[impl]),
        )
        s = 2**26
        for sim_kind, kind in (("ALL_REDUCE", "allreduce"), ("REDUCE_SCATTER", "reducescatter"),
                               ("ALL_GATHER", "allgather"), ("ALL_TO_ALL", "alltoall")):
            if impl == "halvingDoubling" and kind != "allreduce":
                continue
            comm_size = s // n if kind == "allgather" else s  # ASTRA-sim sizes all-gather by the shard
            sim_ns = timer.finish_times(sim_kind, comm_size, list(range(n)), [0] * n)[0]
            mine_ns = astra_collective_time_s(kind, n, np.array([s]), 300.0, 700.0, impl)[0] * 1e9
            assert mine_ns == pytest.approx(sim_ns, rel=1e-4)


def test_microbenchmark_launch_floor_is_fitted_apart() -> None:
    """Microbenchmarks (CUDA events around one call) read 40 us more than the same collective inside
    a training step; the model keeps both latencies and predicts with the in-training one."""
    trace_sizes = 2.0 ** np.arange(12, 28, 2)
    s = np.concatenate([SIZES, trace_sizes])
    bench = np.concatenate([np.ones(len(SIZES), bool), np.zeros(len(trace_sizes), bool)])
    t = allreduce_time(s, 2) - 30e-6 + np.where(bench, 45e-6, 5e-6)
    ser = Series.fit("intra", "allreduce", 2, s, t, bench=bench)
    assert ser.alpha_s == pytest.approx(5e-6, rel=1e-3) and ser.alpha_bench_s == pytest.approx(45e-6, rel=1e-3)
    m = CollectiveModel(series={CollectiveModel.key("intra", "allreduce", 2): ser})
    m.set_bench_floor()
    assert m.bench_floor_s["intra"] == pytest.approx(40e-6, rel=1e-3)
    assert m.predict("allreduce", 2, 4096.0) == pytest.approx(5e-6 + 4096 / 350e9, rel=1e-3)
    # A series measured by microbenchmarks only takes its latency minus the domain's floor.
    only = Series.fit("intra", "allgather", 2, SIZES, allreduce_time(SIZES, 2) + 15e-6, bench=np.ones(len(SIZES), bool))
    m.series[m.key("intra", "allgather", 2)] = only
    m.set_bench_floor()
    assert m.alpha_for(only) == pytest.approx(45e-6 - 40e-6, rel=1e-3)


def _pipeline_time(s: np.ndarray, n: int, alpha: float = 6e-6, c: float = 4e-9, busbw: float = 340e9) -> np.ndarray:
    """Known synthetic all-reduce in the pipelined form: alpha + c*sqrt(x) + x/busbw."""
    x = np.asarray(s, float) * bus_factor("allreduce", n)
    return alpha + c * np.sqrt(x) + x / busbw


def test_pipeline_form_recovers_its_coefficients_and_interpolates() -> None:
    t = _pipeline_time(SIZES, 4)
    s = Series.fit("intra", "allreduce", 4, SIZES[::2], t[::2])
    assert s.alpha_s == pytest.approx(6e-6, rel=1e-3)
    assert s.pipeline_s_per_sqrt_byte == pytest.approx(4e-9, rel=1e-3)
    assert s.busbw_bytes_per_s == pytest.approx(340e9, rel=1e-3)
    rel = np.abs(s.predict(SIZES[1::2]) - t[1::2]) / t[1::2]
    assert rel.max() < 1e-3
    # Effective bus bandwidth rises with size towards busbw and stays below it.
    big = np.array([2.0**36])
    eff = big * bus_factor("allreduce", 4) / s.predict(big)
    assert 0.95 * 340e9 < eff[0] < 340e9


def test_fit_is_least_absolute_error_so_one_outlier_does_not_move_it() -> None:
    """The headline error is a mean absolute percentage: one disturbed point (a collective slowed
    by a concurrent kernel) must not pull the curve for every other size."""
    t = _pipeline_time(SIZES, 2)
    t_bad = t.copy()
    t_bad[15] *= 1.6
    s = Series.fit("intra", "allreduce", 2, SIZES, t_bad)
    others = np.arange(len(SIZES)) != 15
    rel = np.abs(s.predict(SIZES[others]) - t[others]) / t[others]
    assert rel.max() < 0.01


def test_files_without_the_pipeline_term_predict_as_written() -> None:
    """A series saved before the pipeline form (form_version 1: no pipeline_s_per_sqrt_byte, a
    log-size residual) loads and predicts its own formula."""
    old = {"domain": "intra", "kind": "allgather", "group_size": 2, "alpha_s": 6e-6, "alpha_bench_s": 5e-5,
           "has_trace": True, "busbw_bytes_per_s": 2.5e11, "count": 11, "bytes_range": [1024.0, 2.0**30],
           "residual": {"knots": [3.0, 6.0, 9.0], "coef": [0.1, -0.02, 0.03]}}
    m = CollectiveModel.from_dict({"series": {"intra/allgather/2": old}, "gpus_per_node": 8})
    s = np.array([4096.0, 2.0**20, 2.0**27, 2.0**34])
    lg = np.clip(np.log10(s), 3.0, 9.0)
    resid = 0.1 + (-0.02) * (lg - 3.0) + 0.03 * np.maximum(lg - 6.0, 0.0)
    want = (6e-6 + s * 0.5 / 2.5e11) * np.exp(resid)
    assert np.allclose(m.predict("allgather", 2, s), want, rtol=1e-12)
    again = Series.from_dict(m.series["intra/allgather/2"].to_dict())
    assert again.pipeline_s_per_sqrt_byte == 0.0 and np.allclose(again.predict(s), want, rtol=1e-12)
    assert m.to_dict()["form_version"] == FORM_VERSION and not again.bends.knots


def test_bench_and_trace_share_the_curve_with_their_own_latency() -> None:
    trace_sizes = 2.0 ** np.arange(12, 30, 2)
    s = np.concatenate([SIZES, trace_sizes])
    bench = np.concatenate([np.ones(len(SIZES), bool), np.zeros(len(trace_sizes), bool)])
    t = _pipeline_time(s, 2) + np.where(bench, 45e-6, 0.0)
    ser = Series.fit("intra", "allreduce", 2, s, t, bench=bench)
    assert ser.alpha_s == pytest.approx(6e-6, rel=1e-3) and ser.alpha_bench_s == pytest.approx(51e-6, rel=1e-3)
    assert ser.has_trace
    assert np.allclose(ser.predict(trace_sizes), _pipeline_time(trace_sizes, 2), rtol=1e-3)


def test_a_series_without_large_sizes_keeps_a_finite_bandwidth() -> None:
    s = np.array([1024.0, 4096.0, 16384.0, 65536.0])
    t = np.full(len(s), 20e-6)  # latency-bound only: no byte term can be read off
    ser = Series.fit("intra", "allreduce", 2, s, t)
    assert np.isfinite(ser.busbw_bytes_per_s) and ser.busbw_bytes_per_s > 0
    assert np.all(np.isfinite(ser.predict(np.array([2.0**30]))))


def test_committed_calibration_still_loads_and_predicts() -> None:
    from pathlib import Path

    from calib.calibration import Calibration

    path = Path(__file__).resolve().parents[1] / "calib" / "data" / "calibration-h200.yaml"
    if not path.is_file():
        pytest.skip("no bundled calibration")
    m = Calibration.load(path).network_model()
    t = np.asarray(m.predict("allreduce", 2, SIZES), float)
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) > -1e-9) and t[0] > 0


def test_member_ranks_of_one_call_make_one_point() -> None:
    """Uneven all-gather-v members carry own-input x n as their size: the call times as an even one
    of the largest member's size, its transfer the members' mean; calls without all members and P2P stay per row."""
    import pandas as pd

    from calib.models.network_points import merge_instances

    rows = pd.DataFrame({
        "kind": ["allgather", "allgather", "allreduce", "allreduce", "allreduce", "sendrecv", "sendrecv", "allreduce"],
        "group_size": [2, 2, 2, 2, 2, 2, 2, 2],
        "bytes": [32e6, 29e6, 8e6, 8e6, 4e6, 1e6, 1e6, 2e6],
        "time_s": [76e-6, 84e-6, 30e-6, 34e-6, 20e-6, 9e-6, 11e-6, 15e-6],
        "bundle": "b", "domain": "intra",
        "pg_name": ["43", "43", "5", "5", "5", "7", "7", None],
        "seq": [313, 313, 10, 10, 11, 1, 1, 12],
    })
    out = merge_instances(rows)
    assert list(out.columns) == ["kind", "group_size", "bytes", "time_s", "bundle", "domain"]
    ag = out[out["kind"] == "allgather"]
    assert len(ag) == 1 and ag["bytes"].iloc[0] == pytest.approx(32e6) and ag["time_s"].iloc[0] == pytest.approx(80e-6)
    ar = out[out["kind"] == "allreduce"].sort_values("bytes")
    assert ar["bytes"].tolist() == [2e6, 4e6, 8e6]  # seq 11 lacks its peer; the unkeyed row stays
    assert ar["time_s"].tolist() == pytest.approx([15e-6, 20e-6, 32e-6])
    assert len(out[out["kind"] == "sendrecv"]) == 2
    plain = rows.drop(columns=["pg_name", "seq"])
    assert merge_instances(plain).equals(plain)


def test_kernel_timed_microbenchmarks_carry_the_training_latency() -> None:
    """The committed H200 bundles: the collectives timed by their NCCL kernels are not event-timed,
    and fitted alone their latency is the in-training one (microseconds), not the ~45-60 us launch
    floor of the event-timed bundles."""
    from pathlib import Path

    from calib.bundle.io import read_bundle
    from calib.fit import collective_points

    root = Path(__file__).resolve().parents[1] / "traces" / "h200"
    if not (root / "collectives-2gpu-kernel").is_dir():
        pytest.skip("no kernel-timed collectives bundle")
    micro, _ = collective_points([read_bundle(root / "collectives-2gpu-kernel"), read_bundle(root / "collectives-2gpu-smoke")])
    assert set(micro.loc[micro["bundle"] == "collectives-2gpu-kernel", "events"]) == {False}
    assert set(micro.loc[micro["bundle"] == "collectives-2gpu-smoke", "events"]) == {True}
    ar = micro[(micro["kind"] == "allreduce") & (micro["group_size"] == 2)]
    ser = Series.fit("intra", "allreduce", 2, ar["bytes"].to_numpy(float), ar["time_s"].to_numpy(float),
                     bench=ar["events"].to_numpy(bool))
    assert ser.has_trace and 0 < ser.alpha_s < 15e-6 and ser.alpha_bench_s > 30e-6


def test_loop_timed_points_are_the_longer_of_launch_interval_and_kernel() -> None:
    """A loop of back-to-back calls between two events times max(launch interval, kernel) per call:
    fitted so, the loop's points leave the kernel curve as the kernel-timed points alone give it, and
    an additive latency of their own (the event-timed form) would miss the loop's middle sizes."""
    kernel = allreduce_time(SIZES, 2)
    floor = 45e-6
    looped = np.maximum(floor, kernel)
    s = np.concatenate([SIZES, SIZES])
    t = np.concatenate([kernel, looped])
    events = np.concatenate([np.zeros(len(SIZES), bool), np.ones(len(SIZES), bool)])
    ser = Series.fit("intra", "allreduce", 2, s, t, bench=events, loop=events)
    assert ser.alpha_loop_s == pytest.approx(floor, rel=1e-6)
    assert ser.alpha_s == pytest.approx(30e-6, rel=1e-3)
    assert np.abs(ser.predict(SIZES, loop=True) / looped - 1).max() < 1e-3
    assert np.abs(ser.predict(SIZES) / kernel - 1).max() < 1e-3
    again = Series.from_dict(ser.to_dict())
    assert again.alpha_loop_s == ser.alpha_loop_s and ser.loop_gap_s == 0.0
    additive = Series.fit("intra", "allreduce", 2, s, t, bench=events)
    assert np.abs(additive.predict(SIZES, bench=True) / looped - 1).max() > 0.05
    # Without kernel-timed sizes enough for a curve of their own, loop points count as event-timed.
    few = Series.fit("intra", "allreduce", 2, np.concatenate([SIZES[:2], SIZES]), np.concatenate([kernel[:2], looped]),
                     bench=np.r_[False, False, np.ones(len(SIZES), bool)], loop=np.r_[False, False, np.ones(len(SIZES), bool)])
    assert np.isnan(few.alpha_loop_s)


def test_a_loops_gap_between_kernels_is_fitted() -> None:
    """Back-to-back kernels of a loop leave a gap between them: per call max(launch interval, kernel +
    gap). Fitted, the gap and the interval come back, the kernel curve stays the kernel-timed points', and
    a calibration file without the gap (written before it) loads with none."""
    kernel = allreduce_time(SIZES, 2)
    looped = np.maximum(45e-6, kernel + 6e-6)
    s, t = np.concatenate([SIZES, SIZES]), np.concatenate([kernel, looped])
    events = np.concatenate([np.zeros(len(SIZES), bool), np.ones(len(SIZES), bool)])
    ser = Series.fit("intra", "allreduce", 2, s, t, bench=events, loop=events)
    assert ser.loop_gap_s == pytest.approx(6e-6, rel=1e-3) and ser.alpha_loop_s == pytest.approx(45e-6, rel=1e-6)
    assert np.abs(ser.predict(SIZES, loop=True) / looped - 1).max() < 1e-3
    assert np.abs(ser.predict(SIZES) / kernel - 1).max() < 1e-3
    assert Series.from_dict(ser.to_dict()).loop_gap_s == ser.loop_gap_s
    old = {k: v for k, v in ser.to_dict().items() if k != "loop_gap_s"}
    assert Series.from_dict(old).loop_gap_s == 0.0


def _stepped_time(s: np.ndarray) -> np.ndarray:
    """The pipeline form with a protocol switch: 40 % slower from 2 MiB (exclusive) up to 8 MiB."""
    return _pipeline_time(s, 2) * np.where((s > 2**21) & (s <= 2**23), 1.4, 1.0)


def test_bends_follow_a_step_where_sizes_are_dense() -> None:
    dense = 2 ** 20 * 2.0 ** (np.arange(0, 33) / 4)  # 1 MiB .. 256 MiB, four per doubling
    held = dense[1::2]
    ser = Series.fit("intra", "allreduce", 2, dense[::2], _stepped_time(dense[::2]))
    inside = (held > 2**21 * BEND_MAX_GAP) & (held < 2**23)  # off the step's two edges
    rel = np.abs(ser.predict(held) / _stepped_time(held) - 1)
    smooth = Series.fit("intra", "allreduce", 2, SIZES, _stepped_time(SIZES))  # factors of 2: no bends
    assert not smooth.bends.knots and ser.bends.knots
    assert rel[inside].max() < 0.03
    assert rel[inside].max() < 0.5 * np.abs(smooth.predict(held[inside]) / _stepped_time(held[inside]) - 1).max()


def test_bends_need_two_microbenchmark_sizes_in_a_dense_run() -> None:
    bench = SIZES  # factors of 2
    train = 2**23 * np.array([1.01, 1.05, 1.1, 1.2])  # a cluster of training sizes beside 8 MiB
    s = np.concatenate([bench, train])
    t = np.concatenate([_pipeline_time(bench, 2), 1.3 * _pipeline_time(train, 2)])
    ser = Series.fit("intra", "allreduce", 2, s, t, micro=np.r_[np.ones(len(bench), bool), np.zeros(len(train), bool)])
    assert not ser.bends.knots


def test_bends_round_trip_and_stay_with_their_group_size() -> None:
    dense = 2 ** 20 * 2.0 ** (np.arange(0, 33) / 4)
    m = CollectiveModel()
    m.series[m.key("intra", "allreduce", 2)] = Series.fit("intra", "allreduce", 2, dense, _stepped_time(dense))
    again = CollectiveModel.from_dict(m.to_dict())
    mid = np.array([2**22 * 1.1])
    assert again.predict("allreduce", 2, mid) == pytest.approx(m.predict("allreduce", 2, mid), rel=1e-12)
    s = m.series["intra/allreduce/2"]
    assert np.allclose(Bends.from_dict(s.bends.to_dict())(np.log10(dense)), s.bends(np.log10(dense)))
    # A group of 4 borrows the 2-GPU series' smooth form (busbw held), not its bends.
    smooth4 = s.predict(mid, group_size=4) / np.exp(s.residual(np.log10(mid)))
    assert m.predict("allreduce", 4, mid) == pytest.approx(float(smooth4[0]), rel=1e-12)


def test_an_event_timed_call_carries_the_kernel_bend_on_its_launch_floor() -> None:
    dense = 2 ** 20 * 2.0 ** (np.arange(0, 33) / 4)
    t = _stepped_time(dense)
    s = np.concatenate([dense, dense])
    ev = np.r_[np.zeros(len(dense), bool), np.ones(len(dense), bool)]
    ser = Series.fit("intra", "allreduce", 2, s, np.concatenate([t, t + 40e-6]), bench=ev)
    mid = np.array([2**22 * 1.1])
    assert ser.predict(mid, bench=True) - ser.predict(mid) == pytest.approx(ser.alpha_bench_s - ser.alpha_s, rel=1e-9)


def test_bent_times_never_fall_as_messages_grow() -> None:
    """Sizes that took one of two times (send/recv on 2 x H200: 8.1 or 10.3 us at 1 MiB) bend the curve up and
    down; a larger message is still never predicted faster than a smaller one (to 0.05 %, between profile points)."""
    dense = 2 ** 18 * 2.0 ** (np.arange(0, 41) / 4)
    t = _pipeline_time(dense, 2) * np.where(np.arange(len(dense)) % 3 == 1, 1.35, 1.0)
    ser = Series.fit("intra", "sendrecv", 2, dense, t)
    assert ser.bends.knots
    grid = 2 ** 16 * 2.0 ** (np.arange(0, 1000) / 60)
    p = ser.predict(grid)
    assert np.all(np.diff(p) / p[:-1] > -2e-4)
    raw = ser._smooth(grid, 2, ser.alpha_s) * np.exp(ser.bends(np.log10(grid)))
    assert np.any(np.diff(raw) < 0)  # the bends alone would fall


def test_slow_training_sizes_pool_with_a_faster_microbenchmark_above_them() -> None:
    """MoE all-to-alls of 8.4-9.5 MiB took 26-28 us in training on 2 x H200, the 9.5 MiB microbenchmark 22 us: the
    knots' times are made non-decreasing by pooling the two, not by lowering the training sizes to the faster one."""
    bench = 2 ** 20 * 2.0 ** (np.arange(0, 25) / 4)  # 1 .. 64 MiB, four per doubling
    train = 2**23 * np.array([1.02, 1.04, 1.06, 1.08, 1.1])  # between the 8 and 9.5 MiB microbenchmarks
    s = np.concatenate([bench, train])
    t = np.concatenate([_pipeline_time(bench, 2), 1.3 * _pipeline_time(train, 2)])
    micro = np.r_[np.ones(len(bench), bool), np.zeros(len(train), bool)]
    ser = Series.fit("intra", "alltoall", 2, s, t, micro=micro)
    ratio = ser.predict(train) / _pipeline_time(train, 2)
    assert np.all(ratio > 1.15) and np.all(ratio < 1.3)
    medians = Series.fit("intra", "alltoall", 2, s, t, micro=micro)
    medians.bends = Bends.fit(s, np.log(t), np.log(medians._smooth(s, 2, medians.alpha_s)), micro, monotone=False)
    above = bench[bench > train.max()][0]
    assert np.all(medians.predict(train) <= 1.01 * _pipeline_time(above, 2))  # the envelope alone: the faster one's


def test_training_all_to_alls_set_their_own_bends() -> None:
    """The MoE steps' 4-GPU all-to-alls of 33-77 MiB ran 10-20 % faster than the isolated call at those sizes
    (traces/README.md, round 41): beside a training size, its own time bends an all-to-all's curve, not the
    microbenchmark's; other kinds keep the microbenchmark sizes."""
    bench = 2 ** 20 * 2.0 ** (np.arange(0, 33) / 4)  # 1 .. 256 MiB, four per doubling
    train = 2**25 * np.array([1.02, 1.04, 2.1, 2.3])
    s = np.concatenate([bench, train])
    t = np.concatenate([_pipeline_time(bench, 2), 0.8 * _pipeline_time(train, 2)])
    micro = np.r_[np.ones(len(bench), bool), np.zeros(len(train), bool)]
    a2a = Series.fit("intra", "alltoall", 2, s, t, micro=micro)
    ar = Series.fit("intra", "allreduce", 2, s, t, micro=micro)
    own = np.abs(a2a.predict(train) / (0.8 * _pipeline_time(train, 2)) - 1)
    pooled = np.abs(ar.predict(train) / (0.8 * _pipeline_time(train, 2)) - 1)
    assert own.max() < 0.03 and pooled.max() > 0.05
