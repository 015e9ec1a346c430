"""A one-screen summary of an ET: node counts, compute/communication time, collectives by kind."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from calib.chakra.model import CommType, ExecutionTrace, NodeType

_COMM = {NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE}


@dataclass
class CollectiveGroup:
    """Communication nodes of one (kind, bytes, group): kind is a CommType name, SEND or RECV."""

    kind: str
    bytes: int
    pg_name: str
    count: int = 0
    time_s: float = 0.0


@dataclass
class TraceSummary:
    nodes: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    cpu_ops: int = 0
    compute_time_s: float = 0.0  # GPU COMP nodes (is_cpu_op false), summed over streams
    comm_time_s: float = 0.0  # COMM_* nodes, summed
    cpu_time_s: float = 0.0  # is_cpu_op nodes
    collectives: list[CollectiveGroup] = field(default_factory=list)


def _kind(node_type: NodeType, comm_type: object) -> str:
    if node_type == NodeType.COMM_SEND_NODE:
        return "SEND"
    if node_type == NodeType.COMM_RECV_NODE:
        return "RECV"
    try:
        return CommType(int(comm_type)).name  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"comm_type={comm_type}"


def summarize(trace: ExecutionTrace) -> TraceSummary:
    s = TraceSummary(nodes=len(trace.nodes))
    types: Counter[str] = Counter()
    groups: dict[tuple[str, int, str], CollectiveGroup] = {}
    for n in trace.nodes:
        t = NodeType(n.type) if int(n.type) in NodeType._value2member_map_ else None
        types[t.name if t is not None else str(int(n.type))] += 1
        dur_s = n.duration_ns * 1e-9
        if n.is_cpu_op:
            s.cpu_ops += 1
            s.cpu_time_s += dur_s
        elif t == NodeType.COMP_NODE:
            s.compute_time_s += dur_s
        elif t in _COMM:
            s.comm_time_s += dur_s
            key = (_kind(t, n.attr("comm_type")), int(n.attr("comm_size", 0) or 0), str(n.attr("pg_name", "") or ""))
            g = groups.get(key)
            if g is None:
                g = groups[key] = CollectiveGroup(*key)
            g.count += 1
            g.time_s += dur_s
    s.by_type = dict(types.most_common())
    s.collectives = sorted(groups.values(), key=lambda g: (g.kind, g.pg_name, g.bytes))
    return s
