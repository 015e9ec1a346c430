"""Where one-GPU MoE steps idle, and the expert loop's weighted launches (benchmarks/gpu_idle.py and
benchmarks/expert_launches.py; docs/host.md, "The expert loop's launches, weighted" and "Where the one-GPU MoE
steps idle")."""

from __future__ import annotations

import numpy as np

from calib.chakra.model import Attr, Node, NodeType
from tests.conftest import ROOT, load_benchmark

ROUND35 = sorted((ROOT / "traces" / "h200").glob("mixtral-1gpu*-idle35*"))


def _kernel(nid: int, name: str, aten: str, op_class: str = "memory") -> Node:
    return Node(nid, name, NodeType.COMP_NODE, attrs=[Attr("is_cpu_op", False), Attr("aten_op", aten),
                                                      Attr("op_class", op_class)])


def test_phases_find_the_routing_the_expert_loop_and_the_optimizer() -> None:
    idle = load_benchmark("gpu_idle")
    nodes = [
        _kernel(0, "rms_norm", "aten::_fused_rms_norm"),
        _kernel(1, "Memcpy DtoH (Device -> Pinned)", "aten::copy_"),
        _kernel(2, "Memcpy DtoH (Device -> Pinned)", "aten::copy_"),
        _kernel(3, "radixSort", "aten::sort"),
        _kernel(4, "nvjet", "aten::mm", "gemm"),
        _kernel(5, "silu", "aten::silu"),
        _kernel(6, "mul", "aten::mul"),
        _kernel(7, "nvjet", "aten::mm", "gemm"),
        _kernel(8, "cat", "aten::cat"),
        _kernel(9, "nvjet", "aten::mm", "gemm"),
        _kernel(10, "Memcpy DtoH (Device -> Pinned)", "aten::_local_scalar_dense"),
        _kernel(11, "adam", "aten::_foreach_add_"),
    ]
    assert idle.phases(nodes) == ["other", "routing", "routing", "routing", "expert loop", "expert loop",
                                  "expert loop", "expert loop", "other", "other", "optimizer", "optimizer"]


def test_the_depth_series_idles_about_as_long_at_every_depth() -> None:
    """Round 35: one lease, 1, 2 and 3 layers twice each. The unprofiled step's idle over its profiled GPU time
    stays within 21-38 ms a step while the routings triple (4 to 12): well under the replay's sync cost of
    3.2 ms a routing, which would add 26 ms from 1 to 3 layers."""
    from calib.bundle.io import load_bundles

    idle = load_benchmark("gpu_idle")
    rows = [idle.idle(b) for b in load_bundles(ROUND35)]
    by_depth: dict[str, list[float]] = {}
    for r in rows:
        assert abs(r["measured_ms"] - r["gpu_ms"] - r["unprofiled_idle_ms"]) < 1e-6
        assert r["profiled_ms"] > r["measured_ms"]  # the profiler slows the step it records
        assert r["own_launch_us"] is not None
        by_depth.setdefault(r["model"].split(",")[0], []).append(r["unprofiled_idle_ms"])
    assert sorted(by_depth) == ["mixtral-8x7b@L1", "mixtral-8x7b@L2", "mixtral-8x7b@L3"]
    assert all(len(v) == 2 for v in by_depth.values())
    assert all(15 < x < 45 for v in by_depth.values() for x in v)
    one, three = np.mean(by_depth["mixtral-8x7b@L1"]), np.mean(by_depth["mixtral-8x7b@L3"])
    assert abs(three - one) / 8 < 0.5  # ms per routing added from 4 to 12 routings


def test_the_expert_loops_weight_adds_whole_launches_of_no_gpu_time_after_its_ops() -> None:
    """calib.workload.generate._kernel_runs at EXPERT_LOOP_LAUNCHES (benchmarks/expert_launches.py patches other
    weights in): at 1 the kernels alone, at 1.5 the same kernels and half a launch of no GPU time per loop kernel,
    owed fractions carried in whole launches; ops outside the loop add none."""
    from unittest import mock

    from calib.workload import generate
    from calib.workload import ops as O

    ops = [O.Op(name, "memory", 1.0, 1.0, "bf16", "aten::mul") for name in
           ("moe.permute.cat", "moe.expert0.fc1", "moe.expert0.silu", "moe.expert0.fc2", "moe.expert1.fc1")]
    run = [(o, 1) for o in ops]
    durations = {o: 1000 * (i + 1) for i, o in enumerate(ops)}
    with mock.patch.object(generate, "EXPERT_LOOP_LAUNCHES", 1.0):
        plain = generate._kernel_runs(run, durations)
    assert plain == [(1000 * (i + 1), 1) for i in range(len(ops))]
    with mock.patch.object(generate, "EXPERT_LOOP_LAUNCHES", 1.5):
        weighted = generate._kernel_runs(run, durations)
    assert [d for d, _ in weighted if d] == [d for d, _ in plain]
    assert sum(r for d, r in weighted if d == 0) == 2  # 4 loop kernels x 0.5, in whole launches
    assert weighted[3] == (0, 1) and weighted[-1] == (0, 1)


def test_calibs_expert_loop_weight_is_what_the_host_phase_probes_measure() -> None:
    """EXPERT_LOOP_LAUNCHES is the median, to the nearest half, over the committed H200 probe runs at sequence 256 of
    the expert loop's host time per launch over the other launches' (benchmarks/expert_loop_weight.py)."""
    from calib.workload.host import EXPERT_LOOP_LAUNCHES

    bench = load_benchmark("expert_loop_weight")
    df = bench.ratios(sorted((ROOT / "traces").glob("*/_probes/host-phases-*")))
    s256 = df[(df.gpu == "h200") & df.run.str.contains("s256")]
    assert len(s256) == 22 and (s256.ratio > 1).all()  # the loop costs more per launch in every run
    assert round(2 * float(s256.ratio.median())) / 2 == EXPERT_LOOP_LAUNCHES
