"""CollectiveModel and the ASTRA-sim export on synthetic series from known functions."""

from __future__ import annotations

import numpy as np
import pytest
from fitdata import allreduce_time

from calib.errors import CalibError
from calib.models.network import (
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
