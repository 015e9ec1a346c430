"""Replay semantics, symmetry and bad input of the embedded simulator (calib.sim.analytical)."""

from __future__ import annotations

import json

import pytest

from calib.chakra.model import Attr, CommType, ExecutionTrace, Node, NodeType
from calib.errors import CalibError
from calib.sim import Dim, NetworkConfig, SystemConfig, simulate
from calib.sim.types import RankClass, SimWorkload

SW8 = NetworkConfig((Dim("Switch", 8, 360.0, 500.0),))
SW4x2 = NetworkConfig((Dim("Switch", 4, 360.0, 500.0), Dim("Switch", 2, 50.0, 2000.0)))
SYS = SystemConfig(local_mem_bw_gbps=1600.0)
# One implementation per dimension: a shorter list would leave dimension 1 out, as ASTRA-sim does.
SYS2 = SystemConfig(local_mem_bw_gbps=1600.0, **{f"{k}_impl": ["ring", "ring"] for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")})


def comp(i, us, deps=(), ctrl=(), cpu=False, cat=None):
    attrs = [Attr("is_cpu_op", cpu)] + ([Attr("category", cat)] if cat else [])
    return Node(i, f"c{i}", NodeType.COMP_NODE, list(ctrl), list(deps), duration_micros=us, attrs=attrs)


def coll(i, kind, size, deps=(), pg=None, cat=None):
    attrs = [Attr("is_cpu_op", False), Attr("comm_type", int(kind)), Attr("comm_size", size)]
    attrs += [Attr("pg_name", pg)] if pg else []
    attrs += [Attr("category", cat)] if cat else []
    return Node(i, f"x{i}", NodeType.COMM_COLL_NODE, [], list(deps), attrs=attrs)


def p2p(i, send, src, dst, size, tag, deps=()):
    t = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
    attrs = [Attr("is_cpu_op", False), Attr("comm_src", src), Attr("comm_dst", dst), Attr("comm_size", size), Attr("comm_tag", tag)]
    return Node(i, f"{'s' if send else 'r'}{i}", t, [], list(deps), attrs=attrs)


def per_rank(nodes_of, n=8, groups=None):
    return SimWorkload.per_rank({r: ExecutionTrace(nodes=nodes_of(r)) for r in range(n)}, groups)


def test_one_comm_in_flight_and_compute_overlaps():
    # two independent all-reduces run back to back; a compute runs beside them
    wl = per_rank(lambda r: [coll(0, CommType.ALL_REDUCE, 1 << 24), coll(1, CommType.ALL_REDUCE, 1 << 24), comp(2, 100)])
    one = simulate(per_rank(lambda r: [coll(0, CommType.ALL_REDUCE, 1 << 24)]), SW8, SYS).finish_ns[0]
    res = simulate(wl, SW8, SYS)
    assert res.finish_ns == [2 * one] * 8
    assert res.exposed_comm_ns == [2 * one - 100_000] * 8
    assert res.busy_ns[0]["compute"] == 100_000
    assert res.exposed_ns[0]["comm"] == 2 * one - 100_000


def test_without_breakdown_the_times_are_the_same_and_the_categories_empty():
    wl = per_rank(lambda r: [coll(0, CommType.ALL_REDUCE, 1 << 24), comp(1, 100), comp(2, 30, deps=[0], cpu=True)])
    full, bare = simulate(wl, SW8, SYS), simulate(wl, SW8, SYS, breakdown=False)
    assert bare.finish_ns == full.finish_ns and bare.exposed_comm_ns == full.exposed_comm_ns
    assert full.busy_ns[0] and bare.busy_ns == [{}] * 8 and bare.exposed_ns == [{}] * 8


def test_cpu_op_counts_as_exposed_and_zero_duration_is_one_ns():
    res = simulate(per_rank(lambda r: [comp(0, 0), comp(1, 7, cpu=True), comp(2, 3, deps=[1])]), SW8, SYS)
    assert res.finish_ns[0] == 10_000
    assert res.exposed_comm_ns[0] == 10_000 - 3_000 - 1


def test_duration_ns_attribute_is_preferred():
    n = comp(0, 2)
    n.set_attr("duration_ns", 1234)
    res = simulate(per_rank(lambda r: [n]), SW8, SYS)
    assert res.finish_ns == [1234] * 8


def test_send_recv_matched_by_source_destination_tag():
    def nodes(r):
        if r == 0:
            return [p2p(0, True, 0, 5, 1 << 20, 3), p2p(1, True, 0, 5, 1 << 10, 4)]
        if r == 5:
            return [comp(0, 50), p2p(1, False, 0, 5, 1 << 10, 4), p2p(2, False, 0, 5, 1 << 20, 3, deps=[0])]
        return [comp(0, 0)]

    res = simulate(per_rank(nodes), SW8, SYS)
    t_big = int(2 * 500 + (1 << 20) / (360 * 2**30 / 1e9))
    t_small = int(2 * 500 + (1 << 10) / (360 * 2**30 / 1e9))
    assert res.finish_ns[0] == t_big + t_small  # eager sends, one communication at a time
    assert res.finish_ns[5] == 50_000  # both messages arrived long before the receives were posted


def _training_like(ranks_per_stage=4, stages=2):
    """TP groups inside a stage, PP send/recv between the stages, a DP group across both halves."""
    n = ranks_per_stage * stages
    tp = {1 + s: [s * ranks_per_stage + i for i in range(ranks_per_stage)] for s in range(stages)}

    def nodes(r):
        s = r // ranks_per_stage
        g = str(1 + s)
        out = [comp(0, 30 + 20 * s, cat="compute"), coll(1, CommType.ALL_REDUCE, 1 << 22, deps=[0], pg=g, cat="tp")]
        if s == 0:
            out += [p2p(2, True, r, r + ranks_per_stage, 1 << 20, 7, deps=[1]), comp(3, 40, deps=[1])]
        else:
            out += [p2p(2, False, r - ranks_per_stage, r, 1 << 20, 7), comp(3, 40, deps=[1, 2])]
        out.append(coll(4, CommType.REDUCE_SCATTER, 1 << 23, deps=[3], pg=g, cat="tp"))
        return out

    return n, tp, nodes


def test_rank_classes_give_the_per_rank_answer():
    n, tp, nodes = _training_like()
    full = per_rank(nodes, n, tp)
    classes = SimWorkload(
        num_ranks=n,
        classes=[RankClass(0, [0, 1, 2, 3], ExecutionTrace(nodes=nodes(0))), RankClass(4, [4, 5, 6, 7], ExecutionTrace(nodes=nodes(4)))],
        comm_groups=tp,
    )
    a = simulate(full, SW4x2, SYS2)
    b = simulate(classes, SW4x2, SYS2)
    assert b.simulated_ranks == 2 and a.simulated_ranks == 8
    assert a.finish_ns == b.finish_ns
    assert a.exposed_comm_ns == b.exposed_comm_ns
    assert a.finish_ns[4] > a.finish_ns[0]


def test_world_collective_waits_for_every_class():
    wl = SimWorkload(
        num_ranks=8,
        classes=[
            RankClass(0, [0, 1, 2, 3], ExecutionTrace(nodes=[comp(0, 10), coll(1, CommType.ALL_REDUCE, 1 << 20, deps=[0])])),
            RankClass(4, [4, 5, 6, 7], ExecutionTrace(nodes=[comp(0, 90), coll(1, CommType.ALL_REDUCE, 1 << 20, deps=[0])])),
        ],
    )
    res = simulate(wl, SW4x2, SYS2)
    full = simulate(per_rank(lambda r: [comp(0, 10 if r < 4 else 90), coll(1, CommType.ALL_REDUCE, 1 << 20, deps=[0])]), SW4x2, SYS2)
    assert res.finish_ns == full.finish_ns
    assert min(res.finish_ns) > 90_000


def test_timeline_is_chrome_trace_json(tmp_path):
    out = tmp_path / "timeline.json"
    simulate(per_rank(lambda r: [comp(0, 5, cat="compute"), coll(1, CommType.ALL_GATHER, 4096, deps=[0], cat="dp")]), SW8, SYS, timeline_path=str(out))
    events = json.loads(out.read_text())["traceEvents"]
    assert len(events) == 16
    first = min((e for e in events if e["pid"] == 0), key=lambda e: e["ts"])
    assert first["name"] == "c0" and first["dur"] == 5.0 and first["ph"] == "X" and first["tid"] == "gpu"


@pytest.mark.parametrize(
    "nodes_of,groups,message",
    [
        (lambda r: [comp(0, 1, deps=[9])], None, r"rank 0: node 0 \('c0'\) depends on node 9, which is not in its ET"),
        (lambda r: [comp(0, 1, deps=[1]), comp(1, 1, deps=[0])], None, r"rank 0: node 0 \('c0'\) is on a dependency cycle"),
        (lambda r: [coll(0, CommType.ALL_REDUCE, 64)] if r != 3 else [comp(0, 1)], None, r"rank 0: node 0 \('x0'\) waits forever for collective 1 of group world"),
        (lambda r: [p2p(0, True, 0, 1, 64, 1)] if r == 0 else [comp(0, 1)], None, r"rank 0: a send to rank 1 \(tag 1, 64 bytes\) has no matching receive"),
        (lambda r: [p2p(0, False, 0, 1, 64, 1)] if r == 1 else [comp(0, 1)], None, r"rank 1: receive node 0 \('r0'\) from rank 0 tag 1 never gets its message"),
        (lambda r: [coll(0, CommType.ALL_REDUCE, 64, pg="5")], {1: [0, 1]}, r"rank 0: node 0 \('x0'\) names process group '5'"),
        (lambda r: [coll(0, CommType.GATHER, 64)], None, r"rank 0: node 0 \('x0'\) has collective type 3"),
    ],
)
def test_bad_input_is_one_clear_error(nodes_of, groups, message):
    with pytest.raises(CalibError, match=message):
        simulate(per_rank(nodes_of, 8, groups), SW8, SYS)


def test_network_must_match_rank_count():
    with pytest.raises(CalibError, match="do not match the workload's 8 ranks"):
        simulate(per_rank(lambda r: [comp(0, 1)]), SW4x2.__class__((Dim("Switch", 4, 1.0, 1.0),)), SYS)
