"""Workload generation: schedules, FLOPs, memory and the generated ETs (Megatron semantics)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from calib.chakra.model import CommType, NodeType
from calib.chakra.validate import problems
from calib.errors import CalibError
from calib.workload import memory
from calib.workload.flops import model_flops_per_step, narayanan_flops_per_step
from calib.workload.generate import generate
from calib.workload.host import SYNC_AFTER
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig, coords, dp_group, pp_group, tp_group
from calib.workload.schedule import max_in_flight, stage_schedule


def roofline(df: pd.DataFrame) -> np.ndarray:
    """Synthetic kernel time from a known function (not a measurement): roofline plus 4 us."""
    return np.maximum(df["flops"].to_numpy() / 800e12, df["bytes"].to_numpy() / 3e12) + 4e-6


@pytest.mark.parametrize("pp,m,vpp", [(1, 3, 1), (4, 8, 1), (4, 2, 1), (4, 8, 2), (2, 4, 3)])
def test_schedules_run_every_pass_once_forward_first(pp: int, m: int, vpp: int) -> None:
    for stage in range(pp):
        s = stage_schedule(stage, pp, m, vpp)
        assert Counter((p.kind, p.micro_batch, p.chunk) for p in s) == Counter(
            (k, i, c) for k in "FB" for i in range(m) for c in range(vpp))
        pos = {(p.kind, p.micro_batch, p.chunk): i for i, p in enumerate(s)}
        assert all(pos[("F", i, c)] < pos[("B", i, c)] for i in range(m) for c in range(vpp))
    if vpp == 1:
        # 1F1B: stage p keeps min(PP - p, m) micro-batches in flight (Narayanan et al. 2021).
        assert [max_in_flight(stage_schedule(p, pp, m)) for p in range(pp)] == [min(pp - p, m) for p in range(pp)]


def test_flops_match_narayanan_for_gpt3() -> None:
    model = resolve_model("gpt3-175b")
    par = ParallelConfig(tp=8, pp=16, dp=64, global_batch=1536)
    assert model_flops_per_step(model, par) == pytest.approx(narayanan_flops_per_step(model, par), rel=1e-12)


def test_activation_memory_matches_korthikanti() -> None:
    model = resolve_model("gpt3-175b")
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    cases = {
        (True, "none"): sbh / t * (34 + 5 * a * s / h),
        (False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (True, "selective"): sbh / t * 34,
        (True, "full"): 2 * sbh / t,
    }
    for (sp, rc), want in cases.items():
        par = ParallelConfig(tp=t, pp=16, dp=4, sequence_parallel=sp, recompute=rc, global_batch=64)
        assert memory.layer_activation_bytes(model, par, dropout=True, softmax_fp32=False) == pytest.approx(want, rel=1e-12)
    # The measured runs' setting: no dropout masks, fp32 softmax output + bf16 probabilities (6 bytes per score).
    par = ParallelConfig(tp=t, pp=16, dp=4, sequence_parallel=True, global_batch=64)
    assert memory.layer_activation_bytes(model, par) == pytest.approx(sbh / t * (32 + 6 * a * s / h), rel=1e-12)


def test_model_state_bytes_per_parameter() -> None:
    model = resolve_model("gpt3-13b")
    plain = memory.estimate(model, ParallelConfig(tp=8, dp=4, global_batch=32), 80e9)
    dist = memory.estimate(model, ParallelConfig(tp=8, dp=4, global_batch=32, distributed_optimizer=True), 80e9)
    params = plain.weights_bytes / 2
    assert (plain.weights_bytes + plain.grads_bytes + plain.optimizer_bytes) / params == pytest.approx(18)
    assert (dist.weights_bytes + dist.grads_bytes + dist.optimizer_bytes) / params == pytest.approx(6 + 12 / 4)
    assert plain.fits and not memory.estimate(resolve_model("gpt3-175b"), ParallelConfig(global_batch=1), 80e9).fits


def _colls(trace, kind=None):
    return [n for n in trace.nodes if n.type == NodeType.COMM_COLL_NODE and (kind is None or n.attr("category") == kind)]


def test_tp_collectives_per_layer_with_and_without_sp() -> None:
    model = resolve_model("gpt3-1.3b@L2")
    for sp in (False, True):
        par = ParallelConfig(tp=4, pp=1, dp=1, micro_batch=1, global_batch=1, sequence_parallel=sp)
        tr = generate(model, par, roofline).workload.classes[0].trace
        kinds = Counter(CommType(n.attr("comm_type")).name for n in _colls(tr, "tp") if ".loss." not in n.name)
        if sp:  # per layer: fwd AG+RS twice, bwd AG (grad) + AG (re-gather) + RS twice; embedding RS/AG; output AG/RS/AG
            assert kinds == {"ALL_GATHER": 2 * 2 + 2 * 4 + 1 + 2, "REDUCE_SCATTER": 2 * 2 + 2 * 2 + 1 + 1}
        else:  # per layer: 2 all-reduces forward, 2 backward; embedding forward; output backward
            assert kinds == {"ALL_REDUCE": 2 * 4 + 1 + 1}
        ag = [n for n in _colls(tr, "tp") if n.attr("comm_type") == CommType.ALL_GATHER]
        act = model.seq_length * model.hidden * 2
        assert all(n.attr("comm_size") == act // 4 for n in ag)  # all-gather: per-rank shard


def _sends_recvs(workload):
    sends, recvs = Counter(), Counter()
    for c in workload.classes:
        for n in c.trace.nodes:
            key = (n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
            if n.type == NodeType.COMM_SEND_NODE:
                assert n.attr("comm_src") == c.rep
                sends[key] += 1
            elif n.type == NodeType.COMM_RECV_NODE:
                assert n.attr("comm_dst") == c.rep
                recvs[key] += 1
    return sends, recvs


@pytest.mark.parametrize("vpp", [1, 2])
def test_pipeline_sends_and_receives_pair_up(vpp: int) -> None:
    model = resolve_model("gpt3-1.3b@L8")
    par = ParallelConfig(tp=2, pp=4, dp=2, vpp=vpp, micro_batch=1, global_batch=16)
    gen = generate(model, par, roofline)
    assert len(gen.workload.classes) == 4
    assert sorted(r for c in gen.workload.classes for r in c.members) == list(range(16))
    sends, recvs = _sends_recvs(gen.workload)
    m = par.num_microbatches
    assert sends == recvs and sum(sends.values()) == 2 * m * (4 * vpp - 1)
    for c in gen.workload.classes:
        assert problems(c.trace) == []


def test_materialize_rewrites_groups_and_peers() -> None:
    model = resolve_model("gpt3-1.3b@L4")
    par = ParallelConfig(tp=2, pp=2, dp=4, micro_batch=1, global_batch=8)
    gen = generate(model, par, roofline)
    groups = gen.workload.comm_groups
    assert sorted(map(sorted, gen.groups["pp"].values())) == sorted(pp_group(r, par) for r in range(8))
    assert len(groups) == 8 + 4 + 8  # TP groups (DP x PP), DP groups (TP x PP), PP groups (TP x DP)
    for rank in (0, 5, 11, 15):
        tr = gen.materialize(rank)
        assert problems(tr) == []
        t, d, p = coords(rank, par)
        for n in tr.nodes:
            if n.type == NodeType.COMM_COLL_NODE:
                members = groups[int(n.attr("pg_name"))]
                want = tp_group(rank, par) if n.attr("category") == "tp" else dp_group(rank, par)
                assert members == want
            elif n.type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
                me = n.attr("comm_src") if n.type == NodeType.COMM_SEND_NODE else n.attr("comm_dst")
                peer = n.attr("comm_dst") if n.type == NodeType.COMM_SEND_NODE else n.attr("comm_src")
                assert me == rank and coords(peer, par)[:2] == (t, d) and abs(coords(peer, par)[2] - p) == 1


def test_recompute_adds_forward_work_to_backward() -> None:
    from calib.workload import ops as O

    model = resolve_model("gpt3-1.3b@L4")
    base = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=2)
    t = {rc: generate(model, ParallelConfig(**base, recompute=rc), roofline).stage_compute_s[0]
         for rc in ("none", "selective", "full")}
    par = ParallelConfig(**base)
    model_p = O.padded_vocab(model, 1)

    def seconds(items) -> float:
        ops = [i for i in items if isinstance(i, O.Op)]
        return float(roofline(pd.DataFrame([o.record() for o in ops])).sum())

    passes = model.layers * par.num_microbatches
    # full: the whole layer forward again before each layer's backward; selective: the attention core
    assert t["full"] - t["none"] == pytest.approx(passes * seconds(O.layer_fwd(model_p, par)), rel=1e-5)
    core = O.attention_core_fwd(O.shapes(model_p, par), "x")
    assert t["selective"] - t["none"] == pytest.approx(passes * seconds(core), rel=1e-5)  # ns rounding per op


def test_data_parallel_gradients_and_distributed_optimizer() -> None:
    model = resolve_model("gpt3-1.3b@L4")
    for dist, want in ((False, {"ALL_REDUCE"}), (True, {"REDUCE_SCATTER", "ALL_GATHER"})):
        par = ParallelConfig(tp=1, pp=1, dp=4, micro_batch=1, global_batch=4, distributed_optimizer=dist)
        tr = generate(model, par, roofline).workload.classes[0].trace
        dp = _colls(tr, "dp")
        assert {CommType(n.attr("comm_type")).name for n in dp} == want
        grads = sum(n.attr("comm_size") for n in dp if n.attr("comm_type") != CommType.ALL_GATHER)
        padded_vocab = 50304  # 50257 rounded up to a multiple of 128 x TP, as Megatron pads it
        params = model.param_count() + (padded_vocab - model.vocab) * model.hidden * 2
        assert grads == pytest.approx(4 * params, rel=1e-6)  # fp32 gradients of every parameter, once


def test_overlapped_grad_reduce_runs_under_backward() -> None:
    model = resolve_model("gpt3-1.3b@L8")
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, overlap_grad_reduce=True)
    tr = generate(model, par, roofline).workload.classes[0].trace
    dp_ids = [n.id for n in _colls(tr, "dp")]
    assert len(dp_ids) > 1  # several buckets
    later_compute = [n for n in tr.nodes if n.type == NodeType.COMP_NODE and n.id > dp_ids[0] and ".bwd." in n.name]
    assert later_compute  # backward compute still to run after the first bucket was issued


def test_moe_all_to_all_on_expert_groups() -> None:
    model = resolve_model("mixtral-8x7b@L2")
    par = ParallelConfig(tp=1, pp=1, dp=8, ep=4, micro_batch=1, global_batch=8)
    gen = generate(model, par, roofline)
    tr = gen.workload.classes[0].trace
    a2a = [n for n in _colls(tr, "ep")]
    assert len(a2a) == 4 * 2 and all(n.attr("comm_type") == CommType.ALL_TO_ALL for n in a2a)
    assert all(len(gen.workload.comm_groups[int(n.attr("pg_name"))]) == 4 for n in a2a)
    edp = [n for n in _colls(tr, "dp") if len(gen.workload.comm_groups[int(n.attr("pg_name"))]) == 2]
    assert edp  # expert gradients reduced over DP / EP = 2 ranks


def test_large_scale_stays_small() -> None:
    model = resolve_model("gpt3-175b")
    par = ParallelConfig(tp=8, pp=16, dp=256, micro_batch=1, global_batch=4096)
    gen = generate(model, par, roofline)
    assert gen.workload.num_ranks == 32768 and len(gen.workload.classes) == 16
    assert sum(len(c.trace.nodes) for c in gen.workload.classes) < 100_000
    assert problems(gen.materialize(32767)) == []


def test_bad_configurations_are_one_line() -> None:
    with pytest.raises(CalibError, match="needs sequence parallel"):
        generate(resolve_model("mixtral-8x7b@L2"), ParallelConfig(tp=2, dp=4, ep=2, global_batch=8), roofline)
    with pytest.raises(CalibError, match="does not divide the 96 attention heads"):
        generate(resolve_model("gpt3-175b"), ParallelConfig(tp=5, global_batch=8), roofline)

    def bad(df: pd.DataFrame) -> np.ndarray:
        return np.full(len(df), np.nan)

    with pytest.raises(CalibError, match="invalid times"):
        generate(resolve_model("gpt3-1.3b@L2"), ParallelConfig(global_batch=1), bad)


def test_compute_durations_come_from_the_kernel_time_function() -> None:
    model = resolve_model("gpt3-1.3b@L4")
    par = ParallelConfig(tp=2, pp=2, dp=1, micro_batch=1, global_batch=4)

    def const(us: float):
        return lambda df: np.full(len(df), us * 1e-6)

    one, three = generate(model, par, const(1.0)), generate(model, par, const(3.0))
    assert all(t3 == pytest.approx(3 * t1) for t1, t3 in zip(one.stage_compute_s, three.stage_compute_s, strict=True))
    assert (three.ops["time_s"] == 3e-6).all()
    assert {"op_class", "aten_op", "m", "n", "k", "batch", "flops", "bytes", "dtype"} <= set(one.ops.columns)
    nodes = [n for c in one.workload.classes for n in c.trace.nodes if n.type == NodeType.COMP_NODE]
    assert all(n.duration_micros == round(n.duration_ns / 1000) for n in nodes)


def test_gemms_match_a_measured_megatron_core_step(samples) -> None:
    """The GEMMs the generator emits for the sample's configuration are, shape for shape and count
    for count, the GEMM kernels of the real profiled megatron-core step (h200x2-mcore-tp2: GPTModel,
    4 layers, hidden 2048, 16 heads, vocab 32000, TP 2, seq 2048, micro-batch 2, 2 micro-batches)."""
    from calib.convert import convert_traces
    from calib.workload import ops as O
    from calib.workload.models import ModelSpec

    run = samples / "h200x2-mcore-tp2"
    conv = convert_traces({0: run / "host.0.json.gz"}, {0: run / "device.0.json.gz"})
    kernels = conv.kernels
    g = kernels[(kernels["op_class"] == "gemm") & kernels["m"].notna()]
    measured = Counter(zip(g["aten_op"], g["m"].astype(int), g["n"].astype(int), g["k"].astype(int),
                           g["batch"].astype(int), strict=True))
    model = ModelSpec(name="sample", layers=4, hidden=2048, heads=16, seq_length=2048, vocab=32000)
    par = ParallelConfig(tp=2, micro_batch=2, global_batch=4)
    sh = O.shapes(model, par)
    per_mb = (O.layer_fwd(model, par) + O.layer_bwd(model, par)) * model.layers
    per_mb += O.output_fwd(model, sh) + O.output_bwd(model, sh)
    generated = Counter()
    for op in per_mb:
        if isinstance(op, O.Op) and op.op_class == "gemm":
            generated[(op.aten_op, op.m, op.n, op.k, op.batch)] += par.num_microbatches
    assert generated == measured
    # The TP collectives too: 4 all-reduces of s x b x h per layer and micro-batch, the embedding's
    # and the output layer's, and the cross entropy's 3 small ones.
    colls = Counter()
    for item in per_mb + O.embedding_fwd(model, sh) + O.embedding_bwd(model, sh):
        if isinstance(item, O.Coll):
            colls[(item.comm_type.name, item.size_bytes)] += par.num_microbatches
    kind = {"allreduce": "ALL_REDUCE"}
    assert colls == Counter((kind[k], int(b)) for k, b in zip(conv.collectives["kind"], conv.collectives["bytes"],
                                                               strict=True))
    # Memory-bound kernels of one layer (forward: between two QKV GEMMs; backward: between two QKV
    # dgrads): the same bytes, once the sample's dropout (p = 0.1; the measured runs use 0) and the
    # memsets that belong to GEMM launches are left out.
    k = kernels.sort_values("start_s").reset_index(drop=True)
    is_mm = (k["aten_op"] == "aten::mm") & (k["op_class"] == "gemm")
    qkv = k.index[is_mm & (k["n"] == 3072) & (k["k"] == 2048)].tolist()
    dq = k.index[is_mm & (k["n"] == 2048) & (k["k"] == 3072)].tolist()

    def measured_bytes(lo: int, hi: int) -> float:
        part = k.loc[lo:hi]
        keep = (part["op_class"] != "gemm") & ~part["aten_op"].str.contains("dropout") & part["aten_op"].str.len().gt(0)
        keep &= ~part["aten_op"].isin(["aten::mm", "aten::bmm", "aten::baddbmm"])  # memsets of GEMM launches
        keep &= ~((part["aten_op"] == "aten::sum") & (part["bytes"] < 1e4))  # tiny bias-grad finalisers
        return float(part.loc[keep, "bytes"].sum())

    def generated_bytes(items) -> float:  # every kernel of an op records the op's bytes (calib.ops)
        return sum(o.bytes * o.kernels for o in items
                   if isinstance(o, O.Op) and o.op_class != "gemm" and "main_grad" not in o.name)

    assert generated_bytes(O.layer_fwd(model, par)) == pytest.approx(measured_bytes(qkv[0] + 1, qkv[1] - 1), rel=1e-3)
    assert generated_bytes(O.layer_bwd(model, par)) == pytest.approx(measured_bytes(dq[0] + 1, dq[1]), rel=1e-3)


def test_foreach_launches_follow_multi_tensor_apply() -> None:
    """torch's multi_tensor_apply: a kernel per 320 chunks of 65,536 elements, or per full tensor list."""
    from calib.workload.ops import foreach_launches

    full = 320 * 65536
    assert foreach_launches([full], 1) == 1
    assert foreach_launches([full + 1], 1) == 2
    assert foreach_launches([full // 2, full // 2], 1) == 1
    assert foreach_launches([10] * 110, 1) == 1  # depth 1 holds 110 tensors per kernel
    assert foreach_launches([10] * 111, 1) == 2
    assert foreach_launches([10] * 97, 1, scalar_list=True) == 2  # the ScalarList variant: 96
    assert foreach_launches([10] * 49, 3) == 2  # depth 3: 48
    assert foreach_launches([], 2) == 0


def test_optimizer_step_per_tensor_and_per_group() -> None:
    """Grad norm, clipping and the bf16 copy run per parameter tensor; Adam's foreach ops once per
    parameter group (matrices with weight decay, norms and biases without)."""
    from calib.workload import ops as O

    model = resolve_model("llama3-8b@L2,S2048")
    par = ParallelConfig(tp=2, micro_batch=1, global_batch=2)
    tensors = O.param_tensors(O.padded_vocab(model, 2), par, 2, True, True)
    # 2 layers x (2 norms + qkv + proj + fc1 + fc2) + embedding + final norm + output layer
    assert len(tensors) == 15 and sum(1 for _, m, _ in tensors if not m) == 5
    assert sum(n for n, _, _ in tensors) == pytest.approx(model.param_count() / 2, rel=0.01)
    ops = O.optimizer_ops(sum(n for n, _, _ in tensors), [(n, m) for n, m, _ in tensors], "bf16")
    count = Counter()
    for o in ops:
        count[o.aten_op] += o.repeat
    assert count["aten::_local_scalar_dense"] == 15 + 1  # every tensor's norm read, then the total
    assert count["aten::linalg_vector_norm"] == 15 + 10  # a memset before each matrix's reduction
    assert count["aten::mul"] == 15  # clipping
    assert count["aten::copy_"] == 15 + 15 + 1  # clipping copies, bf16 copies, the total norm
    big = sum(n for n, m, _ in tensors if m)
    assert count["aten::_foreach_addcmul_"] == O.foreach_launches([n for n, m, _ in tensors if m], 3) + 1
    addcmul = next(o for o in ops if o.aten_op == "aten::_foreach_addcmul_")
    assert addcmul.bytes == 12 * big  # the whole list's record on every kernel, as the converter writes it
    assert [o.name for o in ops if o.name == "optimizer.grad_norm"]  # the host sync point keeps its name


def test_generated_step_matches_a_profiled_one_kernel_by_kernel() -> None:
    """traces/h200/llama8b-tp2 and gpt1.3b-dp2-mbs4: the generated step launches the profiled step's
    kernels (cuBLAS's own memsets aside) and, with the bundled kernel model, takes its GPU time."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gen_vs_profile import compare_bundle

    from calib.bundle.io import read_bundle
    from calib.calibration import Calibration

    cal = Calibration.load(ROOT / "calib" / "data" / "calibration-h200.yaml")
    for run in ("llama8b-tp2", "gpt1.3b-dp2-mbs4"):
        (stage,) = compare_bundle(read_bundle(ROOT / "traces" / "h200" / run), cal)
        row = stage.summary()
        assert abs(row["launch_dev_no_memset_pct"]) < 2.0, (run, row)
        assert abs(row["gpu_dev_pct"]) < 4.0, (run, row)
        assert row["gen_syncs"] == row["prof_dtoh"] == 28 + (run == "gpt1.3b-dp2-mbs4") * 74, (run, row)


def test_moe_host_syncs_follow_the_profiled_device_to_host_copies() -> None:
    """Every device-to-host copy of the profiled Mixtral steps is a generated one: 5 routing-count copies
    per MoE layer forward with EP or TP (2 on one GPU), one read per parameter tensor's gradient norm and
    one of the total, per optimizer (with EP the experts have their own). The host waits once per
    routing's copies and once per read, in the generated step as in the replay of the profiled one."""
    from calib.bundle.io import read_bundle
    from calib.chakra.codec import read_et
    from calib.validation import engine
    from calib.workload.host import converted_sync_points, count_host, routing_copy_groups
    from tests.conftest import ROOT

    class Host:
        launch_s, sync_s = 10e-6, 50e-6

    for run, expected, per_routing in (("mixtral-tp2ep2-sp", 51, 5), ("mixtral-1gpu", 62, 2)):
        bundle = read_bundle(ROOT / "traces" / "h200" / run)
        et = read_et(bundle.et_files()[0])
        dtoh = sum(1 for n in et.nodes if not n.is_cpu_op and "DtoH" in n.name)
        groups = routing_copy_groups(sorted(et.nodes, key=lambda n: n.id))
        spec = bundle.manifest.spec
        gen = generate(engine.model_of(spec), engine.parallel_of(spec), roofline, Host())
        _, syncs = count_host(gen.workload.classes[0].trace)
        waits = expected - len(groups) * (per_routing - 1)
        assert dtoh == expected == gen.device_to_host_copies(0), (run, dtoh)
        assert {len(g) for g in groups} == {per_routing} and len(groups) == (engine.model_of(spec).layers
                                                                      * engine.parallel_of(spec).num_microbatches), run
        assert gen.sync_points(0) == syncs == waits == len(converted_sync_points(et)), (run, syncs, waits)


def test_a_sync_op_repeated_is_one_sync_per_kernel() -> None:
    from calib.workload import ops as O
    from calib.workload.generate import _compile

    a, read, b = O.memop("a", 8, "fp32", "aten::add"), O.memop("r", 4, "fp32", "aten::copy_"), O.memop("b", 8, "fp32", "aten::mul")
    read3 = dataclasses.replace(read, repeat=3)
    segs = _compile([a, read3, b], {a: 1000, read3: 2000, b: 500}, frozenset({"r"}), launch_ns=10_000)
    assert [(s.name, s.duration_ns, s.sync, s.launched.n) for s in segs] == [
        ("a..r", 3000, True, 2), ("r", 2000, True, 1), ("r", 2000, True, 1), ("b", 500, False, 1)]
    plain = _compile([a, read3, b], {a: 1000, read3: 2000, b: 500})
    assert [(s.name, s.duration_ns, s.sync) for s in plain] == [("a..b", 7500, False)]


def test_routing_copies_are_one_wait() -> None:
    """The routing counts' copies (GROUPED_SYNCS) are issued together and waited for once: one segment of
    their k kernels, its sync at the end."""
    from calib.workload import ops as O
    from calib.workload.generate import _compile

    a, b = O.memop("a", 8, "fp32", "aten::add"), O.memop("b", 8, "fp32", "aten::mul")
    copies = dataclasses.replace(O.memop("moe.router.bookkeeping", 64, "int64", "aten::copy_"), repeat=5)
    segs = _compile([a, copies, b], {a: 1000, copies: 2000, b: 500}, frozenset({"moe.router.bookkeeping"}),
                    launch_ns=10_000)
    assert [(s.name, s.duration_ns, s.sync, s.launched.n) for s in segs] == [
        ("a..moe.router.bookkeeping", 11000, True, 6), ("b", 500, False, 1)]


def test_expert_parameters_have_their_own_gradient_norm() -> None:
    from calib.workload import ops as O

    tensors = [(100, True)] * 4 + [(10, False)] * 2
    ops = O.optimizer_ops(420.0, tensors, "bf16", expert_tensors=2)
    reads = {o.name: o.repeat for o in ops if o.aten_op == "aten::_local_scalar_dense"}
    assert reads == {"optimizer.grad_norm.read": 4, "optimizer.grad_norm": 1,
                     "optimizer.expert_grad_norm.read": 2, "optimizer.expert_grad_norm": 1}
    assert all(name in SYNC_AFTER for name in reads)


def test_memory_ops_carry_the_layout_of_their_role() -> None:
    """Every role in MEMOP_LAYOUT is one the generator emits (no stale entry), its layout is one
    calib.ops.kernel_layout names, and the op records the kernel model gets carry it."""
    import re

    from calib.ops import CALL_LAYOUTS, LAYOUTS
    from calib.workload.ops import LAYOUT_BY_CONFIG, MEMOP_LAYOUT, role_of

    roles: set[str] = set()
    for name, par in (("llama3-8b@L2", ParallelConfig(tp=2, pp=2, global_batch=4, recompute="selective")),
                      ("gpt3-1.3b@L2", ParallelConfig(tp=2, dp=2, global_batch=4, sequence_parallel=True)),
                      ("mixtral-8x7b@L2", ParallelConfig(tp=2, ep=2, dp=2, global_batch=4, sequence_parallel=True)),
                      ("mixtral-8x7b@L2", ParallelConfig(ep=2, dp=2, global_batch=4)),
                      ("gpt3-1.3b@L2", ParallelConfig(micro_batch=2, global_batch=4, recompute="full")),
                      ("llama3-8b@L2", ParallelConfig(micro_batch=2, global_batch=4, attention="flash"))):
        gen = generate(resolve_model(name), par, roofline)
        for stage in range(par.pp):
            for op in gen.op_counts(stage):
                if op.op_class == "memory":
                    role = role_of(op.name)
                    roles.add(role)
                    if role in LAYOUT_BY_CONFIG:
                        assert op.layout in LAYOUTS + CALL_LAYOUTS and role not in MEMOP_LAYOUT, op
                    else:
                        assert op.layout == MEMOP_LAYOUT.get(role, ""), op
                    assert op.record()["layout"] == op.layout
    assert set(MEMOP_LAYOUT) <= roles, sorted(set(MEMOP_LAYOUT) - roles)
    assert all(v in LAYOUTS + CALL_LAYOUTS or re.fullmatch(r"reduce\d+x\d+", v) for v in MEMOP_LAYOUT.values())


def test_memop_layouts_agree_with_profiled_steps() -> None:
    """benchmarks/memop_layouts.py on two committed H200 runs (dense with GQA and RoPE; MoE with TP and
    EP): no role's listed layout differs from the one its profiled kernels ran with most."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from memop_layouts import profiled_layouts

    from calib.bundle.io import read_bundle
    from calib.calibration import Calibration
    from calib.workload.ops import MEMOP_LAYOUT

    cal = Calibration.load(ROOT / "calib" / "data" / "calibration-h200.yaml")
    runs = [read_bundle(ROOT / "traces" / "h200" / r) for r in ("llama8b-tp2", "mixtral-tp2ep2-sp")]
    table = profiled_layouts(runs, cal)
    checked = 0
    for (role, _), e in table.items():
        seen = e["profiled"] or e["near"]
        if role in MEMOP_LAYOUT and seen:
            assert seen.most_common(1)[0][0] == MEMOP_LAYOUT[role], (role, dict(seen))
            checked += 1
    assert checked > 60


def test_a_norm_backward_is_timed_once_and_launched_as_its_two_kernels() -> None:
    """The kernel model is fitted on op instances (a norm backward's input- and weight-gradient kernels
    summed), so the generator times the op once; the host still launches both kernels."""
    from types import SimpleNamespace

    from calib.chakra.model import NodeType as NT
    from calib.workload import ops as O
    from calib.workload.host import count_host

    model, par = resolve_model("gpt3-1.3b@L2"), ParallelConfig(global_batch=2)
    norms = [o for o in O.layer_bwd(model, par) if isinstance(o, O.Op) and o.aten_op.endswith("norm_backward")]
    assert [o.kernels for o in norms] == [2, 2]
    gen = generate(model, par, roofline, SimpleNamespace(launch_s=1e-6, sync_s=0.0))
    counts = gen.op_counts(0)
    trace = gen.workload.classes[0].trace
    launches, _ = count_host(trace)
    colls = sum(n.type in (NT.COMM_COLL_NODE, NT.COMM_SEND_NODE, NT.COMM_RECV_NODE) for n in trace.nodes)
    assert launches == sum(n * o.kernels for o, n in counts.items()) + colls
    seconds = dict(zip(gen.ops["name"], gen.ops["time_s"], strict=True))
    gpu_ns = sum(n.duration_ns for n in trace.nodes if n.type == NT.COMP_NODE and not n.is_cpu_op)
    assert gpu_ns == pytest.approx(sum(n * seconds[o.name] for o, n in counts.items()) * 1e9, rel=1e-6)
