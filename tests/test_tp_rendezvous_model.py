"""The TP rendezvous (calib.workload.host): marked collectives, what the simulators make of it, its fit."""

from __future__ import annotations

import numpy as np
import pytest

from calib.chakra.model import Attr, CommType, ExecutionTrace, Node, NodeType
from calib.errors import CalibError
from calib.models.host import RENDEZVOUS_MAX_S, HostModel, best_rendezvous, fit_runs
from calib.models.host import _Run as Run
from calib.sim import Dim, NetworkConfig, SystemConfig, simulate
from calib.sim.astrasim import with_rendezvous_nodes
from calib.sim.types import SimWorkload
from calib.workload.generate import Relaunchable, generate
from calib.workload.host import RENDEZVOUS, RENDEZVOUS_NS, mark_tp_collectives, set_rendezvous, tp_groups
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig

NET2 = NetworkConfig((Dim("Switch", 2, 100.0, 1000.0),))
SYS = SystemConfig()


def _comp(i: int, ns: int, deps: list[int]) -> Node:
    return Node(i, f"c{i}", NodeType.COMP_NODE, data_deps=deps,
                attrs=[Attr("is_cpu_op", False), Attr("duration_ns", ns, "uint64_val")])


def _coll(i: int, deps: list[int], pg: str = "7", rendezvous_ns: int | None = None) -> Node:
    attrs = [Attr("is_cpu_op", False), Attr("comm_type", int(CommType.ALL_REDUCE)), Attr("comm_size", 1 << 20),
             Attr("pg_name", pg)]
    if rendezvous_ns is not None:
        attrs += [Attr(RENDEZVOUS, True, "bool_val"), Attr(RENDEZVOUS_NS, rendezvous_ns, "uint64_val")]
    return Node(i, f"x{i}", NodeType.COMM_COLL_NODE, data_deps=deps, attrs=attrs)


def _blocking(rendezvous_ns: int | None) -> SimWorkload:
    """compute -> blocking all-reduce -> compute, on both ranks of one TP group."""
    def nodes() -> list[Node]:
        return [_comp(0, 10_000, []), _coll(1, [0], rendezvous_ns=rendezvous_ns), _comp(2, 10_000, [1])]
    return SimWorkload.per_rank({r: ExecutionTrace(nodes=nodes()) for r in (0, 1)}, {7: [0, 1]})


def test_the_simulator_holds_a_collective_its_rendezvous_longer() -> None:
    bare = simulate(_blocking(None), NET2, SYS).finish_ns
    held = simulate(_blocking(25_000), NET2, SYS).finish_ns
    assert [h - b for h, b in zip(held, bare, strict=True)] == [25_000, 25_000]
    # One rank class standing for both (a group inside the class) gives the same.
    one = SimWorkload.per_rank({0: ExecutionTrace(nodes=_blocking(25_000).trace_of(0).nodes)}, {7: [0]})
    assert simulate(one, NetworkConfig((Dim("Switch", 1, 100.0, 1000.0),)), SYS).finish_ns[0] - 25_000 == \
        simulate(SimWorkload.per_rank({0: ExecutionTrace(nodes=_blocking(None).trace_of(0).nodes)}, {7: [0]}),
                 NetworkConfig((Dim("Switch", 1, 100.0, 1000.0),)), SYS).finish_ns[0]


def test_a_negative_rendezvous_is_refused() -> None:
    wl = _blocking(None)
    for r in (0, 1):
        wl.trace_of(r).nodes[1].attrs.append(Attr(RENDEZVOUS_NS, -5, "int64_val"))
    with pytest.raises(CalibError, match="negative rendezvous_ns"):
        simulate(wl, NET2, SYS)


def test_astra_sim_files_carry_it_as_a_gpu_node_with_the_same_step() -> None:
    trace = _blocking(25_000).trace_of(0)
    out = with_rendezvous_nodes(trace)
    extra = [n for n in out.nodes if n.name.startswith("rendezvous:")]
    assert len(extra) == 1 and extra[0].duration_ns == 25_000 and extra[0].data_deps == [1]
    assert not extra[0].is_cpu_op and extra[0].type == NodeType.COMP_NODE
    assert next(n for n in out.nodes if n.id == 2).data_deps == [extra[0].id]  # the consumer waits for it
    # The expanded traces without the attr simulate to the step the attr gives.
    plain = [Node(n.id, n.name, n.type, n.ctrl_deps, n.data_deps, 0, n.duration_micros, None, None,
                  [a for a in n.attrs if a.name != RENDEZVOUS_NS]) for n in out.nodes]
    expanded = SimWorkload.per_rank({r: ExecutionTrace(nodes=list(plain)) for r in (0, 1)}, {7: [0, 1]})
    assert simulate(expanded, NET2, SYS).finish_ns == simulate(_blocking(25_000), NET2, SYS).finish_ns


def test_a_trace_without_rendezvous_is_written_as_it_is() -> None:
    trace = _blocking(None).trace_of(0)
    assert with_rendezvous_nodes(trace) is trace


def _kernel_time(df):  # a synthetic kernel model: 1 us + FLOPs at 100 TFLOP/s
    return 1e-6 + df["flops"].to_numpy(dtype=float) / 1e14


def test_the_generator_marks_the_blocking_tp_collectives_only() -> None:
    model = resolve_model("llama3-8b@L2,S512")
    par = ParallelConfig(tp=2, dp=2, micro_batch=1, global_batch=4)
    step = generate(model, par, _kernel_time, HostModel(20e-6, 0.0, tp_rendezvous_s=40e-6))
    nodes = step.workload.classes[0].trace.nodes
    marked = [n for n in nodes if n.attr(RENDEZVOUS, False)]
    tp = {str(g) for g in step.groups["tp"]}
    colls = [n for n in nodes if n.type == NodeType.COMM_COLL_NODE]
    assert marked and all(str(n.attr("pg_name")) in tp for n in marked)
    assert all(n.attr(RENDEZVOUS_NS) == 40_000 for n in marked)
    # The data-parallel reductions and the backward's overlapped TP reductions are not marked.
    assert any(str(n.attr("pg_name")) not in tp for n in colls)
    assert len(marked) < sum(str(n.attr("pg_name")) in tp for n in colls)
    net = NetworkConfig((Dim("Switch", 4, 100.0, 1000.0),))
    without = simulate(generate(model, par, _kernel_time, HostModel(20e-6, 0.0)).workload, net, SYS).step_time_s
    with_it = simulate(step.workload, net, SYS).step_time_s
    assert without < with_it <= without + len(marked) * 40e-6 + 1e-9
    # No host model: no marks, the ETs as before.
    assert not any(n.attr(RENDEZVOUS) for n in generate(model, par, _kernel_time).workload.classes[0].trace.nodes)


def test_relaunchable_sets_the_rendezvous_it_is_asked_for() -> None:
    model = resolve_model("llama3-8b@L2,S512")
    par = ParallelConfig(tp=2, micro_batch=1, global_batch=2)
    rel = Relaunchable(model, par, _kernel_time)
    for rdv in (60e-6, 0.0, 15e-6):
        host = HostModel(20e-6, 0.0, tp_rendezvous_s=rdv)
        again = rel.at(host)
        assert [c.trace.nodes for c in again.classes] == \
            [c.trace.nodes for c in generate(model, par, _kernel_time, host).workload.classes]


def test_replays_mark_the_tensor_parallel_groups_only() -> None:
    assert tp_groups({1: [0, 1], 2: [2, 3], 3: [0, 2], 4: [1, 2], 5: [0, 1, 2, 3]}, 2) == {1, 2}
    assert tp_groups({1: [0, 1]}, 1) == set()
    wl = SimWorkload.per_rank({r: ExecutionTrace(nodes=[_comp(0, 1_000, []), _coll(1, [0], pg="1"),
                                                        _coll(2, [1], pg="3")]) for r in (0, 1)},
                              {1: [0, 1], 3: [0, 2]})
    assert mark_tp_collectives(wl, 2) == 2
    set_rendezvous(wl, 30e-6)
    assert [n.attr(RENDEZVOUS_NS) for n in wl.trace_of(0).nodes] == [None, 30_000, None]


def test_best_rendezvous_minimises_the_mape() -> None:
    base = np.array([1.0, 2.0, 1.5])
    slope = np.array([100.0, 200.0, 0.0])  # the third run shows no rendezvous (under host slack)
    measured = base + slope * 50e-6
    assert best_rendezvous(base, slope, measured) == pytest.approx(50e-6)
    assert best_rendezvous(base, slope, base - 0.01) == 0.0  # already long: none
    assert best_rendezvous(base[:1], slope[:1], base[:1] + 1.0) == RENDEZVOUS_MAX_S  # clipped
    assert best_rendezvous(base[:0], slope[:0], base[:0]) == 0.0


def _run(i: str, key: str, n: int, gpu: float, tp: int, calls: int, rdv: float = 45e-6, mb: int = 4) -> Run:
    def step(c: float, s: float, p: float, r: float = 0.0) -> float:
        return max(gpu, n * c) + calls * r
    return Run(i, key, step(30e-6, 0.0, 0.0, rdv if tp > 1 else 0.0), 0, step, tp=tp, microbatches=mb)


def test_fit_runs_recovers_a_planted_rendezvous_and_cross_validates_it() -> None:
    runs = [_run("a", "A", 4000, 0.1, 1, 0), _run("b", "B", 2000, 0.05, 1, 0),
            _run("c", "C", 3000, 0.2, 2, 300), _run("d", "D", 2500, 0.15, 2, 200, mb=8),
            _run("e", "E", 1000, 0.3, 4, 400), _run("f", "F", 500, 0.3, 1, 0, mb=16)]
    model, err = fit_runs(runs)
    assert model.launch_s == pytest.approx(30e-6, rel=0.01)
    assert model.tp_rendezvous_s == pytest.approx(45e-6, rel=0.01)
    assert err["count"] == 6 and err["max"] < 1.0
    assert model.tp_rendezvous_microbatches == 8  # the TP runs' most, not the one-GPU run's 16
    per = {r["id"]: r for r in model.runs}
    assert per["c"]["tp_rendezvous_s"] == pytest.approx(45e-6, rel=0.01) and per["a"]["tp_rendezvous_s"] is None
    assert "host.tp_rendezvous_s" in model.provenance and model.provenance["host.tp_rendezvous_s"].startswith("calibrated")
    # Without TP runs: not fitted, and said so.
    bare, _ = fit_runs(runs[:2])
    assert bare.tp_rendezvous_s is None and bare.provenance["host.tp_rendezvous_s"].startswith("not calibrated")
    assert bare.tp_rendezvous_microbatches is None


def test_the_host_section_round_trips_and_refuses_a_bad_rendezvous() -> None:
    model = HostModel(40e-6, 1e-4, tp_rendezvous_s=55e-6, replay_tp_rendezvous_s=33e-6, tp_rendezvous_microbatches=8)
    back = HostModel.from_dict(model.to_dict())
    assert back.tp_rendezvous_s == 55e-6 and back.replay_tp_rendezvous_s == 33e-6
    assert back.tp_rendezvous_microbatches == 8
    assert back.on_path(2, 1, 1).tp_rendezvous_s == 55e-6  # not scaled by the pace
    assert HostModel.from_dict({"launch_s": 1e-5}).tp_rendezvous_s is None
    with pytest.raises(CalibError, match="tp_rendezvous_s"):
        HostModel.from_dict({"launch_s": 1e-5, "tp_rendezvous_s": -1.0})
    with pytest.raises(CalibError, match="tp_rendezvous_microbatches"):
        HostModel.from_dict({"launch_s": 1e-5, "tp_rendezvous_microbatches": 0})
