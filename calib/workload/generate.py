"""One training step with Megatron semantics, as Chakra ETs: one trace per pipeline stage.

Every GPU of a pipeline stage runs the same work (TP ranks, DP replicas and EP ranks are
symmetric under balanced routing), so the workload has one rank class per stage, written from
the point of view of the stage's representative rank (tp 0, dp 0); `materialize(rank)` rewrites
process-group ids and pipeline peers for any other rank. Generation costs O(layers x
micro-batches) nodes per stage, whatever the GPU count.

Per stage the trace is a data-flow graph: compute nodes run in program order on one stream
(ctrl_deps chain them), a collective depends on the compute that produced its input, and the next
compute waits for a blocking collective or, for asynchronous ones (input-gradient all-reduce
overlapping the weight-gradient GEMM, data-parallel gradient reduction with overlap_grad_reduce),
only where the result is consumed. Consecutive compute ops with no communication between them are
fused into one node (their durations add up; the simulators run one compute node at a time per
rank anyway), which keeps 8,192-GPU steps at tens of thousands of nodes.
Pipeline transfers are send/recv pairs whose (src, dst, tag) match on both sides.
With a host model (`generate(..., host=)`) every GPU node also gets its host launch CPU ops and
the host waits at megatron's sync points (calib.workload.host); fused compute nodes keep their
kernel count and, where the host falls behind inside them, are split so that the step is exactly
that of launching their kernels one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from calib.chakra.model import Attr, CommType, ExecutionTrace, IOInfo, Node, NodeType
from calib.errors import CalibError
from calib.ops import FLOP_CLASSES
from calib.sim.types import RankClass, SimWorkload
from calib.workload import ops as O
from calib.workload.flops import hardware_flops_per_step, model_flops_per_step
from calib.workload.host import (
    EXPERT_LOOP_LAUNCHES,
    EXPERT_LOOP_OPS,
    GROUPED_SYNCS,
    HOST_READ,
    HOST_SYNC,
    LAUNCHES,
    READ_SYNCS,
    RENDEZVOUS,
    SPLIT_AT,
    SPLIT_NS,
    SYNC_AFTER,
    Launched,
    SplitPoints,
    add_host,
    concat,
    host_recoster,
    rendezvous_setter,
    set_rendezvous,
    summarize,
)
from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig, coords, rank_of
from calib.workload.schedule import Pass, stage_schedule


class HostCosts(Protocol):
    """The host model's costs as the generator needs them (calib.models.host.HostModel has them)."""

    launch_s: float
    sync_s: float


# Seconds of each op record (a DataFrame with the OpRecord fields) -> np.ndarray of seconds.
KernelTime = Callable[[pd.DataFrame], np.ndarray]

GRAD_REDUCE_BYTES = 4  # fp32 gradient reduction (grad_reduce_in_fp32), as the measured runs were configured
MIN_BUCKET_PARAMS = 40_000_000  # megatron-core DDP bucket size: max(40M, 1M x DP) parameters


@dataclass
class Segment:
    """Fused consecutive compute ops of a template."""

    name: str
    duration_ns: int
    flops: float
    bytes: float
    op_class: str
    memory_ns: int = 0  # part of duration_ns spent in memory-bound ops (the power model's "memory" activity)
    launched: Launched | None = None  # its kernels as the host launches them (with a host model)
    sync: bool = False  # the host waits for it before launching more (calib.workload.host.SYNC_AFTER)
    read: bool = False  # ... and that sync is a scalar read (calib.workload.host.READ_SYNCS: no sync cost)
    kernels: tuple[tuple[int, int], ...] = ()  # (duration_ns, count) runs in launch order (with a host model)


Compiled = list  # list[Segment | O.Coll | O.Wait]


@dataclass
class GeneratedStep:
    """The generated step: the workload for the simulators plus what the report needs."""

    model: ModelSpec
    par: ParallelConfig
    workload: SimWorkload
    ops: pd.DataFrame  # the unique op records of the step (OpRecord fields, name) with `time_s` from kernel_time
    model_flops: float
    hardware_flops: float
    stage_compute_s: list[float] = field(default_factory=list)  # all compute nodes, per pipeline stage
    stage_memory_s: list[float] = field(default_factory=list)  # the memory-bound part of it
    groups: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # kind -> {id: ranks}
    templates: dict[str, list] = field(default_factory=dict)  # name -> items (ops.Op | Coll | Wait)
    replayed: list[dict[str, int]] = field(default_factory=list)  # per stage: template -> times emitted

    def op_counts(self, stage: int) -> dict[O.Op, int]:
        """How many times each compute op runs on one GPU of `stage` in the step."""
        out: dict[O.Op, int] = {}
        for key, times in self.replayed[stage].items():
            for it in self.templates[key]:
                if isinstance(it, O.Op):
                    out[it] = out.get(it, 0) + times * it.repeat
        return out

    def stage_flops(self, stage: int, classes: tuple[str, ...] = FLOP_CLASSES) -> float:
        """FLOPs of `classes` ops (GEMM and attention: the power model's work term) one GPU of `stage` runs in the
        step."""
        return float(sum(op.flops * n for op, n in self.op_counts(stage).items() if op.op_class in classes))

    def sync_points(self, stage: int) -> int:
        """Host sync points of one GPU of `stage` in the step at ops (calib.workload.host.SYNC_AFTER: one
        per kernel of such an op, one per instance of a GROUPED_SYNCS op); pipeline sends and receives,
        also syncs, are not counted."""
        return sum(n // op.repeat if op.name in GROUPED_SYNCS else n
                   for op, n in self.op_counts(stage).items() if op.name in SYNC_AFTER)

    def device_to_host_copies(self, stage: int) -> int:
        """Device-to-host copies of one GPU of `stage` in the step (one per kernel of a SYNC_AFTER op)."""
        return sum(n for op, n in self.op_counts(stage).items() if op.name in SYNC_AFTER)

    def materialize(self, rank: int) -> ExecutionTrace:
        assert self.workload.materialize is not None
        return self.workload.materialize(rank)


# --- process groups -----------------------------------------------------------------------------


class Groups:
    """Deterministic group ids for every TP, DP, EP, expert-DP and PP group (only groups of size > 1;
    pipeline transfers are send/recv, so the PP groups are listed for completeness, not used)."""

    def __init__(self, par: ParallelConfig) -> None:
        self.par = par
        p = par
        self.sizes = {"tp": p.tp, "dp": p.dp, "ep": p.ep, "edp": p.dp // p.ep, "pp": p.pp}
        counts = {"tp": p.dp * p.pp, "dp": p.tp * p.pp, "ep": p.tp * p.pp * (p.dp // p.ep), "edp": p.tp * p.pp * p.ep,
                  "pp": p.tp * p.dp}
        self.base: dict[str, int] = {}
        nxt = 1
        for kind in ("tp", "dp", "ep", "edp", "pp"):
            if self.sizes[kind] > 1 and (kind != "edp" or p.ep > 1):  # without EP experts reduce over DP
                self.base[kind] = nxt
                nxt += counts[kind]

    def index(self, kind: str, rank: int) -> int:
        p = self.par
        t, d, s = coords(rank, p)
        if kind == "tp":
            return d + p.dp * s
        if kind == "dp":
            return t + p.tp * s
        if kind == "ep":
            return t + p.tp * (d // p.ep + (p.dp // p.ep) * s)
        if kind == "pp":
            return t + p.tp * d
        return t + p.tp * (d % p.ep + p.ep * s)  # edp

    def gid(self, kind: str, rank: int) -> int:
        return self.base[kind] + self.index(kind, rank)

    def members(self, kind: str, rank: int) -> list[int]:
        p = self.par
        t, d, s = coords(rank, p)
        if kind == "tp":
            return [rank_of(x, d, s, p) for x in range(p.tp)]
        if kind == "dp":
            return [rank_of(t, x, s, p) for x in range(p.dp)]
        if kind == "ep":
            first = d - d % p.ep
            return [rank_of(t, first + x, s, p) for x in range(p.ep)]
        if kind == "pp":
            return [rank_of(t, d, x, p) for x in range(p.pp)]
        return [rank_of(t, x, s, p) for x in range(d % p.ep, p.dp, p.ep)]

    def all_groups(self) -> dict[str, dict[int, list[int]]]:
        """{kind: {id: ranks}}, built from one representative rank per group."""
        p = self.par
        reps: dict[str, list[int]] = {
            "tp": [rank_of(0, d, s, p) for s in range(p.pp) for d in range(p.dp)],
            "dp": [rank_of(t, 0, s, p) for s in range(p.pp) for t in range(p.tp)],
            "ep": [rank_of(t, d, s, p) for s in range(p.pp) for d in range(0, p.dp, p.ep) for t in range(p.tp)],
            "edp": [rank_of(t, e, s, p) for s in range(p.pp) for e in range(p.ep) for t in range(p.tp)],
            "pp": [rank_of(t, d, 0, p) for d in range(p.dp) for t in range(p.tp)],
        }
        return {kind: {self.gid(kind, r): self.members(kind, r) for r in reps[kind]} for kind in self.base}


# --- trace building -----------------------------------------------------------------------------


class TraceBuilder:
    """Appends nodes with the data-flow rules of the module docstring."""

    def __init__(self, launch_ns: int | None = None) -> None:
        # With a host model: record launches, split points and sync points for calib.workload.host.
        self.launch_ns = launch_ns
        self.host = launch_ns is not None
        self.parts: dict[int, list[Segment]] = {}  # compute node id -> the segments fused into it (with a host model)
        # compute node id -> the fold of its parts' `launched`, kept alongside `parts` rather than derived
        # from them: every merge writes the fused node's summary to its attrs, and re-folding the parts
        # there is quadratic (a step without communication, as on one GPU, is one node of hundreds of parts).
        self.launched: dict[int, Launched] = {}
        self.nodes: list[Node] = []
        self.frontier: list[int] = []
        self.last_compute: int | None = None
        self.outstanding: dict[str, int] = {}
        self.memory_ns = 0

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return node.id

    def compute(self, name: str, seg: Segment) -> int:
        self.memory_ns += seg.memory_ns
        nid = len(self.nodes)
        prev = self.nodes[-1] if self.nodes else None
        mergeable = not (self.host and prev is not None and prev.attr(HOST_SYNC, False))
        if mergeable and prev is not None and prev.id == self.last_compute and self.frontier == [prev.id]:
            # Nothing was issued or awaited since the previous compute node: extend it (same stream,
            # same dependencies), which keeps the node count down across layer boundaries.
            a = prev.attrs
            a[1].value += int(seg.flops)
            a[2].value += int(seg.bytes)
            a[3].value += seg.duration_ns
            prev.duration_micros = int(round(a[3].value / 1000))
            if self.host and seg.launched is not None and self.launch_ns is not None:
                both = concat(self.launched[prev.id], seg.launched, self.launch_ns)
                self.launched[prev.id] = both
                self.parts[prev.id].append(seg)
                a[6].value, a[7].value, a[8].value, a[9].value = both.n, seg.sync, both.at, both.tail_ns
                a[10].value = seg.read
            if not prev.name.endswith("+"):
                prev.name += "+"
            return prev.id
        ctrl = [self.last_compute] if self.last_compute is not None and self.last_compute not in self.frontier else []
        node = Node(
            nid, name, NodeType.COMP_NODE, ctrl_deps=ctrl, data_deps=list(self.frontier),
            duration_micros=int(round(seg.duration_ns / 1000)),
            attrs=[
                Attr("is_cpu_op", False, "bool_val"), Attr("num_ops", int(seg.flops), "int64_val"),
                Attr("tensor_size", int(seg.bytes), "uint64_val"), Attr("duration_ns", seg.duration_ns, "uint64_val"),
                Attr("category", "compute", "string_val"), Attr("op_class", seg.op_class, "string_val"),
            ],
        )
        if self.host and seg.launched is not None:
            lx = self.launched[nid] = seg.launched
            self.parts[nid] = [seg]
            node.attrs += [Attr(LAUNCHES, lx.n, "int64_val"), Attr(HOST_SYNC, seg.sync, "bool_val"),
                           Attr(SPLIT_AT, lx.at, "int64_val"), Attr(SPLIT_NS, lx.tail_ns, "int64_val"),
                           Attr(HOST_READ, seg.read, "bool_val")]
        self.frontier = [nid]
        self.last_compute = nid
        return self._add(node)

    def collective(self, name: str, coll: O.Coll, pg: int, wait_key: str | None = None) -> int:
        nid = len(self.nodes)
        node = Node(
            nid, name, NodeType.COMM_COLL_NODE, data_deps=list(self.frontier),
            attrs=[
                Attr("is_cpu_op", False), Attr("comm_type", int(coll.comm_type)), Attr("comm_size", int(coll.size_bytes)),
                Attr("pg_name", str(pg)), Attr("category", O.CATEGORY[coll.group]),
            ],
        )
        if self.host and coll.group == "tp" and not coll.asynchronous:  # its compute stream waits for it
            node.attrs.append(Attr(RENDEZVOUS, True, "bool_val"))
        self._add(node)
        if coll.asynchronous:
            self.outstanding[wait_key or coll.name] = nid
        else:
            self.frontier = [nid]
        return nid

    def wait(self, key: str) -> None:
        nid = self.outstanding.pop(key, None)
        if nid is not None and nid not in self.frontier:
            self.frontier.append(nid)

    def wait_all(self) -> None:
        for key in list(self.outstanding):
            self.wait(key)

    def p2p(self, name: str, send: bool, peer: int, me: int, size: int, tag: int) -> int:
        nid = len(self.nodes)
        src, dst = (me, peer) if send else (peer, me)
        deps = list(self.frontier) if send else ([self.last_compute] if self.last_compute is not None else [])
        node = Node(
            nid, name, NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE, data_deps=deps,
            attrs=[
                Attr("is_cpu_op", False), Attr("comm_src", src), Attr("comm_dst", dst), Attr("comm_size", int(size)), Attr("comm_tag", tag),
                Attr("category", "pp"),
            ],
        )
        if self.host:  # megatron-core's batched p2p ends in torch.cuda.synchronize() (batch_p2p_sync)
            node.attrs.append(Attr(HOST_SYNC, True, "bool_val"))
        self._add(node)
        if not send and nid not in self.frontier:
            self.frontier.append(nid)
        return nid

    def trace(self) -> ExecutionTrace:
        if not self.nodes:  # ASTRA-sim aborts on a rank without nodes
            self.compute("idle", Segment("idle", 0, 0.0, 0.0, "other"))
        return ExecutionTrace(nodes=self.nodes)


# --- templates to segments ----------------------------------------------------------------------


def _kernel_runs(run: list[tuple[O.Op, int]], durations: dict[O.Op, int]) -> list[tuple[int, int]]:
    """(duration_ns, count) of the kernels a run of (op, repeat) launches: an op of several kernels
    (Op.kernels) has its instance's time spread over them. After an op of the expert loop (EXPERT_LOOP_OPS)
    the host's further time on its launches (EXPERT_LOOP_LAUNCHES) follows as launches of no GPU time, owed
    fractions carried to the next such op."""
    out: list[tuple[int, int]] = []
    owed = 0.0
    for o, r in run:
        d, k = durations[o], o.kernels
        if k == 1:
            out.append((d, r))
        else:
            q = d // k
            out += [(q, k - 1), (d - (k - 1) * q, 1)] * r
        if EXPERT_LOOP_OPS.fullmatch(o.name):
            owed += (EXPERT_LOOP_LAUNCHES - 1.0) * k * r
            extra = int(owed + 1e-9)
            if extra:
                out.append((0, extra))
                owed -= extra
    return out


def _compile(items: list[O.Item], durations: dict[O.Op, int], sync_after: frozenset[str] = frozenset(),
             launch_ns: int | None = None) -> Compiled:
    """Fuse runs of compute ops into segments; with `sync_after` a run also ends after an op the host
    synchronises on (the segment is marked `sync`). A sync op with `repeat` k is k syncs (the host reads
    k values one by one, each a device-to-host copy): k segments of one kernel each."""
    out: Compiled = []
    run: list[tuple[O.Op, int]] = []  # (op, kernels of it in this run)

    def flush() -> None:
        if not run:
            return
        each = [durations[o] * r for o, r in run]
        main = run[max(range(len(run)), key=each.__getitem__)][0]
        first, last = run[0][0].name, run[-1][0].name
        name = first if first == last else f"{first}..{last}"
        mem = sum(d for (o, _), d in zip(run, each, strict=True) if o.op_class not in FLOP_CLASSES)
        kernels = () if launch_ns is None else tuple(_kernel_runs(run, durations))
        out.append(Segment(name, sum(each), sum(o.flops * r for o, r in run), sum(o.bytes * r for o, r in run),
                           main.op_class, mem, None if launch_ns is None else summarize(list(kernels), launch_ns),
                           run[-1][0].name in sync_after, run[-1][0].name in sync_after and run[-1][0].name in READ_SYNCS,
                           kernels))
        run.clear()

    for it in items:
        if isinstance(it, O.Op):
            if it.name in sync_after and it.name in GROUPED_SYNCS:  # k copies, one wait after them
                run.append((it, it.repeat))
                flush()
            elif it.name in sync_after:
                for _ in range(it.repeat):
                    run.append((it, 1))
                    flush()
            else:
                run.append((it, it.repeat))
        else:
            flush()
            out.append(it)
    flush()
    return out


def _ops_of(items: list[O.Item]) -> list[O.Op]:
    return [it for it in items if isinstance(it, O.Op)]


def check_supported(model: ModelSpec, par: ParallelConfig) -> None:
    par.check(model)
    if model.is_moe and par.tp > 1 and not par.sequence_parallel:
        raise CalibError("mixture-of-experts with TP > 1 needs sequence parallel (--sp), as in megatron-core")
    if model.seq_length % par.tp and par.sequence_parallel:
        raise CalibError(f"sequence parallel: TP {par.tp} does not divide sequence length {model.seq_length}")


def _rendezvous(host: HostCosts) -> float:
    """What a blocking TP collective costs beyond its transfer, where the host costs have it (else 0)."""
    value = getattr(host, "tp_rendezvous_s", None)
    return 0.0 if value is None else float(value)


def _p2p_sync(host: HostCosts) -> float | None:
    """The host cost after a pipeline send/recv sync, where the host costs have one of their own."""
    value = getattr(host, "p2p_sync_s", None)
    return None if value is None else float(value)


def generate(model: ModelSpec, par: ParallelConfig, kernel_time: KernelTime, host: HostCosts | None = None) -> GeneratedStep:
    """The workload of one training step of `model` under `par` (see module docstring). With `host`
    (calib.models.host.HostModel or anything with `launch_s` and `sync_s`, optionally `p2p_sync_s` and
    `tp_rendezvous_s`, in seconds) every GPU node
    gets its host launch and megatron's host sync points are kept (calib.workload.host); without
    it the step is GPU-bound, as before."""
    check_supported(model, par)
    ctx = _StepContext(model, par, kernel_time, None if host is None else int(round(float(host.launch_s) * 1e9)))
    classes = [_Stage(ctx, p).build() for p in range(par.pp)]
    if host is not None:
        for c, _, _ in classes:
            c.trace = add_host(c.trace, float(host.launch_s), float(host.sync_s), in_place=True,
                               p2p_sync_s=_p2p_sync(host))
    by_kind = ctx.groups.all_groups()
    workload = _workload(par, ctx.groups, by_kind, [c for c, _, _ in classes])
    if host is not None:
        set_rendezvous(workload, _rendezvous(host))
    compute = [sum(n.duration_ns for n in c.trace.nodes if n.type == NodeType.COMP_NODE and not n.is_cpu_op) * 1e-9
               for c, _, _ in classes]
    return GeneratedStep(
        model=model, par=par, workload=workload, ops=ctx.table, model_flops=model_flops_per_step(model, par),
        hardware_flops=hardware_flops_per_step(model, par), stage_compute_s=compute,
        stage_memory_s=[mem for _, mem, _ in classes], groups=by_kind, templates=ctx.templates,
        replayed=[r for _, _, r in classes],
    )


class Relaunchable:
    """A generated step before its host launches, which `at` adds at any host costs without generating
    the step again (the host model's fit simulates each run at dozens of launch costs).

    The traces before `add_host` do not depend on the launch cost: a fused compute node stands for the
    same kernels at any cost, and only where the host falls behind inside it (its split point, attrs
    `host_split_at` and `host_split_ns`) does. `at` recomputes that from the node's segments (SplitPoints),
    exactly as `generate` computes it while fusing, and adds the host launches to a copy of the traces: the result
    is node for node the workload `generate(..., host=)` returns. Nearby launch costs often leave every
    split point where it was (a fit's dozens of costs give a run at most 16 sets of them), so the last
    `KEEP` workloads are kept by their split points and re-costed in place when those come again.
    """

    KEEP = 8

    def __init__(self, model: ModelSpec, par: ParallelConfig, kernel_time: KernelTime) -> None:
        check_supported(model, par)
        self.par = par
        # Any launch cost marks the host sync points; the split points set here are replaced in `at`.
        self.ctx = _StepContext(model, par, kernel_time, 0)
        stages = [_Stage(self.ctx, p) for p in range(par.pp)]
        self.classes = [s.build()[0] for s in stages]
        # Of every compute node with host launches, in every class: its SPLIT_AT and SPLIT_NS attrs, and
        # the kernels of the segments fused into it.
        self.attrs: list[tuple[Attr, Attr]] = []
        kernels: list[list[tuple[tuple[int, int], ...]]] = []
        for cls, stage in zip(self.classes, stages, strict=True):
            parts = stage.b.parts
            for n in cls.trace.nodes:
                if n.id in parts:
                    a = {x.name: x for x in n.attrs}
                    self.attrs.append((a[SPLIT_AT], a[SPLIT_NS]))
                    kernels.append([seg.kernels for seg in parts[n.id]])
        self.points = SplitPoints(kernels)
        self._last: tuple[int, bytes, np.ndarray, np.ndarray] | None = None  # (launch_ns, key, at, tail)
        self.by_kind = self.ctx.groups.all_groups()
        # Split points -> (the workload built with them, its classes' re-costers once gathered, its
        # rendezvous setter).
        self._built: dict[bytes, tuple[SimWorkload, list, Callable[[float], None]]] = {}

    def at(self, host: HostCosts) -> SimWorkload:
        """The step's workload with host launches at `host`'s costs. It may be one returned before,
        re-costed in place: simulate it before the next call."""
        launch_ns = int(round(float(host.launch_s) * 1e9))
        if self._last is None or self._last[0] != launch_ns:  # a sync cost's fit keeps the launch cost
            at, tail = self.points.at(launch_ns)
            self._last = (launch_ns, np.stack([at, tail], axis=1).tobytes(), at, tail)
        _, key, at, tail = self._last
        launch_s, sync_s, p2p_s = float(host.launch_s), float(host.sync_s), _p2p_sync(host)
        kept = self._built.pop(key, None)
        if kept is None:
            for (at_attr, ns_attr), a, t in zip(self.attrs, at.tolist(), tail.tolist(), strict=True):
                at_attr.value, ns_attr.value = a, t
            workload = self._build(launch_s, sync_s, p2p_s)
            kept = (workload, [], rendezvous_setter(workload))
        else:
            workload, recosts, _ = kept
            if not recosts:
                recosts.extend(host_recoster(c.trace) for c in workload.classes)
            for recost in recosts:
                recost(launch_s, sync_s, p2p_s)
        self._built[key] = kept  # the most recent last
        while len(self._built) > self.KEEP:
            del self._built[next(iter(self._built))]
        kept[2](_rendezvous(host))
        return workload

    def _build(self, launch_s: float, sync_s: float, p2p_s: float | None) -> SimWorkload:
        classes = [RankClass(rep=c.rep, members=list(c.members), trace=add_host(c.trace, launch_s, sync_s, p2p_sync_s=p2p_s))
                   for c in self.classes]
        workload = _workload(self.par, self.ctx.groups, self.by_kind, classes)
        workload.fixed_structure = True  # `at` re-costs it in place, never reshapes it
        return workload


def _workload(par: ParallelConfig, groups: Groups, by_kind: dict[str, dict[int, list[int]]],
              classes: list[RankClass]) -> SimWorkload:
    """A step's workload from its rank classes (one per pipeline stage) and its groups by kind
    (`Groups.all_groups`); any other rank's trace is materialized from its stage's."""
    comm_groups: dict[int, list[int]] = {}
    for g in by_kind.values():  # the simulators look groups up by id alone
        comm_groups.update(g)

    def materialize(rank: int) -> ExecutionTrace:
        return _materialize(rank, par, groups, classes)

    # A list of its own: `materialize` keeps reading `classes` whatever a caller does to the workload's.
    return SimWorkload(num_ranks=par.gpus, classes=list(classes), comm_groups=comm_groups, materialize=materialize)


Bucket = tuple[list[int], float, float]  # (layer ids, dense params, expert params) on one rank


class _StepContext:
    """What every stage shares: shapes, compiled templates with their kernel times, parameter counts."""

    def __init__(self, model: ModelSpec, par: ParallelConfig, kernel_time: KernelTime,
                 launch_ns: int | None = None) -> None:
        self.model, self.par = model, par
        self.launch_ns = launch_ns
        pmodel = O.padded_vocab(model, par.tp)
        self.sh = sh = O.shapes(pmodel, par)
        self.groups = Groups(par)
        self.m = par.num_microbatches
        self.V = par.pp * par.vpp
        self.layers_per_chunk = model.layers // self.V
        templates = {
            "fwd": O.layer_fwd(pmodel, par), "bwd": O.layer_bwd(pmodel, par),
            "emb_fwd": O.embedding_fwd(pmodel, sh), "emb_bwd": O.embedding_bwd(pmodel, sh),
            "out_fwd": O.output_fwd(pmodel, sh), "out_bwd": O.output_bwd(pmodel, sh),
        }
        # Parameters per rank for the gradient buckets (dense over DP, experts over expert-DP).
        mats = 3 if model.activation == "swiglu" else 2
        expert_layer = mats * model.hidden * model.ffn_hidden * model.experts if model.is_moe else 0
        self.dense_layer = (model.layer_params() - expert_layer) / par.tp
        self.expert_layer = expert_layer / (par.tp * par.ep)
        # The word embedding is split by TP (vocab-parallel); learned positions are replicated.
        self.emb_params = pmodel.vocab * model.hidden / par.tp + (pmodel.embedding_params() - pmodel.vocab * model.hidden)
        self.out_params = pmodel.vocab * model.hidden / par.tp + model.hidden * (1 if model.norm == "rmsnorm" else 2)
        self.bucket_params = max(MIN_BUCKET_PARAMS, 1_000_000 * par.dp)
        self.act_p2p = sh.act_bytes // (par.tp if par.sequence_parallel else 1)
        for p in range(par.pp):
            local, _ = self._optimizer_params(p)
            tensors = self._optimizer_tensors(p, with_expert=True)
            # With EP the experts have an optimizer (and a gradient norm) of their own.
            experts = sum(e for _, _, e in tensors) if par.ep > 1 else 0
            dense_first = sorted(tensors, key=lambda t: t[2]) if experts else tensors
            templates[f"optimizer{p}"] = O.optimizer_ops(local, [(n, m) for n, m, _ in dense_first], par.dtype,
                                                         expert_tensors=experts)
            if par.dp > 1:  # megatron DDP scales the fp32 gradient buffer by 1/DP before reducing it
                templates[f"grad_scale{p}"] = [O.memop(f"dp.grad_scale.stage{p}", 8 * local, "fp32", "aten::mul_", local)]

        ops = [it for items in templates.values() for it in items if isinstance(it, O.Op)]
        unique = list(dict.fromkeys(ops))
        table = pd.DataFrame([o.record() for o in unique])
        seconds = np.asarray(kernel_time(table), dtype=float)
        if seconds.shape != (len(unique),) or not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
            raise CalibError("kernel model returned invalid times for the generated ops (NaN, negative or wrong count)")
        self.durations = {o: int(round(x * 1e9)) for o, x in zip(unique, seconds, strict=True)}
        table["time_s"] = seconds
        table.insert(0, "name", [o.name for o in unique])
        self.table = table
        self.templates = templates
        sync_after = frozenset(SYNC_AFTER) if launch_ns is not None else frozenset()
        self.compiled = {k: _compile(v, self.durations, sync_after, launch_ns) for k, v in templates.items()}

    def _optimizer_params(self, stage: int) -> tuple[float, float]:
        """(parameters on one GPU of `stage`, the part its optimizer updates)."""
        par = self.par
        n = self.layers_per_chunk * par.vpp
        dense = self.dense_layer * n + (self.emb_params if stage == 0 else 0.0)
        dense += self.out_params if stage == par.pp - 1 else 0.0
        expert = self.expert_layer * n
        if par.distributed_optimizer:
            return dense + expert, dense / par.dp + expert / max(par.dp // par.ep, 1)
        return dense + expert, dense + expert

    def _optimizer_tensors(self, stage: int, with_expert: bool = False) -> list:
        """The fp32 master tensors the optimizer of `stage`'s representative rank (dp 0) updates: every
        local parameter tensor, or with the distributed optimizer the pieces of them in dp rank 0's
        shard: megatron-core's gradient buffer holds the parameters in reverse order, cut into buckets of
        at least bucket_params, and every bucket is split evenly over the DP ranks (experts: their own
        buffer over expert-DP). (elements, is a matrix), or with `with_expert` (elements, is a matrix,
        is an expert's)."""
        par, model = self.par, self.model
        n = self.layers_per_chunk * par.vpp
        pmodel = O.padded_vocab(model, par.tp)
        tensors = O.param_tensors(pmodel, par, n, stage == 0, stage == par.pp - 1)
        out: list[tuple[int, bool, bool]] = []
        if not par.distributed_optimizer:
            out = list(tensors)
        else:
            for expert, ways in ((False, par.dp), (True, max(par.dp // par.ep, 1))):
                group = [(x, m) for x, m, e in reversed(tensors) if e == expert]
                bucket: list[tuple[int, bool]] = []
                size = 0
                for i, t in enumerate(group):
                    bucket.append(t)
                    size += t[0]
                    if size >= self.bucket_params or i == len(group) - 1:
                        end, at = size / ways, 0
                        for numel, mat in bucket:
                            if at >= end:
                                break
                            out.append((int(min(numel, end - at)), mat, expert))
                            at += numel
                        bucket, size = [], 0
        return out if with_expert else [(x, m) for x, m, _ in out]

    def rep(self, stage: int) -> int:
        return rank_of(0, 0, stage % self.par.pp, self.par)

    def tag(self, direction: int, v_dst: int, mb: int) -> int:
        """Send/recv tag, the same on both sides: direction (0 forward, 1 backward), receiving virtual stage, micro-batch."""
        return (direction * self.V + v_dst) * self.m + mb


class _Stage:
    """Builds the trace of one pipeline stage's representative rank."""

    def __init__(self, ctx: _StepContext, stage: int) -> None:
        self.ctx, self.p = ctx, stage
        self.par = ctx.par
        self.me = ctx.rep(stage)
        self.b = TraceBuilder(ctx.launch_ns)
        self.gids = {k: ctx.groups.gid(k, self.me) for k in ctx.groups.base}
        self.buckets = {c: self._buckets(c) for c in range(self.par.vpp)}
        self.gather_wait: dict[int, list[str]] = {}
        self.replayed: dict[str, int] = {}  # template -> times emitted

    def build(self) -> tuple[RankClass, float, dict[str, int]]:
        par, b = self.par, self.b
        # Distributed optimizer with overlap_param_gather: in the steady state the parameter all-gather
        # runs under the first forward passes; each layer's first forward waits for its bucket.
        if par.distributed_optimizer and par.overlap_param_gather:
            for c in range(par.vpp):
                for bk in reversed(self.buckets[c]):
                    self.gather_wait[bk[0][0]] = self._param_gather(bk, asynchronous=True)
        for ps in stage_schedule(self.p, par.pp, self.ctx.m, par.vpp):
            if ps.kind == "F":
                self._forward(ps)
            else:
                self._backward(ps)
        if not par.overlap_grad_reduce:
            for c in reversed(range(par.vpp)):
                for bk in self.buckets[c]:
                    self._grad_reduce(bk, asynchronous=False)
        b.wait_all()
        self._replay(f"optimizer{self.p}", f"stage{self.p}")
        if par.distributed_optimizer and not par.overlap_param_gather:
            for c in range(par.vpp):
                for bk in reversed(self.buckets[c]):
                    self._param_gather(bk, asynchronous=False)
        members = [rank_of(t, d, self.p, par) for d in range(par.dp) for t in range(par.tp)]
        return RankClass(rep=self.me, members=members, trace=b.trace()), b.memory_ns * 1e-9, dict(self.replayed)

    # --- pieces -------------------------------------------------------------------------------
    def _buckets(self, chunk: int) -> list[Bucket]:
        """megatron-core DDP buckets of one model chunk: layers in backward order, cut at bucket_params
        with overlap_grad_reduce, one bucket without."""
        ctx = self.ctx
        v = chunk * self.par.pp + self.p
        lids = range(v * ctx.layers_per_chunk, (v + 1) * ctx.layers_per_chunk)
        out: list[Bucket] = []
        cur: list[int] = []
        dense = expert = 0.0
        for lid in reversed(lids):
            cur.append(lid)
            dense += ctx.dense_layer + (ctx.emb_params if lid == 0 else 0.0)
            dense += ctx.out_params if lid == ctx.model.layers - 1 else 0.0
            expert += ctx.expert_layer
            if self.par.overlap_grad_reduce and dense + expert >= ctx.bucket_params:
                out.append((sorted(cur), dense, expert))
                cur, dense, expert = [], 0.0, 0.0
        if cur:
            out.append((sorted(cur), dense, expert))
        return out

    def _replay(self, key: str, prefix: str) -> None:
        b = self.b
        self.replayed[key] = self.replayed.get(key, 0) + 1
        for it in self.ctx.compiled[key]:
            if isinstance(it, Segment):
                b.compute(f"{prefix}.{it.name}", it)
            elif isinstance(it, O.Coll):
                if it.group in self.gids:  # groups of one rank have no collective
                    b.collective(f"{prefix}.{it.name}", it, self.gids[it.group], wait_key=it.name)
            else:
                b.wait(it.name)

    def _grad_reduce(self, bk: Bucket, asynchronous: bool) -> None:
        key = f"grad_scale{self.p}"
        if key in self.ctx.compiled and key not in self.replayed:
            self._replay(key, "dp")
        lids, dense, expert = bk
        if self.par.ep == 1:  # experts replicated like dense weights: one reduction over DP
            dense, expert = dense + expert, 0.0
        kind = CommType.REDUCE_SCATTER if self.par.distributed_optimizer else CommType.ALL_REDUCE
        for group, params in (("dp", dense), ("edp", expert)):
            if params > 0 and group in self.gids:
                c = O.Coll(f"dp.grads.L{lids[0]}-{lids[-1]}.{group}", kind, int(params * GRAD_REDUCE_BYTES), group,
                           asynchronous=True)
                self.b.collective(c.name, c, self.gids[group])
                if not asynchronous:
                    self.b.wait(c.name)

    def _param_gather(self, bk: Bucket, asynchronous: bool) -> list[str]:
        lids, dense, expert = bk
        if self.par.ep == 1:  # experts replicated like dense weights: one reduction over DP
            dense, expert = dense + expert, 0.0
        keys = []
        for group, params in (("dp", dense), ("edp", expert)):
            if params > 0 and group in self.gids:
                size = int(params * self.ctx.sh.e / self.ctx.groups.sizes[group])  # all-gather: per-rank shard
                c = O.Coll(f"dp.params.L{lids[0]}-{lids[-1]}.{group}", CommType.ALL_GATHER, size, group, asynchronous=True)
                self.b.collective(c.name, c, self.gids[group])
                keys.append(c.name)
                if not asynchronous:
                    self.b.wait(c.name)
        return keys

    def _layers(self, v: int) -> range:
        n = self.ctx.layers_per_chunk
        return range(v * n, (v + 1) * n)

    def _forward(self, ps: Pass) -> None:
        ctx, b = self.ctx, self.b
        v = ps.chunk * self.par.pp + self.p
        mb = ps.micro_batch
        pre = f"mb{mb}.fwd"
        if v == 0:
            self._replay("emb_fwd", f"{pre}.embedding")
        else:
            b.p2p(f"{pre}.recv.v{v}", False, ctx.rep(v - 1), self.me, ctx.act_p2p, ctx.tag(0, v, mb))
        for lid in self._layers(v):
            for key in self.gather_wait.pop(lid, []):
                b.wait(key)
            self._replay("fwd", f"{pre}.L{lid}")
        if v == ctx.V - 1:
            self._replay("out_fwd", f"{pre}.output")
        else:
            b.p2p(f"{pre}.send.v{v + 1}", True, ctx.rep(v + 1), self.me, ctx.act_p2p, ctx.tag(0, v + 1, mb))

    def _backward(self, ps: Pass) -> None:
        ctx, b, par = self.ctx, self.b, self.par
        v = ps.chunk * par.pp + self.p
        mb = ps.micro_batch
        pre = f"mb{mb}.bwd"
        if v == ctx.V - 1:
            self._replay("out_bwd", f"{pre}.output")
        else:
            b.p2p(f"{pre}.recv.v{v}", False, ctx.rep(v + 1), self.me, ctx.act_p2p, ctx.tag(1, v, mb))
        # A bucket's gradients are final after the last micro-batch's backward of its lowest layer.
        # Without pipelining its reduction starts right there, under the remaining layers' backward.
        # With pipelining it starts after this pass's send: both simulators run one communication at a
        # time per rank, so a reduction started earlier would hold back the pipeline transfers that the
        # other stages wait for (on a real cluster they use different links and streams).
        ready = self.buckets[ps.chunk] if (mb == ctx.m - 1 and par.overlap_grad_reduce) else []
        for lid in reversed(self._layers(v)):
            self._replay("bwd", f"{pre}.L{lid}")
            if lid == 0:
                self._replay("emb_bwd", f"{pre}.embedding")
            if par.pp == 1:
                for bk in ready:
                    if bk[0][0] == lid:
                        self._grad_reduce(bk, asynchronous=True)
        if v > 0:
            b.p2p(f"{pre}.send.v{v - 1}", True, ctx.rep(v - 1), self.me, ctx.act_p2p, ctx.tag(1, v - 1, mb))
        if par.pp > 1:
            for bk in ready:
                self._grad_reduce(bk, asynchronous=True)


def _materialize(rank: int, par: ParallelConfig, groups: Groups, classes: list[RankClass]) -> ExecutionTrace:
    """`rank`'s own ET: its stage's trace with process-group ids and pipeline peers rewritten."""
    if not 0 <= rank < par.gpus:
        raise CalibError(f"rank {rank} is outside the workload's {par.gpus} ranks")
    t, d, s = coords(rank, par)
    cls = classes[s]
    if rank == cls.rep:
        return cls.trace
    gid_map = {str(groups.gid(k, cls.rep)): str(groups.gid(k, rank)) for k in groups.base}

    def peer(r: int) -> int:
        return rank_of(t, d, coords(r, par)[2], par)

    nodes = []
    for n in cls.trace.nodes:
        attrs = []
        for a in n.attrs:
            if a.name == "pg_name":
                attrs.append(Attr(a.name, gid_map.get(a.value, a.value), a.slot))
            elif a.name in ("comm_src", "comm_dst"):
                attrs.append(Attr(a.name, peer(a.value), a.slot))
            else:
                attrs.append(Attr(a.name, a.value, a.slot))
        nodes.append(Node(n.id, n.name, n.type, list(n.ctrl_deps), list(n.data_deps), n.start_time_micros,
                          n.duration_micros, _copy_io(n.inputs), _copy_io(n.outputs), attrs))
    trace = cls.trace
    return ExecutionTrace(nodes=nodes, version=trace.version, metadata_attrs=list(trace.metadata_attrs))


def _copy_io(io: IOInfo | None) -> IOInfo | None:
    return None if io is None else IOInfo(io.values, io.shapes, io.types)
