"""Replay a measured run's own converted ETs through the simulator on the calibrated network.

How a converted ET is replayed (what "replay" means in every report):
  - GPU kernels (COMP nodes) keep their measured durations (attr duration_ns), except that GEMM and
    attention kernels are scaled by the run's profiled-over-measured SM clock ratio to the calibration's
    clock exponent (calib.validation.measured.profiled_clock_ratio, calib.models.clock: under the power
    cap the unprofiled steps run at a lower clock than the profiled one; memory-bound kernels follow the
    HBM clock, which does not move);
  - host time is not replayed: calib's converter folds CPU ops into the idle gap before each GPU
    node (attr gap_ns), which the simulator does not replay, and any is_cpu_op node (an ET from
    another converter) is replayed as 0 ns. Under the profiler the host side is several times
    slower than in the unprofiled steps the measured step time comes from; GPU order is kept by the
    ET's stream, cross-stream and sync dependencies. The replay is therefore the GPU-bound step;
  - collectives and send/recv are timed by the simulator on the calibrated network, synchronised
    across their group (so the measured wait for a slow peer is not replayed; it arises, or not,
    from the simulated ranks); their duration field is set to the measured transfer part (attr
    transfer_ns), which is what the simulator replays for the collectives it does not model
    (BROADCAST);
  - a variable-size collective (MoE token dispatch: all-to-all-v, and all-gather-v / reduce-scatter-v
    of routed tokens, so the k-th collective of a group moves different byte counts on different
    ranks) is replayed on every rank at the largest rank's comm_size: the simulator times one size
    per group, and the exchange ends when its largest member is done. An all-reduce never varies;
    one that does is left alone for the simulator to refuse. The report counts such collectives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calib.bundle.io import Bundle
from calib.chakra.model import CommType, ExecutionTrace, NodeType
from calib.errors import CalibError
from calib.ops import FLOP_CLASSES
from calib.sim.types import SimResult, SimWorkload


@dataclass
class RunTraces:
    traces: dict[int, ExecutionTrace]
    comm_groups: dict[int, list[int]]
    uneven: int = 0  # variable-size collectives evened out, set by replay_workload
    clock_scale: float = 1.0  # on GEMM and attention kernels: the profiled over the measured SM clock ^ the exponent


def read_run_traces(bundle: Bundle, clock_exponent: float = 1.0) -> RunTraces:
    """The bundle's et/rank.N.et.gz and et/comm_groups.json; CalibError when a rank is missing. GEMM and attention
    kernels will replay at the measured steps' clock, their time going as clock ^ -clock_exponent
    (calib.models.clock.replay_exponent of the calibration)."""
    from calib.chakra.codec import read_et

    files = bundle.et_files()
    if not files:
        raise CalibError(f"bundle {bundle.path}: has no et/rank.N.et files to replay")
    traces = {int(f.name.split(".")[1]): read_et(f) for f in files}
    world = len(traces)
    if sorted(traces) != list(range(world)):
        raise CalibError(f"bundle {bundle.path}: et/ ranks {sorted(traces)} are not 0..{world - 1}")
    groups: dict[int, list[int]] = {}
    gfile = Path(bundle.path) / "et" / "comm_groups.json"
    if gfile.is_file():
        try:
            raw = json.loads(gfile.read_text())
            groups = {int(k): [int(r) for r in v] for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise CalibError(f"bundle {bundle.path}: et/comm_groups.json is not a {{id: [ranks]}} map ({exc})") from None
    from calib.validation.measured import profiled_clock_ratio

    return RunTraces(traces, groups, clock_scale=profiled_clock_ratio(bundle) ** clock_exponent)


def check_replayable(run: RunTraces, pp: int, source: str) -> None:
    """Refuse ETs that cannot stand for the run: a pipeline-parallel step without any send/recv
    would replay its stages as independent programs (a silently wrong step time)."""
    if pp > 1 and not any(
        n.type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE) for t in run.traces.values() for n in t.nodes
    ):
        raise CalibError(
            f"{source}: the ETs of this PP={pp} run hold no send/recv (the pipeline transfers are missing from "
            "the conversion), so its stages cannot be replayed together"
        )


def replay_trace(trace: ExecutionTrace, clock_scale: float = 1.0) -> ExecutionTrace:
    """A copy of one rank's converted ET prepared for replay (see the module docstring)."""
    out = trace.copy()
    for n in out.nodes:
        if n.type == NodeType.METADATA_NODE:
            continue
        # Compute-bound kernels follow the SM clock; memory-bound ones the HBM clock, which does not
        # move under the power cap.
        if clock_scale != 1.0 and n.type == NodeType.COMP_NODE and not n.is_cpu_op and n.attr("op_class") in FLOP_CLASSES:
            ns = int(round(int(n.attr("duration_ns") or 0) * clock_scale))
            n.duration_micros = int(round(ns / 1000))
            n.set_attr("duration_ns", ns)
        elif n.is_cpu_op:
            n.duration_micros = 0
            n.set_attr("duration_ns", 0)
        elif n.type in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
            transfer = n.attr("transfer_ns")
            if transfer is not None:
                n.duration_micros = int(round(int(transfer) / 1000))
                n.set_attr("duration_ns", int(transfer))
    return out


VARIABLE_SIZE = (CommType.ALL_TO_ALL, CommType.ALL_GATHER, CommType.REDUCE_SCATTER)


def even_variable_collectives(traces: dict[int, ExecutionTrace]) -> int:
    """Give the k-th collective of every process group, when it is an all-to-all, all-gather or
    reduce-scatter of the same kind on every rank, the largest comm_size any rank has for it (in
    place); return how many were uneven. Collectives are matched as the simulator matches them:
    the k-th collective node of the group in issue (node id) order on each rank."""
    by_key: dict[tuple[str, int], list] = {}
    for trace in traces.values():
        seen: dict[str, int] = {}
        for n in sorted((n for n in trace.nodes if n.type == NodeType.COMM_COLL_NODE), key=lambda n: n.id):
            pg = str(n.attr("pg_name") or "")
            k = seen.get(pg, 0)
            seen[pg] = k + 1
            by_key.setdefault((pg, k), []).append(n)
    uneven = 0
    for nodes in by_key.values():
        kinds = {int(n.attr("comm_type", -1)) for n in nodes}
        if len(kinds) != 1 or kinds.pop() not in VARIABLE_SIZE:
            continue
        sizes = [int(n.attr("comm_size", 0)) for n in nodes]
        if min(sizes) != max(sizes):
            uneven += 1
            for n in nodes:
                n.set_attr("comm_size", max(sizes))
    return uneven


def replay_workload(run: RunTraces) -> SimWorkload:
    prepared = {r: replay_trace(t, run.clock_scale) for r, t in run.traces.items()}
    run.uneven = even_variable_collectives(prepared)
    return SimWorkload.per_rank(prepared, run.comm_groups)


def simulate_replay(run: RunTraces, network: object, system: object) -> SimResult:
    from calib.sim import simulate  # lands with the simulator (issue 3)

    return simulate(replay_workload(run), network, system)
