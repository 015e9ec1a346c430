"""Would two launch costs instead of one explain why runs need different costs? (docs/host.md)

Replays each named H200 run (its converted ETs, calib.validation.replay semantics) with the
launches of some kernels charged `ratio` x the cost of the others, and solves per run for the cost
at which the replay equals the measured step. A split that explained the spread of the needed costs
between runs would make them agree (a smaller coefficient of variation at some ratio than at 1).

    python benchmarks/host_launch_split.py foreach 1,0.25,0 mixtral-tp2-sp-rcsel llama8b-tp2 ...
    python benchmarks/host_launch_split.py phase 1,0.75,0.5 mixtral-tp2-sp-rcsel llama8b-tp2 ...

Splits: `foreach` charges the second and later kernels of one `_foreach_` optimizer call at the
ratio (multi-tensor kernels of one Python call); `gemm` charges the GEMM launches (aten::mm, bmm,
baddbmm, ...) at the ratio (a linear layer's Python module call against a bare elementwise op); `comm`
charges the NCCL launches (collectives, sends, receives) at the ratio (ProcessGroupNCCL's work objects,
events and stream waits per call); `phase` charges the backward's kernels at the ratio
(from the first op named *backward* up to the next forward norm, embedding or optimizer op: the
autograd engine's thread launches them, the Python thread the rest, recomputed forwards included).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from calib.bundle.io import read_bundle
from calib.calibration import Calibration
from calib.chakra.model import ExecutionTrace, Node, NodeType
from calib.models.host import HostModel, solve
from calib.ops import GEMM_OPS
from calib.sim import simulate
from calib.validation import engine
from calib.validation.measured import measured_step
from calib.validation.replay import read_run_traces, replay_workload
from calib.workload.host import ROLE, add_host_to_replay, set_host_costs

ROOT = Path(__file__).resolve().parent.parent
FORWARD_OPS = ("aten::_fused_rms_norm", "aten::native_layer_norm", "aten::embedding", "aten::gather")
OPTIMIZER_OPS = ("aten::_foreach_", "aten::linalg_vector_norm")
MAX_LAUNCH_S = 400e-6
COMM_TYPES = (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


def launched(trace: ExecutionTrace) -> list[tuple[int, Node]]:
    """(launch node id, the GPU node it launches) in launch order."""
    hosts = {n.id for n in trace.nodes if n.attr(ROLE) is not None}
    out = [(d, n) for n in trace.nodes if n.attr(ROLE) is None for d in n.data_deps if d in hosts]
    return sorted(out, key=lambda x: x[0])


def launches_in_order(trace: ExecutionTrace) -> list[tuple[int, str]]:
    """(launch node id, aten op of the kernel it launches) in launch order."""
    return [(lid, str(n.attr("aten_op") or "")) for lid, n in launched(trace)]


def foreach_rest(trace: ExecutionTrace) -> set[int]:
    order = launches_in_order(trace)
    return {lid for (lid, op), (_, prev) in zip(order[1:], order, strict=False)
            if op == prev and op.startswith("aten::_foreach_")}


def backward_phase(trace: ExecutionTrace) -> set[int]:
    out, backward = set(), False
    for lid, op in launches_in_order(trace):
        if "backward" in op:
            backward = True
        elif op.startswith(FORWARD_OPS + OPTIMIZER_OPS):
            backward = False
        if backward:
            out.add(lid)
    return out


def gemm_launches(trace: ExecutionTrace) -> set[int]:
    return {lid for lid, op in launches_in_order(trace) if op in GEMM_OPS}


def comm_launches(trace: ExecutionTrace) -> set[int]:
    return {lid for lid, n in launched(trace) if n.type in COMM_TYPES}


SPLITS: dict[str, Callable[[ExecutionTrace], set[int]]] = {"foreach": foreach_rest, "phase": backward_phase,
                                                           "gemm": gemm_launches, "comm": comm_launches}


def needed_costs(run_id: str, split: str, ratios: list[float], cal: Calibration) -> tuple[float, list[float]]:
    bundle = read_bundle(ROOT / "traces" / "h200" / run_id)
    network, system = engine.replay_network(bundle, cal)
    hosted = add_host_to_replay(replay_workload(read_run_traces(bundle)), 0.0, 0.0)
    cheap = {c.rep: SPLITS[split](c.trace) for c in hosted.classes}
    share = statistics.mean(len(cheap[c.rep]) / max(1, len(launches_in_order(c.trace))) for c in hosted.classes)
    p2p = HostModel.from_dict(cal.host).replay_p2p_sync
    measured = measured_step(bundle).time_s
    out = []
    for ratio in ratios:
        def step(launch_s: float, ratio: float = ratio) -> float:
            for c in hosted.classes:
                set_host_costs(c.trace, launch_s, 0.0, p2p)
                for n in c.trace.nodes:
                    if n.id in cheap[c.rep]:
                        ns = int(launch_s * ratio * 1e9)
                        n.set_attr("duration_ns", ns)
                        n.duration_micros = int(round(ns / 1000))
            return simulate(hosted, network, system).step_time_s
        out.append(1e6 * solve(step, measured, MAX_LAUNCH_S))
    return share, out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in SPLITS:
        print(__doc__)
        return 2
    split, ratios, runs = argv[0], [float(x) for x in argv[1].split(",")], argv[2:]
    cal = Calibration.load(str(ROOT / "calib" / "data" / "calibration-h200.yaml"))
    per_ratio: dict[float, list[float]] = {r: [] for r in ratios}
    print(f"{'run':30} {'split share':>11}  needed us at ratio " + " ".join(f"{r:g}" for r in ratios))
    for run_id in runs:
        share, costs = needed_costs(run_id, split, ratios, cal)
        for r, c in zip(ratios, costs, strict=True):
            per_ratio[r].append(c)
        print(f"{run_id:30} {share:11.2f}  " + " ".join(f"{c:6.1f}" for c in costs), flush=True)
    for r, v in per_ratio.items():
        print(f"ratio {r:g}: needed cost {statistics.mean(v):.1f} us on average, coefficient of variation "
              f"{statistics.pstdev(v) / statistics.mean(v):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
