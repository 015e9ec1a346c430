"""Collective algorithms against the closed forms of ../shared/reference/astra-sim.md, on
synthetic networks (not measurements: the formulas are the known function)."""

from __future__ import annotations

import math

import pytest

from calib.errors import CalibError
from calib.sim.collectives import A2A, AG, AR, RS, CollectiveTimer, chunking, plan_collective
from calib.sim.config import Dim, NetworkConfig, SystemConfig
from calib.sim.network import MultiDimTopology


def _timer(dims, **kw) -> CollectiveTimer:
    system = SystemConfig(**kw)
    return CollectiveTimer(MultiDimTopology(NetworkConfig(tuple(dims))), system)


def _T(dim: Dim, m: int, hops: int) -> int:
    return int(hops * dim.latency_ns + m / (dim.bandwidth_gbps * 2**30 / 1e9))


@pytest.mark.parametrize("n,topo,hops", [(8, "Ring", 1), (6, "FullyConnected", 1), (16, "Switch", 2)])
def test_ring_closed_forms(n, topo, hops):
    d = Dim(topo, n, 80.0, 700.0)
    E, L = 37, 900.0
    tm = _timer([d], endpoint_delay_ns=E, local_mem_bw_gbps=L)
    S = 3_000_000
    C = S  # one split
    P = 3 * int((C // n) // L)
    T = _T(d, C // n, hops)
    world = list(range(n))
    assert tm.finish_times(AR, S, world, [0] * n) == [2 * (n - 1) * (T + E) + E + (n - 1) * P] * n
    assert tm.finish_times(RS, S, world, [0] * n) == [(n - 1) * (T + E) + E + (n - 1) * P] * n
    assert tm.finish_times(AG, S, world, [5] * n) == [5 + (n - 1) * (_T(d, S, hops) + E) + E] * n
    assert tm.finish_times(A2A, S, world, [0] * n) == [n * (n - 1) // 2 * (T + E) + E] * n


def test_direct_on_ring_costs_the_farthest_peer():
    d = Dim("Ring", 10, 25.0, 300.0)
    # a fast reduction (P + E below one hop's latency): every step waits for the farthest peer
    tm = _timer([d], all_reduce_impl=["direct"], all_to_all_impl=["direct"], local_mem_bw_gbps=5000.0)
    S = 1 << 20
    T = _T(d, S // 10, 5)
    P = 3 * int((S // 10) // 5000.0)
    world = list(range(10))
    assert tm.finish_times(AR, S, world, [0] * 10)[0] == 2 * (T + 10) + 10 + P
    assert tm.finish_times(A2A, S, world, [0] * 10)[0] == T + 20


def test_halving_doubling_closed_form():
    d = Dim("FullyConnected", 16, 100.0, 250.0)
    tm = _timer([d], all_reduce_impl=["halvingDoubling"], local_mem_bw_gbps=1600.0)
    C, E, k = 1 << 20, 10, 4
    want = E + 2 * sum(_T(d, C >> i, 1) + E for i in range(1, k + 1)) + sum(3 * int((C >> i) // 1600.0) for i in range(2, k + 1))
    assert tm.finish_times(AR, C, list(range(16)), [0] * 16) == [want] * 16


def test_chunking_and_plans():
    sysc = SystemConfig(preferred_dataset_splits=4)
    assert chunking(AR, 1000, 32, sysc) == (250, 4)
    assert chunking(AR, 64, 32, sysc) == (32, 4)  # chunk floor: the cluster's rank count, splits chunks
    assert chunking(AG, 64, 32, sysc) == (16, 4)  # ... but not for all-gather
    topo = MultiDimTopology(NetworkConfig((Dim("Switch", 8, 1.0, 1.0), Dim("Switch", 1, 1.0, 1.0), Dim("Ring", 4, 1.0, 1.0))))
    plan = plan_collective(AR, 4096, list(range(32)), topo, SystemConfig(all_reduce_impl=["ring"] * 3, reduce_scatter_impl=["ring"] * 3, all_gather_impl=["ring"] * 3))
    assert [(p.kind, p.dim, p.size) for p in plan.phases] == [(RS, 0, 4096), (AR, 2, 512), (AG, 0, 512)]
    base = plan_collective(AR, 4096, list(range(32)), topo, SystemConfig(collective_optimization="baseline", all_reduce_impl=["ring"] * 3))
    assert [(p.kind, p.dim, p.size) for p in base.phases] == [(AR, 0, 4096), (AR, 2, 4096)]
    ag = plan_collective(AG, 100, list(range(32)), topo, SystemConfig(all_gather_impl=["ring"] * 3))
    assert [(p.kind, p.dim, p.size) for p in ag.phases] == [(AG, 2, 100), (AG, 0, 400)]
    group = plan_collective(AR, 4096, [0, 8, 16], topo, SystemConfig(endpoint_delay_ns=99))
    assert group.endpoint_ns == 10 and [p.dim for p in group.phases] == [-1]


def test_active_chunks_pipeline_two_dims():
    """s chunks through RS(dim0) -> AR(dim1) -> AG(dim0): dim 0 serves both ends, one chunk at a time."""
    dims = [Dim("Switch", 4, 200.0, 100.0), Dim("Switch", 2, 20.0, 1000.0)]
    one = _timer(dims, preferred_dataset_splits=1, all_reduce_impl=["ring", "ring"], reduce_scatter_impl=["ring", "ring"], all_gather_impl=["ring", "ring"])
    pipe = _timer(dims, preferred_dataset_splits=4, active_chunks_per_dimension=1, all_reduce_impl=["ring", "ring"], reduce_scatter_impl=["ring", "ring"], all_gather_impl=["ring", "ring"])
    wide = _timer(dims, preferred_dataset_splits=4, active_chunks_per_dimension=4, all_reduce_impl=["ring", "ring"], reduce_scatter_impl=["ring", "ring"], all_gather_impl=["ring", "ring"])
    world = list(range(8))
    S = 1 << 24
    t1 = one.finish_times(AR, S, world, [0] * 8)[0]
    t4 = pipe.finish_times(AR, S, world, [0] * 8)[0]
    tw = wide.finish_times(AR, S, world, [0] * 8)[0]
    assert tw < t4 < t1  # pipelining hides dimension 1 behind dimension 0, more so with more slots


def test_straggler_delays_the_ring_by_position():
    """Ring all-reduce with one late rank: ranks finish one message time apart, in ring order from the
    straggler's predecessor (as ASTRA-sim's per-rank ring does; reference case chain_comp_allreduce_comp_ring8)."""
    d = Dim("Ring", 8, 50.0, 500.0)
    tm = _timer([d], local_mem_bw_gbps=1600.0)
    starts = [40_000] * 8
    starts[3] = 400_000
    fin = tm.finish_times(AR, 8 << 20, list(range(8)), starts)
    T = _T(d, 1 << 20, 1)
    order = [2, 3, 4, 5, 6, 7, 0, 1]
    assert [fin[b] - fin[a] for a, b in zip(order, order[1:], strict=False)] == [T] * 7
    assert min(fin) > 400_000


def test_double_binary_tree_roles():
    d = Dim("FullyConnected", 8, 100.0, 250.0)
    tm = _timer([d], all_reduce_impl=["doubleBinaryTree"], local_mem_bw_gbps=1600.0)
    fin = tm.finish_times(AR, 1 << 20, list(range(8)), [0] * 8)
    T, E, P = _T(d, 1 << 20, 1), 10, 3 * int((1 << 20) // 1600.0)
    root = 3 * (T + E + P) + E  # three levels of reduction up to rank 7
    assert fin[7] == root
    assert fin[3] == root + T + E + P
    assert fin[0] == fin[2] == fin[4] == fin[6] == root + 2 * (T + E + P) + (T + E)  # inner nodes reduce on the way down too; leaves do not


def test_halving_doubling_needs_power_of_two_and_tree_phases_keep_their_size():
    d = Dim("Switch", 6, 1.0, 1.0)
    with pytest.raises(CalibError, match="halvingDoubling needs a power-of-two"):
        _timer([d], all_reduce_impl=["halvingDoubling"]).finish_times(AR, 1 << 20, list(range(6)), [0] * 6)
    with pytest.raises(CalibError, match="halvingDoubling has no all-to-all"):
        _timer([d.__class__("Switch", 4, 1.0, 1.0)], all_to_all_impl=["halvingDoubling"]).finish_times(A2A, 1 << 20, list(range(4)), [0] * 4)
    assert math.isfinite(_timer([d]).finish_times(AR, 1 << 20, list(range(6)), [0] * 6)[0])
    # A tree on dimension 0 of an all-reduce is a whole all-reduce there (ASTRA-sim's
    # DoubleBinaryTreeAllReduce), so the last dimension sees the full chunk.
    topo = MultiDimTopology(NetworkConfig((Dim("Switch", 4, 1.0, 1.0), Dim("Switch", 2, 1.0, 1.0))))
    plan = plan_collective(AR, 4096, list(range(8)), topo, SystemConfig(all_reduce_impl=["doubleBinaryTree", "ring"]))
    assert [(p.impl, p.size) for p in plan.phases] == [("doubleBinaryTree", 4096), ("ring", 4096), ("doubleBinaryTree", 4096)]


@pytest.mark.parametrize(
    "dims,kind,impl,splits,active,members",
    [
        ([Dim("Switch", 4, 200.0, 300.0), Dim("Ring", 4, 30.0, 900.0)], AR, "ring", 4, 2, None),
        ([Dim("FullyConnected", 4, 200.0, 300.0), Dim("Switch", 4, 30.0, 900.0)], AG, "ring", 2, 1, None),
        ([Dim("Switch", 4, 200.0, 300.0), Dim("Switch", 4, 30.0, 900.0)], A2A, "direct", 2, 1, None),
        ([Dim("Ring", 8, 100.0, 250.0), Dim("Switch", 2, 30.0, 900.0)], AR, "halvingDoubling", 2, 1, None),
        ([Dim("Switch", 4, 200.0, 300.0), Dim("Switch", 4, 30.0, 900.0)], AR, "doubleBinaryTree", 3, 1, None),
        ([Dim("Switch", 4, 200.0, 300.0), Dim("Switch", 4, 30.0, 900.0)], RS, "ring", 3, 1, [0, 1, 5, 6, 10, 15]),
        ([Dim("Switch", 4, 200.0, 300.0), Dim("Switch", 4, 30.0, 900.0)], RS, "direct", 1, 1, [0, 5, 10, 12]),
    ],
)
def test_line_engine_matches_message_engine_with_stragglers(dims, kind, impl, splits, active, members):
    """The fast line-at-a-time engine against the message-by-message reference engine, with random starts."""
    import random

    n = math.prod(d.npus for d in dims)
    lists = {f"{k}_impl": [impl if k == "all_reduce" or impl != "doubleBinaryTree" else "ring"] * len(dims)
             for k in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")}
    tm = _timer(dims, preferred_dataset_splits=splits, active_chunks_per_dimension=active, local_mem_bw_gbps=700.0, **lists)
    members = members or list(range(n))
    rng = random.Random(len(members) * splits)
    for _ in range(3):
        starts = [rng.choice([0, 0, rng.randint(0, 60_000)]) for _ in members]
        plan = plan_collective(kind, 3 << 20, members, tm.topo, tm.system)
        assert tm._run_lines(plan, members, starts) == tm._run(plan, members, starts)


def test_direct_allreduce_on_ring_with_slow_reduction_starts_all_gather_early():
    """Ring 4, direct: pieces from the two neighbours (1 hop) arrive before the opposite rank's (2 hops);
    when reducing a piece takes longer than the extra hop, the neighbours' finished reductions release
    the all-gather before the far piece is reduced: T1 + T2 + 3E + P instead of 2(T2 + E) + E + P
    (ASTRA-sim's AllToAll algorithm frees one send per finished reduction once all pieces are in)."""
    d = Dim("Ring", 4, 360.0, 2000.0)
    S, E = 3_000_000, 10
    T1, T2 = _T(d, S // 4, 1), _T(d, S // 4, 2)
    for lmb, P in ((1600.0, 3 * int((S // 4) // 1600.0)), (400.0, 3 * int((S // 4) // 400.0))):
        tm = _timer([d], all_reduce_impl=["direct"], local_mem_bw_gbps=lmb)
        got = tm.finish_times(AR, S, list(range(4)), [0] * 4)
        want = T1 + T2 + 3 * E + P if P + E >= T2 - T1 else 2 * (T2 + E) + E + P
        assert got == [want] * 4
