"""The host thread of a training step, as ASTRA-sim can express it: kernel launches and sync points.

Eager PyTorch launches every kernel from one Python thread. When launching takes longer than the
GPU needs to run what was launched, the GPU starves: the step is host-bound. Where the host reads a
GPU result (megatron's alltoall token dispatcher copies the routing counts to the host in every
MoE layer's forward), the host stops until the GPU has caught up, and the GPU then idles until
the host has launched the next kernels.

In the ET this becomes (`add_host`):
- every GPU node (compute, collective, send, receive) gets a preceding `is_cpu_op` COMP node, its
  launch, whose duration is the launch cost; the GPU node depends on it (data dependency);
- the launches form one chain in program order (node id order) by control dependencies, so the
  simulators, which run one CPU op at a time per rank, run them back to back;
- a GPU node standing for n fused kernels (attr `launches`, set by the generator) may start after
  the launch of its first kernel; where the host falls behind inside it (`Launched`: attrs
  `host_split_at`, `host_split_ns`) it is split in two, the second part also waiting for the
  launches up to that kernel, which makes the fused node end exactly when its n kernels launched
  one by one would; the remaining launches follow on the host chain before the next node's;
- a GPU node marked `host_sync` makes the next launch wait for it (data dependency), and that
  launch also carries the host's time from the sync to the next launch: `sync_s` after a
  device-to-host copy (none after a scalar read, attr `host_read`: READ_SYNCS), `p2p_sync_s` after
  a pipeline send/recv batch (megatron-core's
  batch_p2p_sync: the whole device drains, and the host then runs the schedule's work between
  micro-batches before its next launch, which the GPU waits for).
The costs sit in attributes (`host_role`, `host_launches`, `host_after_sync`, `host_after_p2p`,
`host_after_read`) so that `set_host_costs` can re-cost a trace in place, which is how the host model is fitted.

The tensor-parallel rendezvous: a blocking collective of the TP group (attr `tp_rendezvous`, set by the
generator, or by `mark_tp_collectives` on a converted ET) keeps its ranks' compute streams `rendezvous_ns`
longer than its transfer (attr `rendezvous_ns`, set by `set_rendezvous`; the embedded simulator adds it to
the collective's end, and the ASTRA-sim backend writes it as a GPU node after the collective). In plain steps
measure/probes/tp_rendezvous.py found 10-17 us per call in the steady state and, at the start of a step,
each blocking call of the first micro-batch's forward waiting for the TP group's slowest host (docs/host.md,
"The TP rendezvous"); one constant per call, fitted with the host model, stands for both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType
from calib.errors import CalibError
from calib.sim.types import RankClass, SimWorkload

LAUNCHES = "launches"  # attr: kernel launches a (fused) GPU node stands for
SPLIT_AT = "host_split_at"  # attr: the kernel of a fused node from which on the host can be behind
SPLIT_NS = "host_split_ns"  # attr: GPU time of the fused node from that kernel on
HOST_SYNC = "host_sync"  # attr: the host waits for this GPU node before its next launch
ROLE = "host_role"  # attr of inserted nodes: "launch" (the first kernel) | "launch_rest"
ROLE_LAUNCHES = "host_launches"
ROLE_AFTER_SYNC = "host_after_sync"
ROLE_AFTER_P2P = "host_after_p2p"  # the sync before this launch waited for a pipeline send/recv
ROLE_AFTER_READ = "host_after_read"  # the sync before this launch waited for scalar reads only (READ_SYNCS)
HOST_READ = "host_read"  # attr of a generated GPU node whose host sync is a scalar read (READ_SYNCS)
COALESCED_WITH = "coalesced_with"  # attr of converted nodes: a further call of that node's NCCL kernel
RENDEZVOUS = "tp_rendezvous"  # attr: a blocking collective of the TP group (module docstring)
RENDEZVOUS_NS = "rendezvous_ns"  # attr: what that collective keeps its ranks' compute streams beyond its transfer

# Ops after which megatron-core synchronises the host (generated workloads), with why.
# An op with `repeat` k is k syncs (one per kernel: each a device-to-host copy the host waits for), but
# for GROUPED_SYNCS (k copies, one wait), so that a generated step has as many device-to-host copies as
# its profiled step (benchmarks/gen_vs_profile.py compares them).
SYNC_AFTER: dict[str, str] = {
    "moe.router.bookkeeping": "MoE routing counts copied to the host (alltoall token dispatcher, every layer's "
                              "forward, every micro-batch: 2 copies on one GPU, 5 with EP or TP, waited for once)",
    "optimizer.grad_norm.read": "per-tensor gradient norms read by the host one by one (megatron-core without Apex "
                                "builds a host tensor of them: one device-to-host copy per parameter tensor)",
    "optimizer.grad_norm": "gradient norm read by the host for clipping (megatron's optimizer step; the profiled "
                           "steps show device-to-host copies after the norm reductions)",
    "optimizer.expert_grad_norm.read": "per-tensor gradient norms of the expert parameters (EP: their own optimizer)",
    "optimizer.expert_grad_norm": "gradient norm of the expert parameters read by the host (EP)",
}
# The sync points above that are scalar reads (`.item()`: aten::_local_scalar_dense in a profile): the
# host waits for the copy and goes straight on to its next launch, which costs what any launch costs;
# they add no host time of their own (`sync_s` is the Python work after the MoE routing copies). The
# profiled steps show it: the GPU idles 24-66 us (median per H200 bundle, profiler included) before the
# node after a scalar read, about one launch, and 398-776 us after a routing copy on one GPU; a GPU-paced
# run with ~300 of them (gpt1.3b, 24 layers) idles 5 ms in all, where one shared sync cost of 0.16 ms
# made its replay 5 % long (docs/host.md, "Scalar reads cost a launch"; benchmarks/scalar_reads.py).
READ_SYNCS = frozenset({"optimizer.grad_norm.read", "optimizer.grad_norm", "optimizer.expert_grad_norm.read",
                        "optimizer.expert_grad_norm"})
SCALAR_READ_OPS = frozenset({"aten::_local_scalar_dense", "aten::item"})  # a converted ET's scalar reads (attr aten_op)
# Sync ops whose `repeat` copies are issued back to back without the host waiting, which then waits once
# for all of them. megatron-core 0.19's alltoall token dispatcher copies the routing counts (2 tensors on
# one GPU, 5 with EP or TP) to the host on a side stream (non-blocking, into pinned memory) and blocks
# once, on the copies' event (cudaEventSynchronize), before its token exchange or second permutation: the
# raw H200 profile of mixtral-ep2-mbs2-raw has 10 such copies and 2 event syncs in a step of 2 MoE layer
# forwards (docs/host.md, "One wait per routing"). The optimizer's scalar reads each block.
GROUPED_SYNCS = frozenset({"moe.router.bookkeeping"})
# In a converted ET the copies of one routing lie within 4 nodes of each other (the sorts of its first
# permutation run between them on the compute stream); those of successive MoE layers 116 or more apart.
ROUTING_GROUP_NODES = 8
# Pipeline sends and receives are host syncs too: megatron-core batches them and then calls
# torch.cuda.synchronize() (batch_p2p_sync, on by default); the generator marks them.

# megatron-core's expert loop (`moe.routed_experts_compute`, a Python loop over the local experts) spends more
# host time per launch than the rest of a step: over the 22 H200 host-phase runs at sequence 256 (one and two GPUs,
# probe rounds 1-11; `python benchmarks/expert_loop_weight.py`) its exclusive host time per launch is 1.13-3.13 times
# that of the micro-batches' other launches, median 1.49. The generator charges each forward launch of the loop
# (EXPERT_LOOP_OPS) this many launches, the extra as launches of no GPU time after the loop's ops, so that it
# delays the GPU only where the host is behind it (docs/host.md, "The expert loop's launches, measured"). Replays of
# converted ETs charge the loop like any launch: its kernels are not told apart there.
EXPERT_LOOP_LAUNCHES = 1.5
# The generator's forward ops of one expert in that loop (calib.workload.ops: `_mlp_body_fwd` with tag
# `moe.expertN`, and the scaling by the routing probability); a recomputed forward runs the loop again.
EXPERT_LOOP_OPS = re.compile(r"moe\.expert\d+\.(fc1|fc1\.bias|silu|silu\.add|gate|gelu|scale|fc2)")


@dataclass(frozen=True)
class Launched:
    """Host-bound summary of n kernels launched back to back, `launch_ns` apart, on one stream.

    With the host starting to launch at h and the GPU free at g, kernel j can start once launched
    (h + (j + 1) x launch_ns) and once kernel j - 1 is done, so the last one ends at
    max(max(g, h + launch_ns) + total, h + (at + 1) x launch_ns + tail_ns), where `at` maximises
    (j + 1) x launch_ns + (GPU time of kernels j..n-1) and `tail_ns` is that GPU time. A fused node
    split at `at`, its second part waiting for the launches up to `at`, ends exactly then.
    """

    n: int
    total_ns: int
    at: int = 0
    tail_ns: int = 0

    def bound_ns(self, launch_ns: int) -> int:
        return (self.at + 1) * launch_ns + self.tail_ns


def summarize(kernels: list[tuple[int, int]], launch_ns: int) -> Launched:
    """`kernels`: (duration_ns, count) runs in launch order."""
    out = Launched(0, 0)
    for d, r in kernels:
        out = concat(out, _block(d, r, launch_ns), launch_ns)
    return out


def _block(d: int, r: int, launch_ns: int) -> Launched:
    # (j + 1) c + (r - j) d is linear in j: the best j is the first (c <= d) or the last kernel.
    if r <= 0:
        return Launched(0, 0)
    if launch_ns > d:
        return Launched(r, r * d, r - 1, d)
    return Launched(r, r * d, 0, r * d)


def concat(a: Launched, b: Launched, launch_ns: int) -> Launched:
    """The summary of a's kernels followed by b's."""
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    first = a.bound_ns(launch_ns) + b.total_ns
    second = a.n * launch_ns + b.bound_ns(launch_ns)
    if second > first:
        return Launched(a.n + b.n, a.total_ns + b.total_ns, a.n + b.at, b.tail_ns)
    return Launched(a.n + b.n, a.total_ns + b.total_ns, a.at, a.tail_ns + b.total_ns)


class SplitPoints:
    """`summarize` and `concat` of many fused nodes' kernels at once, for any launch cost: per node, the
    `at` and `tail_ns` of the concatenated summary of its segments' (duration_ns, count) runs.

    The summary's `at` is the earliest kernel j maximising (j + 1) x launch_ns + (GPU time of kernels j..n-1)
    (`concat` takes the later part's kernel only when it is strictly better, `_block` the first of equal
    kernels), and over a run of equal kernels that sum is linear in j: only each run's first and last kernel
    can be the earliest maximum. So each node's candidates are fixed and one launch cost is one vectorised
    maximum per node (a host-model fit asks at dozens of costs, for every fused node of every run)."""

    def __init__(self, nodes: list[list[tuple[tuple[int, int], ...]]]) -> None:
        """`nodes`: per fused node, its segments' kernel runs in launch order."""
        j, suffix, row = [], [], []
        for k, segments in enumerate(nodes):
            runs = [(int(d), int(r)) for kernels in segments for d, r in kernels if r > 0]
            rest = sum(d * r for d, r in runs)
            pos = 0
            for d, r in runs:
                j += (pos, pos + r - 1)
                suffix += (rest, rest - (r - 1) * d)
                row += (k, k)
                rest -= d * r
                pos += r
        self.count = len(nodes)
        self.j = np.array(j, dtype=np.int64)
        self.suffix = np.array(suffix, dtype=np.int64)
        self.row = np.array(row, dtype=np.int64)
        new = np.r_[True, self.row[1:] != self.row[:-1]] if len(row) else np.zeros(0, dtype=bool)
        self.starts = np.flatnonzero(new)  # each node's first candidate
        self.group = np.cumsum(new) - 1  # per candidate: its node among those with kernels
        self.rows = self.row[self.starts]  # the nodes with kernels, in order

    def at(self, launch_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """(at, tail_ns) of every node at `launch_ns` (0, 0 for a node without kernels)."""
        at = np.zeros(self.count, dtype=np.int64)
        tail = np.zeros(self.count, dtype=np.int64)
        if not len(self.j):
            return at, tail
        value = (self.j + 1) * int(launch_ns) + self.suffix
        best = np.maximum.reduceat(value, self.starts)
        hit = np.flatnonzero(value == best[self.group])
        first = hit[np.r_[True, self.group[hit[1:]] != self.group[hit[:-1]]]]
        at[self.rows] = self.j[first]
        tail[self.rows] = self.suffix[first]
        return at, tail


_GPU_TYPES = (NodeType.COMP_NODE, NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


def is_launched(node: Node) -> bool:
    """A node the host launches: GPU compute or communication (not a CPU op, not metadata)."""
    return node.type in _GPU_TYPES and not node.is_cpu_op


_P2P = (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


def _duration_ns(launches: int, after_sync: bool, after_p2p: bool, launch_s: float, sync_s: float,
                 p2p_sync_s: float, after_read: bool = False) -> int:
    after = (p2p_sync_s if after_p2p else 0.0 if after_read else sync_s) if after_sync else 0.0
    return int(round((launches * launch_s + after) * 1e9))


def _attr(name: str, value: object, slot: str) -> Attr:
    """An Attr with its slot given (skips the slot inference of Attr's constructor: this runs for
    every launch of an 8,192-GPU step)."""
    a = object.__new__(Attr)
    a.name, a.value, a.slot = name, value, slot
    return a


def _cpu_node(nid: int, name: str, role: str, launches: int, after_sync: bool, after_p2p: bool, after_read: bool,
              ns: int, ctrl: list[int], data: list[int]) -> Node:
    return Node(
        nid, name, NodeType.COMP_NODE, ctrl_deps=ctrl, data_deps=data, duration_micros=int(round(ns / 1000)),
        attrs=[
            _attr("is_cpu_op", True, "bool_val"), _attr("duration_ns", ns, "uint64_val"),
            _attr("category", "cpu", "string_val"), _attr(ROLE, role, "string_val"),
            _attr(ROLE_LAUNCHES, launches, "int64_val"), _attr(ROLE_AFTER_SYNC, after_sync, "bool_val"),
            _attr(ROLE_AFTER_P2P, after_p2p, "bool_val"), _attr(ROLE_AFTER_READ, after_read, "bool_val"),
        ],
    )


def _split(n: Node) -> tuple[int, int, int]:
    """(launches, split kernel, GPU ns from it on) of a launched node; split 0 = not split."""
    k = max(1, int(n.attr(LAUNCHES, 1) or 1))
    at = int(n.attr(SPLIT_AT, 0) or 0)
    tail = int(n.attr(SPLIT_NS, 0) or 0)
    if n.type != NodeType.COMP_NODE or not 0 < at < k or not 0 < tail < n.duration_ns:
        return k, 0, 0
    return k, at, tail


def _part(n: Node, nid: int, suffix: str, ns: int, share: float, in_place: bool) -> Node:
    """One part of a split GPU node: `ns` of its time and that share of its work."""
    out = n if in_place else Node(n.id, n.name, n.type, [], [], n.start_time_micros, n.duration_micros, n.inputs,
                                  n.outputs, [_attr(a.name, a.value, a.slot) for a in n.attrs])
    for a in out.attrs:
        if a.name == "duration_ns":
            a.value = ns
        elif a.name in ("num_ops", "tensor_size"):
            a.value = int(round(int(a.value) * share))
        elif a.name in (SPLIT_AT, SPLIT_NS):
            a.value = 0
    out.id, out.name, out.ctrl_deps, out.data_deps = nid, n.name + suffix, [], []
    out.duration_micros = int(round(ns / 1000))
    return out


def _moved(n: Node, nid: int, ctrl: list[int], data: list[int], in_place: bool) -> Node:
    if in_place:
        n.id, n.ctrl_deps, n.data_deps = nid, ctrl, data
        return n
    return Node(nid, n.name, n.type, ctrl, data, n.start_time_micros, n.duration_micros, n.inputs, n.outputs,
                [_attr(a.name, a.value, a.slot) for a in n.attrs])


def add_host(trace: ExecutionTrace, launch_s: float, sync_s: float = 0.0,
             sync: set[int] | None = None, in_place: bool = False, p2p_sync_s: float | None = None,
             reads: set[int] | None = None) -> ExecutionTrace:
    """A new trace with the launch chain of the module docstring; node ids are renumbered in
    program order (launches before their GPU node). `sync`: ids of GPU nodes that the host waits
    for, in addition to those with attr `host_sync`. Existing CPU ops are kept as they are.
    `p2p_sync_s`: the host's time after a sync on a send/recv (None: `sync_s`). `reads`: those of the
    sync points that are scalar reads (READ_SYNCS), in addition to those with attr `host_read`: the
    launch after them waits but costs no `sync_s`.

    To keep node counts down, the launches of a node's remaining kernels and the first launch of
    the next node are one CPU op (nothing waits between them) unless a sync point lies between.
    `in_place`: reuse (and renumber) the input's nodes instead of copying them; the input trace is
    then spent."""
    sync = sync or set()
    p2p_s = sync_s if p2p_sync_s is None else p2p_sync_s
    nodes = sorted(trace.nodes, key=lambda n: n.id)
    out: list[Node] = []
    new_id: dict[int, int] = {}  # old id -> the new id of its (last) GPU part
    tail: list[int] = []  # the host chain's last node
    carry = 0  # launches of the previous node not yet on the chain

    def launch(n: Node, role: str, k: int, after: list[int], p2p: bool = False, read: bool = False) -> int:
        nid = len(out)
        out.append(_cpu_node(nid, f"{role}:{n.name}", role, k, bool(after), p2p, read,
                             _duration_ns(k, bool(after), p2p, launch_s, sync_s, p2p_s, read), list(tail), list(after)))
        tail[:] = [nid]
        return nid

    pending: list[int] = []  # the sync nodes the next launch waits for
    pending_p2p = False  # ... and whether one of them is a send/recv
    pending_read = False  # ... and whether all of them are scalar reads
    known = {n.id for n in nodes}
    synced = {n.id for n in nodes if n.id in sync or bool(n.attr(HOST_SYNC, False))}
    read = {n.id for n in nodes if n.id in synced and (n.id in (reads or ()) or bool(n.attr(HOST_READ, False)))}
    # The calls of one coalesced NCCL kernel (a converted batched send/recv: attr coalesced_with) are
    # one launch, and a host sync after them waits for all of them: megatron's batch_p2p_sync
    # synchronises after the whole batch, and a sync inside it would deadlock the two peers.
    group_of = {n.id: int(n.attr(COALESCED_WITH)) for n in nodes if n.attr(COALESCED_WITH) is not None}
    members: dict[int, list[int]] = {}
    for nid, main in group_of.items():
        members.setdefault(main, [main]).append(nid)
    # The old id after which the host waits, and the old ids it waits for.
    waits: dict[int, list[int]] = {i: [i] for i in synced if i not in group_of and i not in members}
    waits.update({max(ids): ids for ids in members.values() if synced.intersection(ids)})
    waited = set().union(*waits.values()) if waits else set()
    p2p_waits = {n.id for n in nodes if n.id in waited and n.type in _P2P}
    launch_of: dict[int, int] = {}  # old id of a coalesced kernel's first call -> its launch node
    for n in nodes:
        old = n.id
        try:
            ctrl = [new_id[d] for d in n.ctrl_deps if d in known]
            data = [new_id[d] for d in n.data_deps if d in known]
        except KeyError as exc:
            raise CalibError(f"node {n.id} ({n.name!r}) depends on a later node ({exc.args[0]}): the ET is not in "
                             "program order, so its host launches cannot be placed") from None
        if not is_launched(n):
            new_id[old] = len(out)
            out.append(_moved(n, len(out), ctrl, data, in_place))
            continue
        main = group_of.get(old)
        if main is not None and main in launch_of:  # launched with the kernel's first call
            last = len(out)
            out.append(_moved(n, last, ctrl, [*data, launch_of[main]], in_place))
        else:
            k, at, tail_ns = _split(n)
            first = launch(n, "launch", carry + 1, pending, pending_p2p, pending_read)
            pending, pending_p2p, pending_read, carry = [], False, False, 0
            if at:
                total = n.duration_ns
                head = _part(n, len(out), "[head]", total - tail_ns, (total - tail_ns) / total, False)
                head.ctrl_deps, head.data_deps = ctrl, [*data, first]
                out.append(head)
                more = launch(n, "launch_more", at, [])
                body = _part(n, len(out), "", tail_ns, tail_ns / total, in_place)
                body.data_deps = [head.id, more]
                out.append(body)
                carry = k - 1 - at
                last = body.id
            else:
                last = len(out)
                out.append(_moved(n, last, ctrl, [*data, first], in_place))
                carry = k - 1
            if old in members:
                launch_of[old] = first
        new_id[old] = last
        if old in waits:
            if carry:  # the host launches the rest before it waits
                launch(n, "launch_rest", carry, [])
                carry = 0
            pending = [new_id[m] for m in waits[old]]
            pending_p2p = any(m in p2p_waits for m in waits[old])
            pending_read = all(m in read for m in waits[old])
    if carry and nodes:
        launch(nodes[-1], "launch_rest", carry, [])
    return ExecutionTrace(nodes=out, version=trace.version, metadata_attrs=list(trace.metadata_attrs))


def _is_dtoh(n: Node) -> bool:
    return n.type == NodeType.COMP_NODE and not n.is_cpu_op and "DtoH" in n.name


def converted_sync_points(trace: ExecutionTrace) -> set[int]:
    """The GPU nodes of a converted (measured) ET that the host waits for: device-to-host copies
    (the host reads a GPU value: the gradient norm; the MoE routing counts, where the host waits once
    for the last copy of each routing's group, `routing_copy_groups`) and pipeline sends and receives
    (megatron-core's batch_p2p_sync)."""
    nodes = sorted(trace.nodes, key=lambda n: n.id)
    grouped = routing_copy_groups(nodes)
    last = {g[-1] for g in grouped}
    within = {i for g in grouped for i in g[:-1]}
    return {n.id for n in nodes if (n.type in _P2P or _is_dtoh(n)) and n.id not in within} | last


def routing_copy_groups(nodes: list[Node]) -> list[list[int]]:
    """The ids of a converted ET's device-to-host copies that are not scalar reads (the MoE routing
    counts), in groups the host waits for once (GROUPED_SYNCS): copies within ROUTING_GROUP_NODES
    nodes of the previous one with no collective between. `nodes` in id order."""
    groups: list[list[int]] = []
    prev = -ROUTING_GROUP_NODES - 1
    comm_since = False
    for i, n in enumerate(nodes):
        if n.type != NodeType.COMP_NODE:
            comm_since = True
            continue
        if not _is_dtoh(n) or n.attr("aten_op") in SCALAR_READ_OPS:
            continue
        if groups and i - prev <= ROUTING_GROUP_NODES and not comm_since:
            groups[-1].append(n.id)
        else:
            groups.append([n.id])
        prev, comm_since = i, False
    return groups


def converted_reads(trace: ExecutionTrace) -> set[int]:
    """The device-to-host copies of a converted ET that are scalar reads (attr `aten_op` in
    SCALAR_READ_OPS: the optimizer's gradient-norm reads), which cost the host no sync time."""
    return {n.id for n in trace.nodes if _is_dtoh(n) and n.attr("aten_op") in SCALAR_READ_OPS}


def add_host_to_converted(trace: ExecutionTrace, launch_s: float, sync_s: float,
                          p2p_sync_s: float | None = None, free_reads: bool = True) -> ExecutionTrace:
    """A converted ET (one node per measured kernel, in launch order) with its host launches: one
    launch per GPU node and the syncs of `converted_sync_points`, its scalar reads (`converted_reads`)
    at no sync cost. Kernel durations stay as measured. `free_reads` False: the scalar reads cost
    `sync_s` like any other sync (the model before they were told apart, for benchmarks/scalar_reads.py)."""
    return add_host(trace, launch_s, sync_s, sync=converted_sync_points(trace), p2p_sync_s=p2p_sync_s,
                    reads=converted_reads(trace) if free_reads else None)


def host_recoster(trace: ExecutionTrace) -> Callable[[float, float, float | None], None]:
    """`set_host_costs` for one trace made by `add_host`, with its launch nodes found once: the host fit
    re-costs the same trace at many sync costs."""
    slots = []
    for n in trace.nodes:
        if n.attr(ROLE) is None:
            continue
        dur = next(a for a in n.attrs if a.name == "duration_ns")
        slots.append((n, dur, int(n.attr(ROLE_LAUNCHES, 1)), bool(n.attr(ROLE_AFTER_SYNC, False)),
                      bool(n.attr(ROLE_AFTER_P2P, False)), bool(n.attr(ROLE_AFTER_READ, False))))

    def recost(launch_s: float, sync_s: float, p2p_sync_s: float | None = None) -> None:
        p2p_s = sync_s if p2p_sync_s is None else p2p_sync_s
        for n, dur, launches, after_sync, after_p2p, after_read in slots:
            ns = _duration_ns(launches, after_sync, after_p2p, launch_s, sync_s, p2p_s, after_read)
            dur.value = ns
            n.duration_micros = int(round(ns / 1000))

    return recost


def set_host_costs(trace: ExecutionTrace, launch_s: float, sync_s: float, p2p_sync_s: float | None = None) -> None:
    """Re-cost the launch nodes of a trace made by `add_host`, in place (`p2p_sync_s` None: `sync_s`)."""
    host_recoster(trace)(launch_s, sync_s, p2p_sync_s)


class HostWork(NamedTuple):
    """What the host does in a trace made by `add_host`: kernel launches, and of its sync points all of
    them, those after a pipeline send/recv and those after scalar reads only (no `sync_s`)."""

    launches: int
    syncs: int
    p2p_syncs: int
    reads: int


def host_work(trace: ExecutionTrace) -> HostWork:
    """`HostWork` of a trace made by `add_host`, in one pass over its nodes."""
    launches = syncs = p2p = reads = 0
    for n in trace.nodes:
        if n.attr(ROLE) is None:
            continue
        a = {x.name: x.value for x in n.attrs}
        launches += int(a.get(ROLE_LAUNCHES, 1))
        syncs += bool(a.get(ROLE_AFTER_SYNC, False))
        p2p += bool(a.get(ROLE_AFTER_P2P, False))
        reads += bool(a.get(ROLE_AFTER_READ, False))
    return HostWork(launches, syncs, p2p, reads)


def count_host(trace: ExecutionTrace) -> tuple[int, int]:
    """(kernel launches, sync points) of a trace made by `add_host`."""
    work = host_work(trace)
    return work.launches, work.syncs


def count_reads(trace: ExecutionTrace) -> int:
    """The sync points of a trace made by `add_host` that waited for scalar reads only (no sync cost)."""
    return host_work(trace).reads


def count_p2p_syncs(trace: ExecutionTrace) -> int:
    """The sync points of a trace made by `add_host` that waited for a pipeline send/recv."""
    return host_work(trace).p2p_syncs


def add_host_to_replay(workload: SimWorkload, launch_s: float, sync_s: float,
                       p2p_sync_s: float | None = None, free_reads: bool = True, tp: int = 1,
                       rendezvous_s: float = 0.0) -> SimWorkload:
    """A replay workload (one class per rank, converted ETs) with every rank's host launches
    (`add_host_to_converted`, `free_reads` as there) and, with `tp` > 1, its TP group's collectives
    marked (`mark_tp_collectives`) and kept `rendezvous_s` beyond their transfer; `materialize` returns
    the new traces (for ASTRA-sim files)."""
    traces = {c.rep: add_host_to_converted(c.trace, launch_s, sync_s, p2p_sync_s, free_reads) for c in workload.classes}
    classes = [RankClass(rep=c.rep, members=list(c.members), trace=traces[c.rep]) for c in workload.classes]
    out = SimWorkload(num_ranks=workload.num_ranks, classes=classes, comm_groups=dict(workload.comm_groups),
                      materialize=traces.__getitem__)
    mark_tp_collectives(out, tp)
    set_rendezvous(out, rendezvous_s)
    return out


def tp_groups(comm_groups: dict[int, list[int]], tp: int) -> set[int]:
    """The ids of the groups that are a tensor-parallel group under megatron's rank order (TP fastest:
    ranks k x tp .. k x tp + tp - 1); none when `tp` is 1."""
    if tp <= 1:
        return set()
    return {g for g, ranks in comm_groups.items()
            if len(ranks) == tp and sorted(ranks) == list(range(min(ranks), min(ranks) + tp)) and min(ranks) % tp == 0}


def mark_tp_collectives(workload: SimWorkload, tp: int) -> int:
    """Mark (attr RENDEZVOUS) every collective of a converted workload's tensor-parallel groups, in place;
    return how many. A converted ET does not say which of them the compute stream waited for: the
    backward's overlapped ones are marked too, and their rendezvous mostly hides under the GEMM they overlap."""
    groups = {str(g) for g in tp_groups(workload.comm_groups, tp)}
    marked = 0
    for c in workload.classes:
        for n in c.trace.nodes:
            if n.type == NodeType.COMM_COLL_NODE and str(n.attr("pg_name")) in groups:
                n.set_attr(RENDEZVOUS, True, "bool_val")
                marked += 1
    return marked


def set_rendezvous(workload: SimWorkload, rendezvous_s: float) -> None:
    """Give every marked TP collective of the workload's traces (attr RENDEZVOUS) `rendezvous_s` beyond
    its transfer (attr RENDEZVOUS_NS), in place; at 0 the attribute stays, at 0 ns, and costs nothing."""
    rendezvous_setter(workload)(rendezvous_s)


def rendezvous_setter(workload: SimWorkload) -> Callable[[float], None]:
    """`set_rendezvous` for one workload, with its marked collectives found once (a host fit sets the
    rendezvous of the same workload at every trial cost)."""
    marked = [n for c in workload.classes for n in c.trace.nodes
              if n.type == NodeType.COMM_COLL_NODE and n.attr(RENDEZVOUS, False)]

    def set_to(rendezvous_s: float) -> None:
        ns = int(round(float(rendezvous_s) * 1e9))
        for n in marked:
            n.set_attr(RENDEZVOUS_NS, ns, "uint64_val")

    return set_to
