"""Host (CPU launch) model: the launch-chain construction, its exactness, the generator hook and the fit."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType
from calib.errors import CalibError
from calib.models.host import LAUNCH_MAX_S, PATH_WEIGHTS, Curves, HostModel, fit_runs, path_exponent, solve
from calib.models.host import _Run as Run
from calib.sim import simulate
from calib.sim.config import Dim, NetworkConfig, SystemConfig
from calib.sim.types import SimWorkload
from calib.workload.generate import generate
from calib.workload.host import (
    HOST_SYNC,
    LAUNCHES,
    SplitPoints,
    add_host,
    concat,
    count_host,
    count_p2p_syncs,
    host_recoster,
    set_host_costs,
    summarize,
)
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig


def _net(n: int) -> tuple[NetworkConfig, SystemConfig]:
    return NetworkConfig([Dim("Switch", n, 100.0, 1000.0)]), SystemConfig()


def _step(trace: ExecutionTrace) -> int:
    net, system = _net(1)
    return max(simulate(SimWorkload.per_rank({0: trace}), net, system).finish_ns)


def _gpu(nid: int, ns: int, launches: int = 1, sync: bool = False) -> Node:
    attrs = [Attr("is_cpu_op", False), Attr("duration_ns", ns, "uint64_val"), Attr(LAUNCHES, launches, "int64_val")]
    if sync:
        attrs.append(Attr(HOST_SYNC, True, "bool_val"))
    return Node(nid, f"k{nid}", NodeType.COMP_NODE, ctrl_deps=[nid - 1] if nid else [], attrs=attrs)


def _replay_kernels(kernels: list[int], c: int) -> int:
    """Kernels launched one by one, c ns apart, on one stream: when the last one ends."""
    gpu = 0
    for j, d in enumerate(kernels):
        gpu = max(gpu, (j + 1) * c) + d
    return gpu


def test_summary_of_fused_kernels_is_exact() -> None:
    rng = random.Random(3)
    for _ in range(200):
        c = rng.choice([1, 500, 2_000, 9_000])
        runs = [(rng.choice([100, 1_000, 5_000, 50_000]), rng.randint(1, 5)) for _ in range(rng.randint(1, 6))]
        flat = [d for d, r in runs for _ in range(r)]
        s = summarize(runs, c)
        assert s.n == len(flat) and s.total_ns == sum(flat)
        # Host and GPU both start at 0: the fused node ends at max(c + total, bound).
        assert max(c + s.total_ns, s.bound_ns(c)) == _replay_kernels(flat, c)
        # Two halves concatenated give the same summary bound as the whole.
        k = rng.randint(0, len(runs))
        both = concat(summarize(runs[:k], c), summarize(runs[k:], c), c)
        assert both.bound_ns(c) == s.bound_ns(c) and both.total_ns == s.total_ns


def test_split_points_of_many_nodes_are_the_summaries_folded_one_by_one() -> None:
    """SplitPoints (the host fit's split points of every fused node at once) gives, for any launch cost,
    the `at` and `tail_ns` that folding `concat` over each node's segments' `summarize` gives: ties, zero-time
    launches, empty runs and nodes without kernels included."""
    rng = random.Random(11)
    for _ in range(300):
        nodes = [[tuple((rng.choice([0, 1, 5, 10, 37, 1_000]), rng.choice([0, 1, 2, 3, 7])) for _ in range(rng.randint(0, 4)))
                  for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 5))]
        points = SplitPoints(nodes)
        for c in (0, 1, 5, 10, 11, 37, 999, 1_000_000):
            at, tail = points.at(c)
            for k, segments in enumerate(nodes):
                lx = summarize(list(segments[0]), c)
                for seg in segments[1:]:
                    lx = concat(lx, summarize(list(seg), c), c)
                assert (int(at[k]), int(tail[k])) == (lx.at, lx.tail_ns)


def test_split_node_simulates_like_its_kernels() -> None:
    c = 10_000
    kernels = [50_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 200_000]
    s = summarize([(d, 1) for d in kernels], c)
    node = _gpu(0, sum(kernels), len(kernels))
    node.attrs += [Attr("host_split_at", s.at, "int64_val"), Attr("host_split_ns", s.tail_ns, "int64_val")]
    traced = add_host(ExecutionTrace(nodes=[node]), c * 1e-9)
    assert _step(traced) == _replay_kernels(kernels, c)
    unsplit = add_host(ExecutionTrace(nodes=[_gpu(0, sum(kernels), len(kernels))]), c * 1e-9)
    assert _step(unsplit) < _replay_kernels(kernels, c)  # why the split exists


def test_launch_chain_structure_and_sync() -> None:
    trace = ExecutionTrace(nodes=[_gpu(0, 1_000, 3), _gpu(1, 1_000, sync=True), _gpu(2, 1_000)])
    out = add_host(trace, 5e-6, 100e-6)
    cpu = [n for n in out.nodes if n.is_cpu_op]
    gpu = [n for n in out.nodes if not n.is_cpu_op]
    assert [n.id for n in out.nodes] == list(range(len(out.nodes)))
    assert count_host(out) == (5, 1)
    for g in gpu:  # every GPU node waits for its launch
        assert any(out.by_id()[d].is_cpu_op for d in g.data_deps)
    after = [n for n in cpu if n.attr("host_after_sync")]
    assert len(after) == 1 and gpu[1].id in after[0].data_deps
    # 3 launches (15 us) + kernel... the sync: k1 ends, then 100 us + one launch, then k2 (1 us).
    step = _step(out)
    assert step == 5_000 * 4 + 1_000 + 100_000 + 5_000 + 1_000
    # Re-costing in place matches building at the new cost.
    set_host_costs(out, 1e-6, 0.0)
    assert _step(out) == _step(add_host(trace, 1e-6, 0.0))
    assert trace.nodes[0].id == 0 and len(trace.nodes) == 3  # the input is left alone


def test_forward_dependency_is_one_clear_error() -> None:
    a = _gpu(0, 1_000)
    a.data_deps = [1]
    with pytest.raises(CalibError, match="program order"):
        add_host(ExecutionTrace(nodes=[a, _gpu(1, 1_000)]), 1e-6)


def _kernel_time(df):  # a synthetic kernel model: 1 us + FLOPs at 100 TFLOP/s
    return 1e-6 + df["flops"].to_numpy(dtype=float) / 1e14


def test_generate_with_host() -> None:
    model = resolve_model("mixtral-8x7b@L2,S2048")
    par = ParallelConfig(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)
    net, system = _net(4)
    base = generate(model, par, _kernel_time)
    zero = generate(model, par, _kernel_time, HostModel(0.0, 0.0))
    assert not any(n.is_cpu_op for c in base.workload.classes for n in c.trace.nodes)
    t0 = simulate(base.workload, net, system).step_time_s
    # Free launches: only the syncs can cost anything (the host waits for a send before going on).
    assert t0 <= simulate(zero.workload, net, system).step_time_s <= 1.01 * t0
    assert zero.stage_compute_s == pytest.approx(base.stage_compute_s)
    launches, syncs = count_host(zero.workload.classes[0].trace)
    assert launches > 100 and syncs >= 2  # routing-count syncs and pipeline p2p syncs
    steps = [simulate(generate(model, par, _kernel_time, HostModel(c, 0.0)).workload, net, system).step_time_s
             for c in (0.0, 20e-6, 80e-6, 320e-6)]
    assert steps == sorted(steps) and steps[-1] > 1.5 * steps[0]
    with_sync = simulate(generate(model, par, _kernel_time, HostModel(20e-6, 1e-3)).workload, net, system).step_time_s
    assert with_sync > steps[1] + 1e-3  # at least one sync on the critical path
    mat = zero.materialize(3)  # other ranks get the launch nodes too
    assert sum(n.is_cpu_op for n in mat.nodes) == sum(n.is_cpu_op for n in zero.workload.classes[1].trace.nodes)


def test_solve_finds_the_crossing() -> None:
    f = lambda x: max(1.0, 5000.0 * x)  # noqa: E731 - GPU-bound until the host takes over
    assert solve(f, 2.0, 1e-3) == pytest.approx(4e-4, rel=3e-3)
    assert solve(f, 0.5, 1e-3) == 0.0  # already slower than measured
    assert solve(f, 100.0, 1e-3) == 1e-3  # clipped to the bracket


def _synthetic_run(i: str, key: str, n: int, gpu: float, syncs: int, p2p: int = 0) -> Run:
    def step(c: float, s: float, p: float) -> float:
        return max(gpu, n * c) + syncs * s + p2p * p
    return Run(i, key, step(30e-6, 2e-3, 1.5e-3), syncs, step, p2p)


def test_fit_runs_recovers_a_known_cost_and_cross_validates() -> None:
    run = _synthetic_run
    runs = [run("a", "A", 4000, 0.1, 0), run("a2", "A", 4000, 0.1, 0), run("b", "B", 2000, 0.05, 0),
            run("c", "C", 5000, 0.12, 4), run("d", "D", 3000, 0.08, 2)]
    model, err = fit_runs(runs)
    assert model.launch_s == pytest.approx(30e-6, rel=0.01)
    assert model.sync_s == pytest.approx(2e-3, rel=0.02)
    assert model.p2p_sync_s is None and model.p2p_sync == model.sync_s  # no pipeline run: the sync cost stands in
    assert err["count"] == 5 and err["mape"] < 2.0
    assert "calibrated" in model.provenance["host.launch_s"]
    assert "not calibrated" in model.provenance["host.p2p_sync_s"]
    back = HostModel.from_dict(model.to_dict())
    assert back.launch_s == model.launch_s and back.runs == model.runs


def test_fit_runs_without_cross_validation_fits_the_same_costs() -> None:
    run = _synthetic_run
    runs = [run("a", "A", 4000, 0.1, 0), run("b", "B", 2000, 0.05, 0), run("c", "C", 5000, 0.12, 4),
            run("d", "D", 3000, 0.08, 2)]
    full, err = fit_runs(runs)
    bare, none = fit_runs(runs, cross_validate=False)
    assert none == {} and err["count"] == 4
    assert (bare.launch_s, bare.sync_s) == (full.launch_s, full.sync_s)
    assert all(r["heldout_step_s"] is None for r in bare.runs)


@pytest.mark.parametrize(("name", "par"), [
    ("mixtral-8x7b@L2,S2048", ParallelConfig(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)),
    ("gpt3-1.3b@L4,S1024", ParallelConfig(tp=2, pp=2, dp=1, vpp=2, micro_batch=2, global_batch=8,
                                          sequence_parallel=True, distributed_optimizer=False)),
])
def test_a_relaunched_step_is_the_step_generated_at_that_launch_cost(name: str, par: ParallelConfig) -> None:
    """The host fit generates a run's step once and re-adds its host launches at every trial cost
    (Relaunchable, calib.models.host.prepare_run), re-costing a workload it built before where the split
    points are the same: node for node the step `generate` builds at those costs, in any order of costs,
    where the split points differ from one cost to the next."""
    from calib.workload.generate import Relaunchable

    model = resolve_model(name)
    rel = Relaunchable(model, par, _kernel_time)
    sizes, seen = set(), []
    for launch, sync in ((50e-6, 3e-4), (0.0, 3e-4), (2e-6, 1e-3), (0.6e-6, 3e-4), (50e-6, 1e-3), (51e-6, 2e-4),
                         (9e-6, 3e-4), (0.0, 5e-4)):
        host = HostModel(launch, sync, p2p_sync_s=8e-4 + sync)
        again = rel.at(host)
        fresh = generate(model, par, _kernel_time, host).workload
        assert [c.trace.nodes for c in again.classes] == [c.trace.nodes for c in fresh.classes]
        assert again.materialize(par.gpus - 1).nodes == fresh.materialize(par.gpus - 1).nodes
        # Simulated again after re-costing (the simulator keeps a fixed-structure workload's graphs): the
        # step of the freshly generated workload.
        net, system = _net(par.gpus)
        assert simulate(again, net, system).finish_ns == simulate(fresh, net, system).finish_ns
        sizes.add(sum(len(c.trace.nodes) for c in fresh.classes))
        seen.append(again)
    assert seen[4] is seen[0] and seen[5] is seen[0] and seen[7] is seen[1]  # re-costed, not built again
    assert seen[0].fixed_structure and len(seen[0].graphs) == par.pp  # its graphs kept from the first simulation
    assert len(sizes) > 1  # the launch costs moved split points: not one shape re-costed


def test_fit_runs_fits_the_pipeline_sync_cost_on_the_pipeline_runs() -> None:
    run = _synthetic_run
    runs = [run("a", "A", 4000, 0.1, 0), run("b", "B", 2000, 0.05, 0), run("c", "C", 5000, 0.12, 4),
            run("d", "D", 3000, 0.08, 2), run("p", "P", 3000, 0.05, 2, 8), run("q", "Q", 2500, 0.06, 2, 16)]
    model, err = fit_runs(runs)
    assert model.p2p_sync_s == pytest.approx(1.5e-3, rel=0.02)
    assert model.sync_s == pytest.approx(2e-3, rel=0.02)
    assert err["mape"] < 2.0
    assert {r["id"]: r["p2p_syncs"] for r in model.runs}["q"] == 16
    back = HostModel.from_dict(model.to_dict())
    assert back.p2p_sync_s == model.p2p_sync_s


def test_a_recosted_step_is_the_step_generated_at_those_costs() -> None:
    """The host fit re-costs a generated step at other sync costs instead of generating it again
    (calib.models.host.prepare_run): node for node, the same trace as generating it at those costs."""
    model = resolve_model("mixtral-8x7b@L2,S2048")
    par = ParallelConfig(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)
    gen = generate(model, par, _kernel_time, HostModel(30e-6, 1e-3, p2p_sync_s=2e-3))
    for c in gen.workload.classes:
        host_recoster(c.trace)(30e-6, 4e-4, 7e-4)
    fresh = generate(model, par, _kernel_time, HostModel(30e-6, 4e-4, p2p_sync_s=7e-4))

    def costs(g: object) -> list[list[tuple]]:
        return [[(n.id, n.name, n.duration_ns, n.duration_micros, n.ctrl_deps, n.data_deps) for n in c.trace.nodes]
                for c in g.workload.classes]

    assert costs(gen) == costs(fresh)
    assert costs(gen) != costs(generate(model, par, _kernel_time, HostModel(30e-6, 1e-3, p2p_sync_s=2e-3)))


def test_add_host_costs_syncs_after_sends_and_receives_apart() -> None:
    send = _gpu(1, 10_000, sync=True)
    send.type = NodeType.COMM_SEND_NODE
    trace = ExecutionTrace(nodes=[_gpu(0, 1_000), send, _gpu(2, 1_000), _gpu(3, 1_000, sync=True), _gpu(4, 1_000)])
    out = add_host(trace, 1e-6, 100e-6, p2p_sync_s=700e-6)
    after = {n.name: n.duration_ns for n in out.nodes if n.attr("host_after_sync")}
    assert after == {"launch:" + trace.nodes[2].name: 701_000, "launch:" + trace.nodes[4].name: 101_000}
    assert count_p2p_syncs(out) == 1 and count_host(out) == (5, 2)
    set_host_costs(out, 1e-6, 100e-6, 50e-6)
    assert {n.duration_ns for n in out.nodes if n.attr("host_after_p2p")} == {51_000}


def _counted(fn):  # a step function that counts its simulations
    def step(x: float) -> float:
        step.calls += 1  # type: ignore[attr-defined]
        return fn(x)
    step.calls = 0  # type: ignore[attr-defined]
    return step


def test_gpu_bound_runs_do_not_drag_the_cost_to_zero() -> None:
    # Three runs GPU-bound at zero cost (over-predicted by 5 %, knee at 100 us: any cost below fits them
    # alike) and two host-bound ones whose true cost is 50 us. The median of the roots would be 0.
    gpu = [lambda c: max(0.105, 1000 * c)] * 3
    host = [lambda c: 0.01 + 2000 * c, lambda c: 0.02 + 3000 * c]
    steps = [_counted(f) for f in gpu + host]
    measured = [0.1, 0.1, 0.1, 0.01 + 2000 * 50e-6, 0.02 + 3000 * 50e-6]
    curves = Curves(steps, measured, LAUNCH_MAX_S)
    cost = curves.fit()
    assert curves.roots[:3] == [0.0, 0.0, 0.0] and sorted(curves.roots)[2] == 0.0
    assert cost == pytest.approx(50e-6, rel=0.005)
    assert curves.roots[3] == pytest.approx(50e-6, rel=0.005)
    assert sum(s.calls for s in steps) <= 5 * 20  # a grid, a root search and a few refinements per run


def test_a_gpu_bound_run_holds_the_cost_where_it_starts_to_hurt() -> None:
    # Run a fits any cost up to its knee at 20 us and then grows 5e4 percent per second of cost; runs b and c
    # (root 60 us) lose 1.43e4 each: past 20 us a hurts more than b and c gain, so the best cost is the knee.
    a = lambda c: max(0.1, 5000 * c)  # noqa: E731
    b = lambda c: 0.01 + 1000 * c  # noqa: E731
    curves = Curves([a, b, b], [0.1, 0.07, 0.07], LAUNCH_MAX_S)
    assert curves.fit() == pytest.approx(20e-6, rel=0.005)
    assert curves.roots == pytest.approx([0.0, 60e-6, 60e-6], rel=0.005)
    # A lighter run a (knee at 50 us, 2e4 per second past it) gives way to b and c: the best cost is their root.
    light = Curves([lambda c: max(0.1, 2000 * c), b, b], [0.1, 0.07, 0.07], LAUNCH_MAX_S)
    assert light.fit() == pytest.approx(60e-6, rel=0.005)


def test_heldout_reuses_the_simulated_costs() -> None:
    # Four configurations; each held-out one gets the best cost over the others without a new simulation.
    fns = [lambda c, k=k: 0.01 * k + 1000 * k * c for k in (1, 2, 3, 4)]
    truth = [30e-6, 30e-6, 40e-6, 80e-6]
    steps = [_counted(f) for f in fns]
    curves = Curves(steps, [f(t) for f, t in zip(fns, truth, strict=True)], LAUNCH_MAX_S)
    curves.fit()
    before = [s.calls for s in steps]
    held = curves.heldout(["A", "B", "C", "D"])
    assert [s.calls for s in steps] == before
    # Leaving out D, the best cost for A, B, C is 30 us (two of three, and C weighs less than A and B
    # together); leaving out A or B, it is between 30 and 40 us: the weighted median of B/C or A/C.
    assert held[3] == pytest.approx(30e-6, rel=0.005)
    for i in (0, 1, 2):
        assert 30e-6 * 0.995 <= held[i] <= 40e-6 * 1.005
    assert curves.heldout(["A", "A", "A", "A"]) == {}  # one configuration: nothing to hold out


def test_all_gpu_bound_gives_zero_and_a_flat_tie_the_smallest_cost() -> None:
    curves = Curves([lambda c: max(0.2, 1000 * c), lambda c: max(0.3, 2000 * c)], [0.1, 0.2], LAUNCH_MAX_S)
    assert curves.fit() == 0.0 and curves.roots == [0.0, 0.0]
    # Host-bound runs never reaching their measured step inside the bracket: the bracket's end.
    slow = Curves([lambda c: 0.01 + c], [1.0], LAUNCH_MAX_S)
    assert slow.fit() == LAUNCH_MAX_S and slow.roots == [LAUNCH_MAX_S]


def test_mape_minimum_on_a_nonlinear_step() -> None:
    # Convex, smooth steps (not piecewise linear): the fitted cost's MAPE is within 0.05 points of the best
    # on a fine grid of true values.
    fns = [lambda c, a=a, g=g: max(g, a * c + 3e6 * c * c) for a, g in ((900, 0.05), (1500, 0.12), (700, 0.02),
                                                                       (2500, 0.3), (1100, 0.03))]
    measured = [0.06, 0.1, 0.05, 0.28, 0.09]
    curves = Curves(fns, measured, LAUNCH_MAX_S)
    cost = curves.fit()

    def true_mape(c: float) -> float:
        return 100 * float(np.mean([abs(f(c) - m) / m for f, m in zip(fns, measured, strict=True)]))

    fine = min(true_mape(c) for c in np.linspace(0, 2e-4, 20_001))
    assert true_mape(cost) <= fine + 0.05


def test_host_model_bad_input() -> None:
    with pytest.raises(CalibError, match="launch_s"):
        HostModel.from_dict({"sync_s": 1.0})
    with pytest.raises(CalibError, match=">= 0"):
        HostModel.from_dict({"launch_s": -1.0})
    with pytest.raises(CalibError, match="numbers"):
        HostModel.from_dict({"launch_s": "fast"})
    with pytest.raises(CalibError, match="no training bundles"):
        fit_runs([])


def test_converted_trace_gets_launches_and_syncs() -> None:
    from calib.workload.host import add_host_to_converted, converted_sync_points

    copy = Node(1, "Memcpy DtoH (Device -> Pinned)", NodeType.COMP_NODE, ctrl_deps=[0],
                attrs=[Attr("is_cpu_op", False), Attr("duration_ns", 2_000, "uint64_val")])
    nodes = [_gpu(0, 50_000), copy, _gpu(2, 1_000)]
    trace = ExecutionTrace(nodes=nodes)
    assert converted_sync_points(trace) == {1}
    out = add_host_to_converted(trace, 10e-6, 30e-6)
    assert count_host(out) == (3, 1)
    # k0 (launched at 10 us, 50 us), the copy (2 us), then the host: 30 us + one launch, k2 (1 us).
    assert _step(out) == 10_000 + 50_000 + 2_000 + 30_000 + 10_000 + 1_000
    assert [n.attr("duration_ns") for n in out.nodes if not n.is_cpu_op] == [50_000, 2_000, 1_000]


def test_a_scalar_read_waits_but_costs_no_sync_time() -> None:
    from calib.workload.host import add_host_to_converted, converted_reads, count_reads

    def copy(nid: int, aten: str) -> Node:
        return Node(nid, "Memcpy DtoH (Device -> Pinned)", NodeType.COMP_NODE, ctrl_deps=[nid - 1],
                    attrs=[Attr("is_cpu_op", False), Attr("duration_ns", 2_000, "uint64_val"), Attr("aten_op", aten)])

    # A routing copy (aten::copy_) then an optimizer norm read (.item(): aten::_local_scalar_dense).
    trace = ExecutionTrace(nodes=[_gpu(0, 50_000), copy(1, "aten::copy_"), _gpu(2, 1_000),
                                  copy(3, "aten::_local_scalar_dense"), _gpu(4, 1_000)])
    assert converted_reads(trace) == {3}
    out = add_host_to_converted(trace, 10e-6, 30e-6)
    assert count_host(out) == (5, 2) and count_reads(out) == 1
    # k0 (launched at 10 us, 50 us), copy (2 us): 62 us; 30 us of sync + k2's launch: 102, k2 (1 us);
    # the read's launch (102-112), the read (2 us), then only k4's launch (10 us) and k4 (1 us).
    assert _step(out) == 62_000 + 30_000 + 10_000 + 10_000 + 2_000 + 10_000 + 1_000
    set_host_costs(out, 10e-6, 90e-6)  # re-costing leaves the read free as well
    assert _step(out) == 62_000 + 90_000 + 10_000 + 10_000 + 2_000 + 10_000 + 1_000


def test_generated_reads_are_the_optimizer_norms() -> None:
    from calib.models.host import _host_work
    from calib.workload.host import HOST_READ, READ_SYNCS, count_reads

    model = resolve_model("mixtral-8x7b@L2,S2048")
    par = ParallelConfig(tp=1, pp=1, dp=1, ep=1, micro_batch=1, global_batch=2)
    gen = generate(model, par, _kernel_time, HostModel(20e-6, 1e-3))
    trace = gen.workload.classes[0].trace
    assert all(n.attr(HOST_SYNC, False) for n in trace.nodes if n.attr(HOST_READ, False))
    # One per kernel of the optimizer's norm reads (a fused node is named after its first op).
    reads = sum(k for op, k in gen.op_counts(0).items() if op.name in READ_SYNCS)
    launches, syncs = count_host(trace)
    (work,) = _host_work(gen.workload)
    assert reads > 0 and count_reads(trace) == reads and work == (launches, syncs - reads, 0)
    assert work[1] == gen.sync_points(0) - reads > 0  # the routing copies keep their sync cost
    # A dense model's syncs are all reads: its step does not depend on the sync cost.
    dense = resolve_model("llama3-8b@L2,S2048")
    net, system = _net(1)
    at = [simulate(generate(dense, par, _kernel_time, HostModel(20e-6, s)).workload, net, system).step_time_s
          for s in (0.0, 1e-3)]
    assert at[0] == at[1]


def test_generated_host_trace_is_valid_chakra() -> None:
    from calib.chakra.codec import decode, encode
    from calib.chakra.validate import problems

    model = resolve_model("mixtral-8x7b@L2,S2048")
    par = ParallelConfig(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)
    gen = generate(model, par, _kernel_time, HostModel(90e-6, 2e-4))
    for rank in range(par.gpus):
        trace = gen.materialize(rank)
        assert problems(trace) == []
        back = decode(encode(trace))
        assert [n.duration_micros for n in back.nodes] == [n.duration_micros for n in trace.nodes]
        assert sum(n.is_cpu_op for n in back.nodes) > 0


def test_replay_workload_gets_launches() -> None:
    from calib.workload.host import add_host_to_replay

    wl = SimWorkload.per_rank({0: ExecutionTrace(nodes=[_gpu(0, 5_000), _gpu(1, 5_000)])})
    out = add_host_to_replay(wl, 20e-6, 0.0)
    assert count_host(out.materialize(0)) == (2, 0)  # type: ignore[misc]
    assert _step(out.classes[0].trace) == 20_000 + 20_000 + 5_000
    assert _step(wl.classes[0].trace) == 10_000  # the input workload is unchanged


def test_fit_host_on_a_real_bundle() -> None:
    from conftest import TRACES

    from calib.bundle.io import read_bundle
    from calib.calibration import Calibration
    from calib.models.host import fit_host, prepare_run
    from calib.project import default_calibration_path

    bundle = read_bundle(TRACES / "h200" / "gpt175b-tp4")
    cal = Calibration.load(default_calibration_path("h200"))
    model, err = fit_host([bundle], cal.kernel_model(), cal)
    assert 0 < model.launch_s < 1e-3 and err["count"] == 0  # one configuration: nothing to hold out
    run = prepare_run(bundle, cal.kernel_model(), cal)
    assert run.step(model.launch_s, model.sync_s, model.p2p_sync) == pytest.approx(run.measured_s, rel=0.01)
    assert run.step(0.0, 0.0, 0.0) < run.measured_s  # the GPU-bound step underpredicts this run


def test_a_run_without_costed_syncs_is_simulated_once_per_launch_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense one-GPU run's syncs are scalar reads, which cost no sync time, and it has no pipeline syncs: its
    step does not depend on those costs, so the host fit's rounds, which try new sync costs at old launch costs,
    find it simulated already; a MoE run's routing syncs carry the sync cost and are simulated at each."""
    from conftest import TRACES

    import calib.sim
    from calib.bundle.io import read_bundle
    from calib.calibration import Calibration
    from calib.models.host import prepare_run
    from calib.project import default_calibration_path

    cal = Calibration.load(default_calibration_path("h200"))
    real = calib.sim.simulate
    calls: list[int] = []
    monkeypatch.setattr(calib.sim, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    dense = prepare_run(read_bundle(TRACES / "h200" / "gpt1.3b-1gpu-mbs4"), cal.kernel_model(), cal)
    assert dense.syncs == 0 and dense.p2p_syncs == 0
    steps = [dense.step(20e-6, s, p) for s, p in ((0.0, 0.0), (3e-4, 0.0), (1e-3, 2e-3))]
    assert len(set(steps)) == 1 and len(calls) == 1
    moe = prepare_run(read_bundle(TRACES / "h200" / "mixtral-1gpu"), cal.kernel_model(), cal)
    assert moe.syncs > 0
    calls.clear()
    slow = [moe.step(20e-6, s, 0.0) for s in (0.0, 3e-4, 1e-3)]
    assert len(calls) == 3 and slow[0] < slow[1] < slow[2]


def test_replay_recosting_equals_building_anew() -> None:
    from conftest import TRACES

    from calib.bundle.io import read_bundle
    from calib.calibration import Calibration
    from calib.models.clock import replay_exponent
    from calib.models.host import replay_run
    from calib.project import default_calibration_path
    from calib.validation import engine
    from calib.validation.replay import read_run_traces, replay_workload
    from calib.workload.host import add_host_to_replay, count_reads

    bundle = read_bundle(TRACES / "h200" / "gpt6.7b-pp2-mbs2")  # scalar reads and pipeline syncs
    cal = Calibration.load(default_calibration_path("h200"))
    run = replay_run(bundle, cal, 1e-4)
    network, system = engine.replay_network(bundle, cal)
    base = replay_workload(read_run_traces(bundle, replay_exponent(cal)))  # as replay_run reads it
    hosted = add_host_to_replay(base, 0.0, 0.0).classes[0].trace
    assert run.p2p_syncs > 0 and count_reads(hosted) > 0 and run.syncs == 0  # its reads cost no sync time
    # re-costed in place, down and up
    for c, s, p in ((60e-6, 1e-4, 1e-3), (0.0, 1e-4, 0.0), (30e-6, 3e-4, 2e-3), (30e-6, 0.0, 5e-4)):
        built = simulate(add_host_to_replay(base, c, s, p), network, system).step_time_s
        assert run.step(c, s, p) == built


def test_a_host_bound_run_bounds_the_shared_cost() -> None:
    # Three GPU-bound runs (knee at 60 us) under-predicted by 5 % pull the cost past their knee; the
    # MAPE is least at ~63 us. A host-bound run whose 2,000 launches took at most 0.09 s in all
    # bounds the cost at 45 us: above it that run's host alone would outlast its measured step.
    gpu = lambda c: max(0.1, 1667 * c) * 0.95  # noqa: E731
    host = lambda c: 2000 * c  # noqa: E731
    free = Curves([gpu, gpu, gpu], [0.1, 0.1, 0.1], LAUNCH_MAX_S)
    assert free.fit() > 60e-6
    run = Run("h", "H", 0.09, 0, lambda c, s, p: host(c), host_work=((2000, 0, 0),))
    assert run.cap(0) == pytest.approx(45e-6) and run.cap(1) == float("inf")
    bounded = Curves([gpu, gpu, gpu, host], [0.1, 0.1, 0.1, 0.09], LAUNCH_MAX_S,
                     [float("inf")] * 3 + [run.cap(0)])
    assert bounded.fit() == pytest.approx(45e-6, rel=1e-6)
    # Held out, the host-bound run's configuration is fitted without its bound (and without it).
    held = bounded.heldout(["G1", "G2", "G3", "H"])
    assert held[3] > 60e-6 and held[0] == pytest.approx(45e-6, rel=1e-6)


def _path_run(i: str, n: int, gpu: float, syncs: int, path: float) -> Run:
    pace = 1.3**path  # every host cost 30 % dearer per unit of parallel code path

    def step(c: float, s: float, p: float) -> float:
        return max(gpu, n * c) + syncs * s

    return Run(i, i.upper(), step(30e-6 * pace, 2e-3 * pace, 0.0), syncs, step, 0, ((n, syncs, 0),), path)


def test_a_fast_hosts_repeat_does_not_bound_the_cost() -> None:
    # One configuration run on three hosts: 2,000 launches in 0.09 s on the fast one, 0.12 s on two
    # others. The costs stand for every host, so the slowest run bounds them (60 us), not the fastest
    # (45 us), and the fit lands where two of the three runs are met.
    host = lambda c, s, p: 2000 * c  # noqa: E731
    runs = [Run(f"r{i}", "H", t, 0, host, host_work=((2000, 0, 0),)) for i, t in enumerate((0.09, 0.12, 0.12))]
    assert runs[0].cap(0) == pytest.approx(45e-6)  # alone, the fast run's own bound
    model, _ = fit_runs(runs, cross_validate=False)
    assert model.launch_s == pytest.approx(60e-6, rel=1e-3)


def test_fit_runs_recovers_the_pace_of_parallel_code_paths() -> None:
    run = _path_run
    runs = [run("a", 4000, 0.1, 2, 0), run("b", 3000, 0.05, 4, 0), run("c", 5000, 0.1, 2, 1),
            run("d", 2000, 0.02, 6, 1), run("e", 4000, 0.08, 3, 1), run("f", 3000, 0.06, 2, 2),
            run("g", 2500, 0.03, 5, 2)]
    model, err = fit_runs(runs)
    assert model.pace_per_path == pytest.approx(1.3, rel=0.02)
    assert model.launch_s == pytest.approx(30e-6, rel=0.03)  # kept on the one-GPU path
    assert model.sync_s == pytest.approx(2e-3, rel=0.1)
    assert model.fitted_paths == [0, 1, 2] and err["mape"] < 2.0
    assert "calibrated" in model.provenance["host.pace_per_path"]
    # Without the pace the same runs cannot all be met: one cost serves one code path.
    flat, flat_err = fit_runs([dataclasses.replace(r, path=0.0) for r in runs])
    assert flat.pace_per_path is None and flat_err["mape"] > 3 * err["mape"]
    assert "not calibrated" in flat.provenance["host.pace_per_path"]


def test_code_paths_follow_the_measured_weights_and_data_and_tensor_parallelism_add_none() -> None:
    # TP's own cost is the TP rendezvous, fitted per blocking collective (docs/host.md, "Tensor parallelism adds no pace").
    assert PATH_WEIGHTS == {"tp": 0.0, "pp": 1.5, "ep": 2.0}
    assert path_exponent(1, 1, 1) == 0.0 and path_exponent(2, 1, 1) == path_exponent(8, 1, 1) == 0.0
    assert path_exponent(1, 4, 1) == 1.5 and path_exponent(1, 1, 2) == 2.0 and path_exponent(2, 1, 2) == 2.0
    assert path_exponent(8, 16, 1) == 1.5 and path_exponent(2, 2, 2) == 3.5
    # The weights are arguments too: benchmarks/host_path_weights.py tries others.
    assert path_exponent(2, 1, 2, {"tp": 1.0, "ep": 2.0}) == 3.0


def test_host_costs_follow_the_pace_up_to_the_longest_fitted_path() -> None:
    model = HostModel(30e-6, 2e-3, 40e-6, p2p_sync_s=1e-3, replay_sync_s=3e-3, pace_per_path=1.5,
                      replay_pace_per_path=1.2, fitted_paths=[0.0, 1.5, 2.0])
    pp2 = model.on_path(1, 2, 1)
    pace = 1.5**1.5
    assert (pp2.launch_s, pp2.sync_s, pp2.p2p_sync) == pytest.approx((30e-6 * pace, 2e-3 * pace, 1e-3 * pace))
    assert (pp2.replay_launch_s, pp2.replay_sync) == pytest.approx((40e-6 * 1.2**1.5, 3e-3 * 1.2**1.5))
    assert pp2.pace_per_path is None and pp2.on_path(1, 1, 2).launch_s == pp2.launch_s  # applied once
    # TP takes no pace: a TP run costs what one GPU does, and TP with EP what EP does.
    assert model.on_path(2, 1, 1).launch_s == model.on_path(1, 1, 1).launch_s == 30e-6
    assert model.on_path(2, 1, 2).launch_s == model.on_path(1, 1, 2).launch_s == pytest.approx(67.5e-6)
    # EP 2 is at the longest fitted path; PP 2 with EP 2 goes past it and is held there.
    assert model.on_path(1, 2, 2).launch_s == pytest.approx(67.5e-6)
    assert model.beyond_fitted(1, 2, 2) and not model.beyond_fitted(2, 1, 2)
    back = HostModel.from_dict(model.to_dict())
    assert (back.pace_per_path, back.replay_pace_per_path, back.fitted_paths) == (1.5, 1.2, [0.0, 1.5, 2.0])
    assert HostModel.from_dict({"launch_s": 1e-5}).on_path(2, 2, 2).launch_s == 1e-5  # older files: no pace
    with pytest.raises(CalibError, match="pace_per_path 0.5 must be >= 1"):
        HostModel.from_dict({"launch_s": 1e-5, "pace_per_path": 0.5})
    with pytest.raises(CalibError, match="fitted_paths"):
        HostModel.from_dict({"launch_s": 1e-5, "fitted_paths": ["two"]})
    # A file whose pace was per GPUs on a host would be misread as per code path: refused.
    with pytest.raises(CalibError, match="pace_per_doubling .* older calib.*refit"):
        HostModel.from_dict({"launch_s": 1e-5, "pace_per_doubling": 1.3, "host_gpus": [1, 2]})
    with pytest.raises(CalibError, match="path_weights .* differ"):
        HostModel.from_dict(dict(model.to_dict(), path_weights={"tp": 1.0, "pp": 1.0, "ep": 1.0}))
    with pytest.raises(CalibError, match="path_weights .* differ"):  # fitted with TP's weight of before
        HostModel.from_dict(dict(model.to_dict(), path_weights={"tp": 1.0, "pp": 1.5, "ep": 2.0}))
    with pytest.raises(CalibError, match="path_weights .* differ"):  # a replay pace alone is read by them too
        HostModel.from_dict({"launch_s": 1e-5, "replay_pace_per_path": 1.2, "path_weights": {"tp": 2.0}})


def test_pace_held_where_the_bounds_leave_one_value() -> None:
    from calib.models.host import _PaceSearch

    # A run on a longer code path whose host has no room above the one-GPU costs pins the pace at 1.
    tight = Run("t", "T", 0.1, 0, lambda c, s, p: max(0.05, 2000 * c), host_work=((2000, 0, 0),), path=1.0)
    loose = Run("l", "L", 0.2, 0, lambda c, s, p: max(0.05, 2000 * c), host_work=((2000, 0, 0),), path=2.0)
    search = _PaceSearch([tight, loose], 0.0, (50e-6, 0.0, 0.0))
    assert search.fit() == 1.0 and search.heldout() == {"L": 1.0, "T": 1.0}


def _copy(nid: int, aten: str = "aten::copy_") -> Node:
    """A converted ET's device-to-host copy (a routing count, or with `aten` a scalar read)."""
    attrs = [Attr("is_cpu_op", False), Attr("duration_ns", 2_000, "uint64_val"), Attr("aten_op", aten, "string_val")]
    return Node(nid, "Memcpy DtoH (Device -> Pinned)", NodeType.COMP_NODE, attrs=attrs)


def test_a_routings_copies_are_one_wait_in_a_converted_et() -> None:
    """Copies within ROUTING_GROUP_NODES of each other with no collective between are one routing: the host
    waits once, for the last; copies farther apart, or across a collective, are routings of their own; the
    scalar reads each wait (megatron-core 0.19's alltoall dispatcher, docs/host.md "One wait per routing")."""
    from calib.workload.host import ROUTING_GROUP_NODES, converted_sync_points, routing_copy_groups

    nodes = [_gpu(0, 1_000), _copy(1), _gpu(2, 1_000), _copy(3), _copy(4), _gpu(5, 1_000)]
    nodes += [_gpu(6 + i, 1_000) for i in range(ROUTING_GROUP_NODES)]
    far = 6 + ROUTING_GROUP_NODES
    nodes += [_copy(far), _copy(far + 1)]
    coll = _gpu(far + 2, 5_000)
    coll.type = NodeType.COMM_COLL_NODE
    nodes += [coll, _copy(far + 3), _copy(far + 4, "aten::_local_scalar_dense"), _copy(far + 5, "aten::_local_scalar_dense"),
              _gpu(far + 6, 1_000)]
    for n in nodes:
        n.ctrl_deps = []
    assert routing_copy_groups(nodes) == [[1, 3, 4], [far, far + 1], [far + 3]]
    trace = ExecutionTrace(nodes=nodes)
    assert converted_sync_points(trace) == {4, far + 1, far + 3, far + 4, far + 5}
    # The host launches every copy but waits once per routing: the GPU idles for one sync cost there.
    out = add_host(trace, 1e-6, 100e-6, sync=converted_sync_points(trace))
    assert count_host(out) == (len(nodes), 5)


def test_the_expert_loops_forward_launches_cost_the_measured_weight_in_host_time_only() -> None:
    """Each forward launch of the MoE expert loop is charged EXPERT_LOOP_LAUNCHES launches of host time: the
    extra launches add host time and no GPU time (where the host is behind the GPU they delay it); a
    calibration records the weight its costs were fitted with, and one fitted with another is refused."""
    from types import SimpleNamespace
    from unittest import mock

    from calib.chakra.model import NodeType as NT
    from calib.workload import generate as G
    from calib.workload import ops as O
    from calib.workload.host import EXPERT_LOOP_LAUNCHES, EXPERT_LOOP_OPS
    from calib.workload.models import resolve_model
    from calib.workload.parallel import ParallelConfig

    model, par = resolve_model("mixtral-8x7b@L2,S256"), ParallelConfig(micro_batch=2, global_batch=4)
    loop = [o for o in O.layer_fwd(model, par) if isinstance(o, O.Op) and EXPERT_LOOP_OPS.fullmatch(o.name)]
    assert len(loop) == 6 * model.experts  # fc1, silu, silu.add, gate, scale, fc2 of every local expert
    routings = 2 * 2  # layers x micro-batches

    def flat(df):  # noqa: ANN001, ANN202 - a constant kernel time: the weight is the host's alone
        return np.full(len(df), 2e-6)

    out = {}
    for w in (1.0, EXPERT_LOOP_LAUNCHES):
        with mock.patch.object(G, "EXPERT_LOOP_LAUNCHES", w):
            for launch_s in (0.0, 20e-6):
                gen = G.generate(model, par, flat, SimpleNamespace(launch_s=launch_s, sync_s=0.0))
                trace = gen.workload.classes[0].trace
                gpu = sum(n.duration_ns for n in trace.nodes if n.type == NT.COMP_NODE and not n.is_cpu_op)
                cpu = sum(n.duration_ns for n in trace.nodes if n.is_cpu_op)
                out[w, launch_s] = (count_host(trace)[0], gpu, cpu)
    extra = out[EXPERT_LOOP_LAUNCHES, 0.0][0] - out[1.0, 0.0][0]
    assert extra == round((EXPERT_LOOP_LAUNCHES - 1) * len(loop) * routings)
    assert out[EXPERT_LOOP_LAUNCHES, 20e-6][1] == out[1.0, 20e-6][1]  # no GPU time added
    assert out[EXPERT_LOOP_LAUNCHES, 20e-6][2] - out[1.0, 20e-6][2] == extra * 20_000  # host time: extra launches
    host = HostModel(1e-5, 1e-3)
    assert host.to_dict()["expert_loop_launches"] == EXPERT_LOOP_LAUNCHES
    assert HostModel.from_dict(host.to_dict()).launch_s == 1e-5
    with pytest.raises(CalibError, match="expert_loop_launches 1.0 differs .* refit"):
        HostModel.from_dict(dict(host.to_dict(), expert_loop_launches=1.0))
