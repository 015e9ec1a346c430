"""The embedded simulator: event-driven replay of Chakra ETs with ASTRA-sim's semantics.

Per simulated rank: data and control dependencies; ready nodes issued in ascending id order, a
node whose resource is busy skipped until it frees; at most one GPU compute node, one CPU op and
one communication node (receives excepted) in flight. Compute takes its duration (`duration_ns`
attribute, else duration_micros x 1000, 0 -> 1 ns) or the roofline time; BROADCAST replays its
duration; ALL_REDUCE / REDUCE_SCATTER / ALL_GATHER / ALL_TO_ALL are synchronised across their
group (matched by issue order within the group) and timed by calib.sim.collectives, each member's
node then held its attr `rendezvous_ns` longer (calib.workload.host: the TP rendezvous); sends are
eager (network time only) and a receive ends when its message (same source, destination, tag
and size) has arrived. Exposed communication = finish - GPU compute time (so CPU-op time counts
as exposed, as ASTRA-sim reports it).

Symmetry: only each rank class's representative is simulated. A collective whose group lies
inside the issuing class needs no one else (every member starts when the representative does);
a group spanning several classes must contain each spanned class's representative, and waits
for all of them. A send/recv peer stands for its class representative.
"""

from __future__ import annotations

import gc
import heapq
import json
import time
from collections import deque
from dataclasses import dataclass, field

from calib.chakra.codec import write_bytes_atomic
from calib.chakra.model import Attr, CommType, Node, NodeType
from calib.errors import CalibError
from calib.sim.collectives import KINDS, CollectiveTimer
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.network import MultiDimTopology
from calib.sim.types import SimResult, SimWorkload

GPU, CPU, COMM, FREE = 0, 1, 2, 3  # resource a node occupies; FREE: receives and metadata
_KIND_OF_COMM = {int(k): v for k, v in KINDS.items()}  # comm_type value -> collective kind


@dataclass
class _Timeline:
    """One simulated rank (a class representative)."""

    index: int
    rep: int
    nodes: list[Node]
    resource: list[int]
    children: list[list[int]]
    pending: list[int]
    duration: list[Attr | None]  # each node's duration_ns attribute, read when the node is issued
    ready: list[list[int]] = field(default_factory=lambda: [[], [], []])
    busy: list[bool] = field(default_factory=lambda: [False, False, False])
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    done: int = 0
    finish: int = 0
    gpu_ns: int = 0
    issued_coll: dict[str, int] = field(default_factory=dict)  # pg -> collectives issued so far
    waiting: dict[int, str] = field(default_factory=dict)  # node index -> why it is in flight


def _roofline_ns(node: Node, system: SystemConfig) -> int:
    """A GPU compute node's time with the roofline enabled. ASTRA-sim: a node without tensor_size is
    skipped (0 ns); else num_ops over the roofline min(peak, memory bandwidth x intensity), truncated to ns
    (no 1-ns floor here)."""
    size = float(node.attr("tensor_size", 0) or 0)
    if size == 0:
        return 0
    ops = float(node.attr("num_ops", 0) or 0)
    perf = min(system.peak_perf_tflops * 1e12, system.local_mem_bw_gbps * 1e9 * (ops / size))
    return int(ops / perf * 1e9) if perf > 0 else 0


def _rendezvous_ns(node: Node) -> int:
    """What a blocking TP collective keeps its rank's compute stream beyond its transfer (attr
    rendezvous_ns, calib.workload.host)."""
    ns = node.attr("rendezvous_ns")
    if not ns:
        return 0
    if int(ns) < 0:
        raise CalibError(f"node {node.id} ({node.name!r}) has a negative rendezvous_ns {ns}")
    return int(ns)


def _resource(node: Node) -> int:
    if node.type == NodeType.COMP_NODE:
        return CPU if node.is_cpu_op else GPU
    if node.type in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE):
        return COMM  # ASTRA-sim refuses communication marked is_cpu_op; calib ignores the flag there
    if node.type == NodeType.COMM_RECV_NODE:
        return FREE
    if node.type in (NodeType.INVALID_NODE, NodeType.METADATA_NODE, NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
        return FREE  # completed as soon as ready (ASTRA-sim skips invalid and metadata nodes)
    raise CalibError(f"node {node.id} ({node.name!r}) has node type {int(node.type)}, which cannot be simulated")


@dataclass(frozen=True)
class _Graph:
    """What a rank's replay reads but never changes: its nodes in id order, each one's resource and
    children, and how many dependencies each waits for at the start."""

    nodes: list[Node]
    resource: list[int]
    children: list[list[int]]
    pending: list[int]
    # Each node's duration_ns attribute (its first, as Node.attr reads it): a re-costed workload of fixed
    # structure changes the attribute's value, which the replay reads when it issues the node.
    duration: list[Attr | None]


def _graph(rep: int, trace_nodes: list[Node]) -> _Graph:
    nodes = sorted(trace_nodes, key=lambda n: n.id)
    pos: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.id in pos:
            raise CalibError(f"rank {rep}: node id {n.id} appears twice in its ET")
        pos[n.id] = i
    children: list[list[int]] = [[] for _ in nodes]
    pending = [0] * len(nodes)
    for i, n in enumerate(nodes):
        for d in dict.fromkeys([*n.data_deps, *n.ctrl_deps]):
            j = pos.get(d)
            if j is None:
                raise CalibError(f"rank {rep}: node {n.id} ({n.name!r}) depends on node {d}, which is not in its ET")
            children[j].append(i)
            pending[i] += 1
    _check_acyclic(rep, nodes, children, pending)
    try:
        resources = [_resource(n) for n in nodes]
    except CalibError as exc:
        raise CalibError(f"rank {rep}: {exc}") from None
    duration = [next((a for a in n.attrs if a.name == "duration_ns"), None) for n in nodes]
    return _Graph(nodes, resources, children, pending, duration)


def _timelines(workload: SimWorkload) -> list[_Timeline]:
    """One fresh timeline per rank class; the graphs of a workload of fixed structure are kept on it."""
    if workload.fixed_structure and len(workload.graphs) == len(workload.classes):
        graphs = workload.graphs
    else:
        graphs = [_graph(c.rep, c.trace.nodes) for c in workload.classes]
        if workload.fixed_structure:
            workload.graphs = graphs
    return [_Timeline(i, c.rep, g.nodes, g.resource, g.children, list(g.pending), g.duration, start=[-1] * len(g.nodes),
                      end=[-1] * len(g.nodes)) for i, (c, g) in enumerate(zip(workload.classes, graphs, strict=True))]


def _check_acyclic(rep: int, nodes: list[Node], children: list[list[int]], pending: list[int]) -> None:
    left = list(pending)
    todo = deque(i for i, p in enumerate(left) if p == 0)
    seen = 0
    while todo:
        i = todo.popleft()
        seen += 1
        for c in children[i]:
            left[c] -= 1
            if left[c] == 0:
                todo.append(c)
    if seen < len(nodes):
        stuck = next(i for i, p in enumerate(left) if p > 0)
        raise CalibError(f"rank {rep}: node {nodes[stuck].id} ({nodes[stuck].name!r}) is on a dependency cycle")


@dataclass
class _Coll:
    """One collective instance being assembled: which timelines have issued it, and when."""

    members: list[int]
    kind: str
    size: int
    arrivals: dict[int, tuple[int, int]] = field(default_factory=dict)  # timeline -> (time, node index)
    needed: int = 0


class AnalyticalSimulator:
    """Replays a SimWorkload on a network; see the module docstring for the semantics."""

    def __init__(self, workload: SimWorkload, network: NetworkConfig, system: SystemConfig) -> None:
        network.check_ranks(workload.num_ranks)
        if system.roofline_enabled and not (system.peak_perf_tflops and system.local_mem_bw_gbps):
            raise CalibError("system configuration: roofline-enabled needs peak-perf and local-mem-bw")
        self.wl = workload
        self.system = system
        self.topo = MultiDimTopology(network)
        self.timer = CollectiveTimer(self.topo, system)
        self.class_of = workload.class_of()
        missing = [r for r, c in enumerate(self.class_of) if c < 0]
        if missing:
            raise CalibError(f"workload: rank {missing[0]} belongs to no rank class ({len(missing)} ranks unassigned)")
        self.timelines = _timelines(workload)
        self.world = list(range(workload.num_ranks))
        self._groups: dict[str, list[int]] = {}
        self._spans: dict[str, frozenset[int]] = {}
        self._positions: dict[tuple[str, int], int] = {}

    # -- helpers -------------------------------------------------------------------------------
    def _group(self, tl: _Timeline, node: Node) -> tuple[str, list[int]]:
        pg = node.attr("pg_name")
        pg = "" if pg in (None, "", "0") else str(pg)
        if not pg:
            return pg, self.world
        members = self._groups.get(pg)
        if members is None:
            try:
                members = list(self.wl.comm_groups[int(pg)])
            except (KeyError, ValueError):
                raise CalibError(
                    f"rank {tl.rep}: node {node.id} ({node.name!r}) names process group {pg!r}, which is not in the comm groups"
                ) from None
            self._groups[pg] = members
        return pg, members

    def _spanned(self, pg: str, members: list[int]) -> frozenset[int]:
        got = self._spans.get(pg)
        if got is None:
            got = self._spans[pg] = frozenset(self.class_of[m] for m in members)
        return got

    def _position(self, pg: str, members: list[int], rank: int) -> int:
        key = (pg, rank)
        got = self._positions.get(key)
        if got is None:
            got = self._positions[key] = members.index(rank) if rank in members else 0
        return got

    # -- the replay ----------------------------------------------------------------------------
    def run(self, timeline_path: str | None = None, breakdown: bool = True) -> SimResult:
        # The replay allocates millions of short-lived objects and frees none of them in cycles;
        # the cyclic collector would only rescan them (a third of the run time at 8,192 GPUs).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(timeline_path, breakdown)
        finally:
            if enabled:
                gc.enable()

    def _run(self, timeline_path: str | None, breakdown: bool = True) -> SimResult:
        t_wall = time.perf_counter()
        heap: list[tuple[int, int, int, int]] = []  # (time, seq, timeline, node index)
        seq = 0
        colls: dict[tuple, _Coll] = {}
        sends: dict[tuple, deque] = {}  # key -> deque of arrival times (unclaimed messages)
        recvs: dict[tuple, deque] = {}  # key -> deque of (timeline, node index, issue time)
        events: list[tuple] | None = [] if timeline_path else None
        system = self.system
        class_of = self.class_of
        tls = self.timelines
        roofline = system.roofline_enabled
        heappush, heappop = heapq.heappush, heapq.heappop
        COMP = NodeType.COMP_NODE

        def finish_at(tl: _Timeline, i: int, t: int) -> None:
            nonlocal seq
            heappush(heap, (t, seq, tl.index, i))
            seq += 1

        def issue(tl: _Timeline, i: int, t: int) -> None:
            node = tl.nodes[i]
            tl.start[i] = t
            ntype = node.type
            if ntype == COMP:
                gpu = tl.resource[i] == GPU
                if roofline and gpu:
                    d = _roofline_ns(node, system)
                else:  # Node.duration_ns, from the attribute found once (_Graph.duration), at least 1 ns
                    a = tl.duration[i]
                    v = None if a is None else a.value
                    d = int(v) if v is not None else int(node.duration_micros) * 1000
                    if d < 0:  # only a duration_ns attribute in a signed slot can be negative; never clamp it
                        raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) has a negative duration ({d} ns)")
                    if d == 0:
                        d = 1
                if gpu:
                    tl.gpu_ns += d
                finish_at(tl, i, t + d)
            elif ntype == NodeType.COMM_COLL_NODE:
                collective(tl, i, t)
            elif ntype == NodeType.COMM_SEND_NODE:
                src, dst, key, size = p2p_key(tl, node)
                arrive = t + self.topo.message_ns(src, dst, size)
                finish_at(tl, i, arrive)
                q = recvs.get(key)
                if q:
                    rtl, ri, rt = q.popleft()
                    finish_at(tls[rtl], ri, max(rt, arrive))
                else:
                    sends.setdefault(key, deque()).append(arrive)
            elif ntype == NodeType.COMM_RECV_NODE:
                _, _, key, _ = p2p_key(tl, node)
                q = sends.get(key)
                if q:
                    finish_at(tl, i, max(t, q.popleft()))
                else:
                    recvs.setdefault(key, deque()).append((tl.index, i, t))
                    tl.waiting[i] = "recv"
            else:
                finish_at(tl, i, t)

        def p2p_key(tl: _Timeline, node: Node) -> tuple[int, int, tuple, int]:
            src = node.attr("comm_src")
            dst = node.attr("comm_dst")
            size = node.attr("comm_size")
            tag = node.attr("comm_tag", 0)
            if node.type == NodeType.COMM_SEND_NODE:
                src = tl.rep if src is None else src
            else:
                dst = tl.rep if dst is None else dst
            if src is None or dst is None or size is None:
                raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) needs comm_src/comm_dst and comm_size")
            if int(size) < 0:
                raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) has a negative comm_size {size}")
            n = self.wl.num_ranks
            if not (0 <= src < n and 0 <= dst < n):
                raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) names peer outside the {n} ranks ({src} -> {dst})")
            return src, dst, (class_of[src], class_of[dst], tag, int(size)), int(size)

        def collective(tl: _Timeline, i: int, t: int) -> None:
            node = tl.nodes[i]
            ctype = node.attr("comm_type")
            if ctype is None:
                raise CalibError(f"rank {tl.rep}: collective node {node.id} ({node.name!r}) has no comm_type")
            if int(ctype) == CommType.BROADCAST:  # not simulated by ASTRA-sim: its duration is replayed
                d = node.duration_ns
                finish_at(tl, i, t + (d if d > 0 else 1))
                return
            kind = _KIND_OF_COMM.get(int(ctype))
            if kind is None:
                raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) has collective type {ctype}, which cannot be simulated")
            size = int(node.attr("comm_size", 0) or 0)
            if size < 0:
                raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) has a negative comm_size {size}")
            pg, members = self._group(tl, node)
            spanned = self._spanned(pg, members)
            if len(spanned) == 1 and tl.index in spanned:  # the group is this class: all start now
                try:
                    fin = self.timer.finish_times(kind, size, members, [t] * len(members), group_key=pg)
                except CalibError as exc:
                    raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}): {exc}") from None
                finish_at(tl, i, fin[self._position(pg, members, tl.rep)] + _rendezvous_ns(node))
                return
            if tl.rep not in members:
                raise CalibError(
                    f"rank {tl.rep}: node {node.id} ({node.name!r}) uses group {pg or 'world'} spanning several rank "
                    "classes without being a member; simulate this workload per rank"
                )
            k = tl.issued_coll.get(pg, 0)
            tl.issued_coll[pg] = k + 1
            key = (pg, k)
            inst = colls.get(key)
            if inst is None:
                reps = {tls[c].rep for c in spanned}
                outside = [r for r in reps if r not in members]
                if outside:
                    raise CalibError(
                        f"group {pg or 'world'} spans the class of rank {outside[0]} but not that rank; "
                        "simulate this workload per rank"
                    )
                inst = colls[key] = _Coll(members, kind, size, needed=len(spanned))
            elif (inst.kind, inst.size) != (kind, size):
                raise CalibError(
                    f"rank {tl.rep}: collective node {node.id} ({node.name!r}) is {kind} of {size} bytes but the "
                    f"{k + 1}-th collective of group {pg or 'world'} elsewhere is {inst.kind} of {inst.size} bytes"
                )
            inst.arrivals[tl.index] = (t, i)
            tl.waiting[i] = f"collective {k + 1} of group {pg or 'world'}"
            if len(inst.arrivals) == inst.needed:
                del colls[key]
                starts = [inst.arrivals[class_of[m]][0] for m in members]
                try:
                    fin = self.timer.finish_times(kind, size, members, starts, group_key=pg)
                except CalibError as exc:
                    raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}): {exc}") from None
                where = {m: j for j, m in enumerate(members)}
                for c, (_, ni) in inst.arrivals.items():
                    ctl = tls[c]
                    ctl.waiting.pop(ni, None)
                    finish_at(ctl, ni, fin[where[ctl.rep]] + _rendezvous_ns(ctl.nodes[ni]))

        def dispatch(tl: _Timeline, t: int) -> None:
            for res in (GPU, CPU, COMM):
                q = tl.ready[res]
                if q and not tl.busy[res]:
                    i = heappop(q)
                    tl.busy[res] = True
                    issue(tl, i, t)

        for tl in tls:
            for i, p in enumerate(tl.pending):
                if p == 0:
                    if tl.resource[i] == FREE:
                        issue(tl, i, 0)
                    else:
                        heappush(tl.ready[tl.resource[i]], i)
            dispatch(tl, 0)
        # The loop below is make_ready and dispatch written out: it runs once per node of every class.
        while heap:
            t, _, c, i = heappop(heap)
            tl = tls[c]
            resource, busy, ready, pending = tl.resource, tl.busy, tl.ready, tl.pending
            res = resource[i]
            if res != FREE:
                busy[res] = False
            tl.done += 1
            tl.finish = t
            tl.end[i] = t
            if events is not None:
                self._event(events, tl, i, t)
            for ch in tl.children[i]:
                left = pending[ch] - 1
                pending[ch] = left
                if left == 0:
                    r = resource[ch]
                    if r == FREE:
                        issue(tl, ch, t)
                    else:
                        heappush(ready[r], ch)
            for r in (GPU, CPU, COMM):
                q = ready[r]
                if q and not busy[r]:
                    j = heappop(q)
                    busy[r] = True
                    issue(tl, j, t)
        self._check_complete(sends)
        if events is not None and timeline_path:
            _write_json_atomic(timeline_path, {"traceEvents": events, "displayTimeUnit": "ns"})
        return self._result(time.perf_counter() - t_wall, breakdown)

    def _event(self, events: list, tl: _Timeline, i: int, t: int) -> None:
        node = tl.nodes[i]
        res = tl.resource[i]
        events.append({
            "name": node.name or f"node {node.id}", "ph": "X", "pid": tl.rep,
            "tid": ("gpu", "cpu", "comm", "recv")[res], "ts": tl.start[i] / 1000.0, "dur": (t - tl.start[i]) / 1000.0,
            "cat": str(node.attr("category") or ""), "args": {"id": node.id},
        })

    def _check_complete(self, sends: dict) -> None:
        for tl in self.timelines:
            if tl.done == len(tl.nodes):
                continue
            if tl.waiting:
                i, why = min(tl.waiting.items())
                node = tl.nodes[i]
                if why == "recv":
                    raise CalibError(
                        f"rank {tl.rep}: receive node {node.id} ({node.name!r}) from rank {node.attr('comm_src')} "
                        f"tag {node.attr('comm_tag')} never gets its message (no matching send)"
                    )
                raise CalibError(
                    f"rank {tl.rep}: node {node.id} ({node.name!r}) waits forever for {why}: "
                    "some group members never issue it (deadlock)"
                )
            i = next(j for j in range(len(tl.nodes)) if tl.start[j] < 0)
            node = tl.nodes[i]
            raise CalibError(f"rank {tl.rep}: node {node.id} ({node.name!r}) never becomes ready (deadlock)")
        for (sc, dc, tag, size), q in sends.items():
            if q:
                raise CalibError(
                    f"rank {self.timelines[sc].rep}: a send to rank {self.timelines[dc].rep} (tag {tag}, {size} bytes) "
                    "has no matching receive"
                )

    def _result(self, wall_s: float, breakdown: bool = True) -> SimResult:
        n = self.wl.num_ranks
        finish = [0] * n
        exposed = [0] * n
        busy_all: list[dict[str, int]] = [{} for _ in range(n)]
        exposed_all: list[dict[str, int]] = [{} for _ in range(n)]
        for tl, cls in zip(self.timelines, self.wl.classes, strict=True):
            busy, exp = _categories(tl) if breakdown else ({}, {})
            for m in cls.members:
                finish[m] = tl.finish
                exposed[m] = max(0, tl.finish - tl.gpu_ns)
                busy_all[m] = busy
                exposed_all[m] = exp
        return SimResult(
            backend="analytical", finish_ns=finish, exposed_comm_ns=exposed, busy_ns=busy_all, exposed_ns=exposed_all,
            wall_s=wall_s, simulated_ranks=len(self.timelines),
        )


def _category(node: Node, res: int) -> str:
    cat = node.attr("category")
    if cat:
        return str(cat)
    if res == GPU:
        return "compute"
    if res == CPU:
        return "cpu"
    return "comm"


def _categories(tl: _Timeline) -> tuple[dict[str, int], dict[str, int]]:
    """Busy time per category, and for non-compute categories the part not under GPU compute."""
    spans: dict[str, list[tuple[int, int]]] = {}
    compute: list[tuple[int, int]] = []
    for i, node in enumerate(tl.nodes):
        s = tl.start[i]
        if s < 0 or node.type in (NodeType.METADATA_NODE,):
            continue
        end = tl.end[i]
        res = tl.resource[i]
        cat = _category(node, res)
        spans.setdefault(cat, []).append((s, end))
        if res == GPU:
            compute.append((s, end))
    compute_union = _union(compute)
    busy = {}
    exposed = {}
    for cat, v in spans.items():
        u = _union(v)
        busy[cat] = sum(e - s for s, e in u)
        if cat != "compute":
            exposed[cat] = busy[cat] - _overlap_len(u, compute_union)
    return busy, exposed


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _overlap_len(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _write_json_atomic(path: str, data: dict) -> None:
    write_bytes_atomic(path, json.dumps(data).encode())


def simulate_analytical(
    workload: SimWorkload, network: NetworkConfig, system: SystemConfig, timeline_path: str | None = None,
    breakdown: bool = True,
) -> SimResult:
    # Building the timelines allocates as much as replaying them: keep the collector off for both.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return AnalyticalSimulator(workload, network, system).run(timeline_path, breakdown)
    finally:
        if enabled:
            gc.enable()
