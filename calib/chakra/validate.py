"""Validation of an in-memory ET: what ASTRA-sim's feeders and calib's simulator rely on.

Checks: unique node ids; every ctrl/data dependency names an existing node; the dependency graph is
acyclic; required attributes per node type are present in the slot consumers read them from
(COMM_COLL: comm_type + comm_size int64_val; SEND/RECV: comm_src, comm_dst, comm_tag int32_val and
comm_size int64_val); every known attribute (ATTR_SLOTS) sits in its slot.
"""

from __future__ import annotations

from calib.chakra.model import ATTR_SLOTS, CommType, ExecutionTrace, Node, NodeType
from calib.errors import CalibError

MAX_PROBLEMS = 50  # enough to act on; a broken generator would otherwise list a million lines

REQUIRED: dict[int, tuple[str, ...]] = {
    NodeType.COMM_COLL_NODE: ("comm_type", "comm_size"),
    NodeType.COMM_SEND_NODE: ("comm_src", "comm_dst", "comm_tag", "comm_size"),
    NodeType.COMM_RECV_NODE: ("comm_src", "comm_dst", "comm_tag", "comm_size"),
}
_VALID_TYPES = {int(t) for t in NodeType}
_COMM_TYPES = {int(t) for t in CommType}


def _node_problems(n: Node) -> list[str]:
    out: list[str] = []
    if int(n.type) not in _VALID_TYPES or n.type == NodeType.INVALID_NODE:
        out.append(f"node {n.id} ({n.name!r}): invalid node type {int(n.type)}")
    seen: dict[str, str] = {}
    for a in n.attrs:
        want = ATTR_SLOTS.get(a.name)
        if want is not None and a.slot != want:
            out.append(f"node {n.id} ({n.name!r}): attribute {a.name} is in {a.slot}, consumers read {want}")
        seen.setdefault(a.name, a.slot)
    for name in REQUIRED.get(int(n.type), ()):
        if name not in seen:
            out.append(f"node {n.id} ({n.name!r}): {NodeType(n.type).name} lacks required attribute {name}")
    if n.type == NodeType.COMM_COLL_NODE:
        ct = n.attr("comm_type")
        if ct is not None and seen.get("comm_type") == "int64_val" and int(ct) not in _COMM_TYPES:
            out.append(f"node {n.id} ({n.name!r}): unknown comm_type {ct}")
    return out


def problems(trace: ExecutionTrace) -> list[str]:
    """Every problem found, one line each (at most MAX_PROBLEMS, then a count line)."""
    out: list[str] = []
    ids: set[int] = set()
    for n in trace.nodes:
        if n.id in ids:
            out.append(f"node {n.id} ({n.name!r}): duplicate node id")
        ids.add(n.id)
        out.extend(_node_problems(n))
    for n in trace.nodes:
        for kind, deps in (("data_deps", n.data_deps), ("ctrl_deps", n.ctrl_deps)):
            for d in deps:
                if d not in ids:
                    out.append(f"node {n.id} ({n.name!r}): {kind} names missing node {d}")
    cycle = find_cycle(trace)
    if cycle:
        out.append("dependency cycle through nodes " + " -> ".join(map(str, cycle)))
    if len(out) > MAX_PROBLEMS:
        extra = len(out) - MAX_PROBLEMS
        out = out[:MAX_PROBLEMS] + [f"... and {extra} more problems"]
    return out


def find_cycle(trace: ExecutionTrace) -> list[int]:
    """One dependency cycle as a list of node ids (empty when acyclic); Kahn's algorithm, O(V+E)."""
    known = {n.id for n in trace.nodes}
    parents: dict[int, set[int]] = {i: set() for i in known}
    for n in trace.nodes:  # nodes sharing an id (a problem of its own) are treated as one node
        parents[n.id].update(d for d in (*n.data_deps, *n.ctrl_deps) if d in known)
    children: dict[int, list[int]] = {i: [] for i in known}
    for i, ps in parents.items():
        for p in ps:
            children[p].append(i)
    indeg = {i: len(ps) for i, ps in parents.items()}
    ready = [i for i, d in indeg.items() if d == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if done == len(indeg):
        return []
    # Walk back through unresolved parents from any unresolved node until a node repeats.
    left = {i for i, d in indeg.items() if d > 0}
    cur = next(iter(left))
    path: list[int] = []
    pos: dict[int, int] = {}
    while cur not in pos:
        pos[cur] = len(path)
        path.append(cur)
        cur = next(p for p in parents[cur] if p in left)
    cyc = path[pos[cur] :] + [cur]
    return list(reversed(cyc))


def check(trace: ExecutionTrace, source: str) -> None:
    """Raise one CalibError naming `source`, the number of problems and the first one."""
    found = problems(trace)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise CalibError(f"{source}: invalid Chakra ET: {found[0]}{more}")
