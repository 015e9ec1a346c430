"""Pipeline-parallel conversion on real megatron-core traces.

tests/data/h200-pp2-raw holds the untouched raw traces (host ET + Kineto, ranks 0 and 1; xz since the thirty-
eighth session, gzip before) of the committed H200 run traces/h200/gpt6.7b-pp2-mbs2 (PP=2, 4 micro-batches). megatron-core batches
each step's send/recv (torch batch_isend_irecv): the SendRecv kernel is launched through the driver
API (cuLaunchKernelEx, no External id) inside the "nccl:coalesced" annotation, after the
record_param_comms calls it runs. The round 1-3 conversions lost these transfers; these tests pin
that every transfer is found and pairs up across the two stages.
"""

from __future__ import annotations

from collections import Counter

import pytest

from calib.chakra.model import NodeType
from calib.chakra.validate import problems
from calib.convert import convert_traces
from calib.convert.kineto import enclosing_cpu_op, read_kineto
from tests.conftest import TEST_DATA, TRACES

RAW = TEST_DATA / "h200-pp2-raw"
P2P = (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


@pytest.fixture(scope="module")
def conversion():
    return convert_traces({r: RAW / f"host.{r}.json.xz" for r in (0, 1)},
                          {r: RAW / f"device.{r}.json.xz" for r in (0, 1)})


def _p2p(trace):
    return [n for n in trace.nodes if n.type in P2P]


def test_driver_launch_finds_its_coalesced_annotation():
    kt = read_kineto(RAW / "device.0.json.xz")
    sendrecv = [a for a in kt.gpu if a.name.startswith("ncclDevKernel_SendRecv")]
    assert sendrecv
    for act in sendrecv:
        launch = kt.launches[int(act.correlation)]
        assert launch.external_id is None  # the driver-API launch Kineto leaves unlinked
        cpu = enclosing_cpu_op(kt, launch.tid, launch.ts_ns)
        assert cpu is not None and cpu["name"] == "nccl:coalesced"


def test_every_pipeline_transfer_is_converted(conversion):
    for rank, trace in conversion.traces.items():
        assert not problems(trace), rank
        kinds = Counter(n.type for n in _p2p(trace))
        # 4 micro-batches: stage 0 sends 4 activations and receives 4 gradients; stage 1 the reverse
        assert kinds[NodeType.COMM_SEND_NODE] == 4 and kinds[NodeType.COMM_RECV_NODE] == 4, rank
        assert not [n for n in trace.nodes if n.type == NodeType.COMP_NODE and "SendRecv" in n.name], rank


def test_calls_on_a_one_rank_group_are_no_part_of_a_batched_transfer(conversion):
    """The last stage all-reduces its loss over a data-parallel group of one rank (DP=1): NCCL launches
    nothing for it, so it must not be taken for a further call of the next batched send/recv kernel."""
    groups = conversion.comm_groups
    for rank, trace in conversion.traces.items():
        by_id = {n.id: n for n in trace.nodes}
        for n in trace.nodes:
            main = n.attr("coalesced_with")
            if main is not None:
                assert n.type in P2P and by_id[int(main)].type in P2P, (rank, n.id)
        assert not [n for n in trace.nodes if n.type == NodeType.COMM_COLL_NODE
                    and len(groups.get(int(n.attr("pg_name", -1)), [0, 1])) == 1], rank


def test_sends_and_receives_pair_up_across_ranks(conversion):
    def keyed(rank, kind):
        return sorted((n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
                      for n in _p2p(conversion.traces[rank]) if n.type == kind)

    assert keyed(0, NodeType.COMM_SEND_NODE) == keyed(1, NodeType.COMM_RECV_NODE)
    assert keyed(1, NodeType.COMM_SEND_NODE) == keyed(0, NodeType.COMM_RECV_NODE)
    # activations of one micro-batch: seq 2048 x mbs 2 x hidden 4096 bf16
    assert {n.attr("comm_size") for n in _p2p(conversion.traces[0])} == {2048 * 2 * 4096 * 2}


def test_coalesced_send_and_recv_replay_without_deadlock():
    """Interleaved 1F1B (VPP=2) batches a send and a recv to the same peer in one kernel, in opposite
    orders on the two stages; a host sync after each call instead of after the batch deadlocks."""
    from calib.bundle.io import read_bundle
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.replay import read_run_traces, replay_workload
    from calib.workload.host import add_host_to_replay

    bundle = read_bundle(TRACES / "h200" / "llama8b-pp2vpp2dp2")
    run = read_run_traces(bundle)
    coalesced = [n for n in run.traces[0].nodes if n.type in P2P and n.attr("coalesced_with") is not None]
    assert coalesced  # the case this test is about
    from calib.calibration import Calibration
    from calib.project import DATA

    cal = Calibration.load(DATA / "calibration-h200.yaml")
    network, system = engine.replay_network(bundle, cal)
    result = simulate(add_host_to_replay(replay_workload(run), 12e-6, 250e-6), network, system)
    assert result.step_time_s > 0


def _cross_stream_deps(trace, node):
    stream = {n.id: n.attr("stream") for n in trace.nodes}
    return sorted(d for d in node.data_deps if stream[d] != stream[node.id])


def test_a_send_after_the_backward_waits_for_the_backward(conversion):
    """The last stage sends each micro-batch's input gradient from the main thread after a backward the
    autograd engine's thread launched: the send's stream wait must capture that backward (the op launched
    last on the compute stream by any thread), not the main thread's own last (forward) kernel."""
    trace = conversion.traces[1]
    sends = [n for n in trace.nodes if n.type == NodeType.COMM_SEND_NODE]
    assert len(sends) == 4
    previous = 0
    for send in sends:
        since = [n for n in trace.nodes if previous < n.id < send.id and n.attr("stream") != send.attr("stream")]
        assert any("backward" in str(n.attr("aten_op")) for n in since)  # the backward ran in between
        assert _cross_stream_deps(trace, send) == [since[-1].id], send.id
        previous = send.id


def test_redone_p2p_deps_of_committed_ets_equal_the_converter(conversion, tmp_path):
    """measure.reconvert.redo_p2p_deps gives the pipeline bundles converted before the event-record fix
    (raw traces dropped) the dependencies the fixed converter gives: on gpt6.7b-pp2-mbs2, whose raw traces
    are these, every node's dependencies equal a fresh conversion's, and redoing them again changes nothing."""
    import shutil

    from calib.chakra.codec import read_et
    from measure.reconvert import redo_p2p_deps

    copy = tmp_path / "gpt6.7b-pp2-mbs2"
    shutil.copytree(TRACES / "h200" / "gpt6.7b-pp2-mbs2", copy)
    assert redo_p2p_deps(copy) == 0  # the committed ETs are redone already
    for rank, fresh in conversion.traces.items():
        committed = read_et(copy / "et" / f"rank.{rank}.et.xz")
        assert [sorted(n.data_deps) for n in committed.nodes] == [sorted(n.data_deps) for n in fresh.nodes], rank


def test_redo_p2p_deps_moves_an_early_send_dependency(tmp_path):
    """A send that depended on an early compute node (the old converter's choice) is moved to the last
    compute node started before it; the bundle's manifest says so."""
    import json
    import shutil

    from calib.chakra.codec import read_et, write_et
    from measure.reconvert import redo_p2p_deps

    copy = tmp_path / "gpt6.7b-pp2-mbs2"
    shutil.copytree(TRACES / "h200" / "gpt6.7b-pp2-mbs2", copy)
    et = copy / "et" / "rank.1.et.xz"
    trace = read_et(et)
    send = next(n for n in trace.nodes if n.type == NodeType.COMM_SEND_NODE)
    (right,) = _cross_stream_deps(trace, send)
    early = next(n.id for n in trace.nodes if n.attr("stream") != send.attr("stream") and n.id < right - 100)
    send.data_deps = [d for d in send.data_deps if d != right] + [early]
    write_et(trace, et)
    assert redo_p2p_deps(copy) == 1
    again = read_et(et)
    assert _cross_stream_deps(again, next(n for n in again.nodes if n.id == send.id)) == [right]
    assert "redo_p2p_deps" in json.loads((copy / "manifest.json").read_text())["notes"]["et_p2p_deps"]
