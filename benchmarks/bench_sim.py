"""Speed of the embedded simulator on a full training step (issue 3 target: GPT-3 175B shape on
8,192 GPUs, TP 8 x PP 16 x DP 64, at most 2 s on one CPU core).

The workload comes from calib.workload.generate (one rank class per pipeline stage); where that
module is absent, a representative class workload is built here (16 stage classes, per-layer TP
all-reduces, 1F1B PP send/recv, DP reduce-scatter + all-gather). Op times are a synthetic roofline
(FLOPs at 60% of 989 TFLOP/s plus bytes at 3.35 TB/s): this measures the simulator's speed, not a
prediction. Usage: python benchmarks/bench_sim.py [--repeat 3] [--gpus 8192]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from calib.chakra.model import Attr, CommType, ExecutionTrace, Node, NodeType
from calib.sim import Dim, NetworkConfig, RankClass, SimWorkload, SystemConfig, simulate


def kernel_time(df):
    return df["flops"].to_numpy(float) / (989e12 * 0.6) + df["bytes"].to_numpy(float) / 3.35e12


def generated(tp: int, pp: int, dp: int) -> tuple[SimWorkload, str]:
    from calib.workload.generate import generate
    from calib.workload.models import resolve_model
    from calib.workload.parallel import ParallelConfig

    par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=1536, sequence_parallel=True,
                         overlap_grad_reduce=True, distributed_optimizer=True, overlap_param_gather=True)
    return generate(resolve_model("gpt3-175b"), par, kernel_time).workload, "calib.workload.generate (gpt3-175b)"


def built(tp: int, pp: int, dp: int, layers: int = 96, micro: int = 24) -> tuple[SimWorkload, str]:
    """A 1F1B step per stage: per layer two TP all-reduces forward and backward, PP send/recv
    between neighbouring stages, DP reduce-scatter then all-gather of the stage's gradients."""
    gpus = tp * pp * dp
    per_stage = layers // pp
    groups: dict[int, list[int]] = {}
    for s in range(pp):
        for d in range(dp):
            groups[1 + s * dp + d] = [t + tp * (d + dp * s) for t in range(tp)]
        for t in range(tp):
            groups[1 + pp * dp + s * tp + t] = [t + tp * (d + dp * s) for d in range(dp)]

    def build_stage(s: int) -> RankClass:
        me = tp * dp * s
        nodes: list[Node] = []
        last: list[int] = []

        def add(node_type, name, attrs, deps, dur_ns=0):
            nid = len(nodes)
            nodes.append(Node(nid, name, node_type, [], list(deps), attrs=attrs + ([Attr("duration_ns", dur_ns)] if dur_ns else [])))
            return nid

        def layer(direction: str, mb: int, deps: list[int]) -> list[int]:
            out = deps
            for k in range(per_stage):
                c = add(NodeType.COMP_NODE, f"{direction}{mb}.L{k}", [Attr("is_cpu_op", False), Attr("category", "compute")], out,
                        dur_ns=900_000 if direction == "f" else 1_800_000)
                a = add(NodeType.COMM_COLL_NODE, f"{direction}{mb}.L{k}.tp", [Attr("is_cpu_op", False), Attr("comm_type", int(CommType.ALL_REDUCE)),
                        Attr("comm_size", 25_165_824), Attr("pg_name", str(1 + s * dp)), Attr("category", "tp")], [c])
                out = [a]
            return out

        def p2p(send: bool, peer_stage: int, tag: int, deps: list[int]) -> int:
            peer = tp * dp * peer_stage
            src, dst = (me, peer) if send else (peer, me)
            return add(NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE, f"{'send' if send else 'recv'}{tag}",
                       [Attr("is_cpu_op", False), Attr("comm_src", src), Attr("comm_dst", dst), Attr("comm_size", 12_582_912),
                        Attr("comm_tag", tag), Attr("category", "pp")], deps)

        warm = min(pp - s - 1, micro)
        order = [("f", i) for i in range(warm)]
        fi, bi = warm, 0
        while bi < micro:
            if fi < micro:
                order.append(("f", fi))
                fi += 1
            order.append(("b", bi))
            bi += 1
        for direction, mb in order:
            deps = list(last)
            if direction == "f" and s > 0:
                deps.append(p2p(False, s - 1, mb, []))
            if direction == "b" and s < pp - 1:
                deps.append(p2p(False, s + 1, 10_000 + mb, []))
            last = layer(direction, mb, deps)
            if direction == "f" and s < pp - 1:
                p2p(True, s + 1, mb, last)
            if direction == "b" and s > 0:
                p2p(True, s - 1, 10_000 + mb, last)
        dp_g = str(1 + pp * dp + s * tp)
        rs = add(NodeType.COMM_COLL_NODE, "dp.rs", [Attr("is_cpu_op", False), Attr("comm_type", int(CommType.REDUCE_SCATTER)),
                 Attr("comm_size", 2 * 10**9 // (tp * pp)), Attr("pg_name", dp_g), Attr("category", "dp")], last)
        opt = add(NodeType.COMP_NODE, "optimizer", [Attr("is_cpu_op", False), Attr("category", "compute")], [rs], dur_ns=3_000_000)
        add(NodeType.COMM_COLL_NODE, "dp.ag", [Attr("is_cpu_op", False), Attr("comm_type", int(CommType.ALL_GATHER)),
            Attr("comm_size", 2 * 10**9 // (tp * pp * dp)), Attr("pg_name", dp_g), Attr("category", "dp")], [opt])
        members = [t + tp * (d + dp * s) for d in range(dp) for t in range(tp)]
        return RankClass(me, members, ExecutionTrace(nodes=nodes))

    return SimWorkload(gpus, [build_stage(s) for s in range(pp)], groups), "built in benchmarks/bench_sim.py (generator absent)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--builtin", action="store_true", help="use the built-in workload even if the generator exists")
    args = ap.parse_args(argv)
    tp, pp, dp = 8, 16, 64
    t0 = time.perf_counter()
    try:
        if args.builtin:
            raise ImportError
        workload, source = generated(tp, pp, dp)
    except ImportError:
        workload, source = built(tp, pp, dp)
    t_gen = time.perf_counter() - t0
    # DGX-like: NVSwitch inside the node, one rail switch across the 1,024 nodes.
    network = NetworkConfig((Dim("Switch", 8, 360.0, 500.0), Dim("Switch", tp * pp * dp // 8, 50.0, 2000.0)))
    impl = ["ring", "ring"]
    system = SystemConfig(preferred_dataset_splits=4, local_mem_bw_gbps=1600.0, all_reduce_impl=impl,
                          reduce_scatter_impl=impl, all_gather_impl=impl, all_to_all_impl=impl)
    walls = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = simulate(workload, network, system)
        walls.append(time.perf_counter() - t)
    nodes = sum(len(c.trace.nodes) for c in workload.classes)
    print(f"workload: {source}; {workload.num_ranks} GPUs (TP {tp} x PP {pp} x DP {dp}), {len(workload.classes)} rank classes, "
          f"{nodes} nodes; generated in {t_gen:.2f} s")
    print(f"simulated step time {res.step_time_s:.4f} s; simulated timelines {res.simulated_ranks}")
    print(f"simulator wall time: median {statistics.median(walls):.3f} s, min {min(walls):.3f} s over {len(walls)} runs "
          f"(target <= 2 s on one core)")
    return 0 if min(walls) <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
