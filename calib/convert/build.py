"""Build one rank's Chakra ET from its linked GPU activities.

Choices (docs/formats.md, "Converted ETs"):
- One node per GPU activity (kernel, memcpy, memset), each exactly once; node ids follow GPU start
  time, so every dependency points to a lower id and the graph is acyclic by construction.
- Compute kernels, memcpys and memsets are COMP nodes (category compute / memcpy / memset); NCCL
  kernels are COMM_COLL nodes, or COMM_SEND / COMM_RECV for send and recv.
- CPU ops are folded, not emitted: the host time between GPU work shows up as the idle gap on the
  stream before each node, kept in the `gap_ns` attribute (start minus the previous node's end on the
  same stream). A replay therefore gives the GPU-bound time of the step.
- Dependencies (data_deps): the previous node on the same stream; cross-stream waits
  (cudaEventRecord then cudaStreamWaitEvent on one CPU thread -> the op the thread launches next: before
  an NCCL kernel, the op launched last before the record by any thread on the stream of the thread's
  last compute launch, its current stream; before a compute kernel, the thread's own last launch);
  CUDA syncs (the next op of each stream launched after a synchronize depends on every stream's last
  op that had finished when it returned). A cross-stream
  dependency is kept only when the measured timeline agrees (the source ended before the target began).
- Collectives of one process group are chained (ctrl_deps) in issue order.
- send/recv carry comm_src, comm_dst and comm_tag = pg x 100000 + k, where k counts the messages of
  that (group, source, destination): NCCL delivers P2P messages of one pair in order, so the k-th
  send of a pair matches the peer's k-th recv without looking at the peer's trace.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType
from calib.convert.kineto import RECORD_CALLS, SYNC_CALLS, WAIT_CALLS, KinetoTrace
from calib.convert.link import LinkedOp

TIMELINE_TOLERANCE_NS = 100  # clock granularity between streams of one GPU
TAG_STRIDE = 100000


def micros_rounded(ns: int) -> int:
    """duration_micros: nearest whole microsecond (half up)."""
    return (int(ns) + 500) // 1000


def category_of(pg_desc: str) -> str:
    """tp / pp / dp / ep from Megatron's group descriptions; "comm" when the group's role is unknown."""
    d = pg_desc.upper()
    if "EXPERT" in d:
        return "ep"
    if "PIPELINE" in d or "EMBEDDING" in d:
        return "pp"
    if d.startswith("TENSOR_MODEL_PARALLEL"):
        return "tp"
    if d.startswith("DATA_PARALLEL") or d.startswith("INTRA_DATA_PARALLEL") or d.startswith("INTER_DATA_PARALLEL"):
        return "dp"
    return "comm"


def p2p_tag(pg_name: str, k: int) -> int:
    try:
        pg = int(pg_name)
    except ValueError:
        pg = sum(map(ord, pg_name))
    return (pg % 20000) * TAG_STRIDE + k % TAG_STRIDE


@dataclass
class CommInstance:
    """One collective / P2P call on one rank, for aligning it with the same call on the other ranks."""

    key: tuple[object, ...]
    rank: int
    node: Node
    op: LinkedOp
    start_ns: int
    dur_ns: int


@dataclass
class RankBuild:
    rank: int
    trace: ExecutionTrace
    ops: list[LinkedOp]  # in node-id order
    comms: list[CommInstance] = field(default_factory=list)
    groups: dict[str, list[int]] = field(default_factory=dict)  # pg_name -> global ranks used here


def _node(idx: int, op: LinkedOp, rank: int, gap_ns: int, p2p_count: dict[tuple[str, int, int], int]) -> Node:
    act = op.act
    node = Node(id=idx, name=act.name, start_time_micros=max(act.start_ns, 0) // 1000,
                duration_micros=micros_rounded(act.dur_ns))
    attrs: list[Attr] = [Attr("is_cpu_op", False)]
    c = op.comm
    if c is None:
        node.type = NodeType.COMP_NODE
        rec = op.record
        if rec.flops > 0:
            attrs.append(Attr("num_ops", int(rec.flops)))
        if rec.bytes > 0:
            attrs.append(Attr("tensor_size", int(rec.bytes)))
        category = act.kind if act.kind in ("memcpy", "memset") else "compute"
    elif c.comm_type is not None:
        node.type = NodeType.COMM_COLL_NODE
        attrs += [Attr("comm_type", int(c.comm_type)), Attr("comm_size", c.comm_size), Attr("pg_name", c.pg_name)]
        if c.seq is not None:
            attrs.append(Attr("seq", c.seq))
        category = category_of(c.pg_desc)
    else:
        assert c.peer is not None
        send = c.kind == "send"
        node.type = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
        src, dst = (rank, c.peer) if send else (c.peer, rank)
        pair = (c.pg_name, src, dst)
        k = p2p_count.get(pair, 0)
        p2p_count[pair] = k + 1
        attrs += [Attr("comm_src", src), Attr("comm_dst", dst), Attr("comm_tag", p2p_tag(c.pg_name, k)),
                  Attr("comm_size", c.comm_size), Attr("pg_name", c.pg_name)]
        if c.seq is not None:
            attrs.append(Attr("seq", c.seq))
        category = category_of(c.pg_desc)
    attrs += [Attr("duration_ns", act.dur_ns), Attr("gap_ns", gap_ns), Attr("category", category), Attr("stream", act.stream)]
    if c is None:
        attrs.append(Attr("op_class", op.record.op_class))
    if op.aten_op:
        attrs.append(Attr("aten_op", op.aten_op))
    if op.step:
        attrs.append(Attr("step", op.step))
    node.attrs = attrs
    return node


def _order(o: LinkedOp) -> tuple[int, int, int, int]:
    # the parts of a coalesced kernel share its start, stream and correlation: they follow it in part order
    return (o.act.start_ns, o.act.stream, o.act.correlation or 0, o.part)


def build_rank(rank: int, linked: list[LinkedOp], kt: KinetoTrace, host_name: str = "") -> RankBuild:
    ops = sorted(linked, key=_order)
    nodes: list[Node] = []
    last_on_stream: dict[int, int] = {}
    parts_on_stream: dict[int, list[int]] = {}  # extra parts of the last coalesced kernel per stream
    p2p_count: dict[tuple[str, int, int], int] = {}
    meta = [Attr("rank", rank), Attr("converted_by", "calib.convert/1"),
            Attr("host_trace", host_name), Attr("device_trace", kt.path.name)]
    build = RankBuild(rank, ExecutionTrace(nodes=nodes, metadata_attrs=meta), ops)
    last_on_group: dict[str, int] = {}
    ordinal: dict[str, int] = {}  # collectives seen per group, to align calls whose seq is unknown
    for idx, op in enumerate(ops):
        s = op.act.stream
        if op.part:
            # another call of the coalesced kernel just emitted: same predecessors, runs alongside it
            main = nodes[idx - op.part]
            node = _node(idx, op, rank, main.attr("gap_ns", 0), p2p_count)
            node.data_deps = list(main.data_deps)
            node.set_attr("coalesced_with", main.id, "int64_val")
            parts_on_stream.setdefault(s, []).append(idx)
        else:
            prev = last_on_stream.get(s)
            gap = 0
            if prev is not None:
                p = ops[prev].act
                gap = max(0, op.act.start_ns - (p.start_ns + p.dur_ns))
            node = _node(idx, op, rank, gap, p2p_count)
            if prev is not None:
                node.data_deps.append(prev)
            node.data_deps += parts_on_stream.pop(s, [])
            last_on_stream[s] = idx
        c = op.comm
        if c is not None:
            build.groups.setdefault(c.pg_name, c.ranks)
            if c.comm_type is not None:
                if not op.part:  # the parts of a coalesced kernel run together: no chain between them
                    g = last_on_group.get(c.pg_name)
                    if g is not None and ops[g].act.stream != s:
                        node.ctrl_deps.append(g)
                    last_on_group[c.pg_name] = idx
                k = ordinal.get(c.pg_name, 0)
                ordinal[c.pg_name] = k + 1
                # without torch's seq (no host op), the k-th call on a group is the k-th on every member
                key: tuple[object, ...] = ("coll", c.pg_name, c.seq) if c.seq is not None else ("coll-ord", c.pg_name, k)
            else:
                key = ("p2p", c.pg_name, node.attr("comm_src"), node.attr("comm_dst"), node.attr("comm_tag"))
            build.comms.append(CommInstance(key, rank, node, op, op.act.start_ns, op.act.dur_ns))
        nodes.append(node)
    _cross_stream_deps(ops, nodes, kt)
    for idx, op in enumerate(ops):
        if op.part:  # cross-stream dependencies were found for the kernel's node: its parts share them
            nodes[idx].data_deps = list(nodes[idx - op.part].data_deps)
    return build


def _cross_stream_deps(ops: list[LinkedOp], nodes: list[Node], kt: KinetoTrace) -> None:
    by_corr = {int(op.act.correlation): i for i, op in enumerate(ops)
               if op.act.correlation is not None and op.launch is not None}
    streams = {op.act.stream for op in ops}
    precise = kt.stream_waits  # from CUDA sync events, when the profiler recorded them
    launched_on: dict[int, list[tuple[int, int]]] = {}  # stream -> [(launch ts, op index)] in launch order
    pending_stream: dict[int, set[int]] = {}  # stream -> sources its next launched op must wait for
    thread_last: dict[object, int] = {}
    # per thread: at its last event record, (its own last launch, the last launch by any thread on
    # its current stream); a wait hands the pair to the thread's next launch
    thread_record: dict[object, tuple[int | None, int | None]] = {}
    thread_stream: dict[object, int] = {}  # the stream of each thread's last compute launch
    thread_wait: dict[object, tuple[int | None, int | None]] = {}
    stream_last_launched: dict[int, int] = {}
    pending_sync: dict[int, set[int]] = {}

    def add(src: int, dst: int) -> None:
        a, b = ops[src].act, ops[dst].act
        if src >= dst or a.stream == b.stream:
            return
        if a.start_ns + a.dur_ns > b.start_ns + TIMELINE_TOLERANCE_NS:
            return  # the measured timeline says they overlapped: not a real dependency
        if src not in nodes[dst].data_deps:
            nodes[dst].data_deps.append(src)

    for call in kt.calls:
        i = by_corr.get(int(call.correlation)) if call.correlation is not None else None
        if i is not None:
            s = ops[i].act.stream
            w = thread_wait.pop(call.tid, None)
            if w is not None:
                # Before an NCCL kernel, the event was recorded on the thread's current stream
                # (ProcessGroupNCCL's stream sync), which captures every thread's launches there: a
                # send of the main thread waits for the backward the autograd engine's thread
                # launched. Before a compute kernel, it was the end event of the thread's own last
                # (NCCL) launch.
                src = w[1] if ops[i].comm is not None and w[1] is not None else w[0]
                if src is not None:
                    add(src, i)
            for src in pending_sync.pop(s, ()):
                add(src, i)
            for src in pending_stream.pop(s, ()):
                add(src, i)
            thread_last[call.tid] = i
            if ops[i].comm is None:
                thread_stream[call.tid] = s
            stream_last_launched[s] = i
            launched_on.setdefault(s, []).append((call.ts_ns, i))
        elif call.correlation is not None and int(call.correlation) in precise:
            stream, waited_on, record_corr = precise[int(call.correlation)]
            rec = kt.launches.get(record_corr)
            hist = launched_on.get(waited_on, [])
            k = len(hist) if rec is None else bisect.bisect_right(hist, (rec.ts_ns, len(ops)))
            if k:
                pending_stream.setdefault(stream, set()).add(hist[k - 1][1])
        elif call.name in RECORD_CALLS:
            s = thread_stream.get(call.tid)
            thread_record[call.tid] = (thread_last.get(call.tid), None if s is None else stream_last_launched[s])
        elif call.name in WAIT_CALLS:
            r = thread_record.get(call.tid)
            if r is not None and r != (None, None):
                thread_wait[call.tid] = r
        elif call.name in SYNC_CALLS:
            end = call.ts_ns + call.dur_ns
            barrier = {j for j in stream_last_launched.values()
                       if ops[j].act.start_ns + ops[j].act.dur_ns <= end + TIMELINE_TOLERANCE_NS}
            if barrier:
                for s in streams:
                    pending_sync.setdefault(s, set()).update(barrier)
    # Of several dependencies on one other stream only the latest matters (stream order implies the rest).
    for i, node in enumerate(nodes):
        if len(node.data_deps) > 2:
            own = ops[i].act.stream
            latest: dict[int, int] = {}
            for d in node.data_deps:
                s = ops[d].act.stream
                if s != own:
                    latest[s] = max(latest.get(s, -1), d)
            node.data_deps = [d for d in node.data_deps if ops[d].act.stream == own or latest[ops[d].act.stream] == d]
