"""In-memory Chakra ET: the data classes every part of calib passes around.

The codec (calib.chakra.codec) maps these to and from the protobuf wire format; the converter
builds them from PyTorch traces; the workload generator builds them from a model spec; both
simulators consume them. Attributes keep their protobuf `oneof` slot so that a read-write round
trip is byte-identical and consumers find each value in the slot they read (ATTR_SLOTS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

ET_VERSION = "0.0.4"


class NodeType(IntEnum):
    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CommType(IntEnum):
    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


# The slot each known attribute must be written in (chakra-et-format.md, "Attributes consumers read"),
# plus calib's own attributes. Unknown attributes keep whatever slot they were read with.
ATTR_SLOTS: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "pg_name": "string_val",
    "involved_dim": "bool_list",
    # calib's own
    "duration_ns": "uint64_val",  # exact measured/generated duration; preferred over duration_micros
    "wait_ns": "uint64_val",  # collective: time spent waiting for the slowest peer
    "transfer_ns": "uint64_val",  # collective: measured duration minus the wait
    "category": "string_val",  # compute | tp | pp | dp | ep | cpu | memcpy | memset | other
    "stream": "int64_val",
    "op_class": "string_val",  # gemm | attention | memory | other (calib.ops)
    "seq": "int64_val",  # collective sequence number within its process group
    "gap_ns": "uint64_val",  # converted ETs: idle time on the stream before this node (folded CPU time)
    "aten_op": "string_val",  # converted ETs: the aten op that launched this GPU activity
    "step": "int64_val",  # converted ETs: N of the profiler step (ProfilerStep#N) the node belongs to
    "coalesced_with": "int64_val",  # converted ETs: the node holding the coalesced NCCL kernel of this call
    "tp_rendezvous": "bool_val",  # a blocking collective of the TP group (calib.workload.host)
    "rendezvous_ns": "uint64_val",  # ... and what it keeps the compute stream beyond its transfer
}


@dataclass(slots=True)
class Attr:
    name: str
    value: Any
    slot: str = ""  # protobuf oneof field name, e.g. "int64_val"; "" = ATTR_SLOTS[name]

    def __post_init__(self) -> None:
        if not self.slot:
            self.slot = ATTR_SLOTS.get(self.name) or _infer_slot(self.value)


def _infer_slot(value: Any) -> str:
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "int64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, bytes):
        return "bytes_val"
    if isinstance(value, list | tuple):
        if all(isinstance(v, bool) for v in value):
            return "bool_list"
        if all(isinstance(v, int) for v in value):
            return "int64_list"
        if all(isinstance(v, float) for v in value):
            return "double_list"
        return "string_list"
    raise TypeError(f"cannot infer a Chakra attribute slot for {type(value).__name__}")


@dataclass(slots=True)
class IOInfo:
    values: str = ""
    shapes: str = ""
    types: str = ""


@dataclass(slots=True)
class Node:
    id: int
    name: str = ""
    type: NodeType = NodeType.COMP_NODE
    ctrl_deps: list[int] = field(default_factory=list)
    data_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    inputs: IOInfo | None = None
    outputs: IOInfo | None = None
    attrs: list[Attr] = field(default_factory=list)

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.attrs:
            if a.name == name:
                return a.value
        return default

    def set_attr(self, name: str, value: Any, slot: str = "") -> None:
        for a in self.attrs:
            if a.name == name:
                a.value = value
                if slot:
                    a.slot = slot
                return
        self.attrs.append(Attr(name, value, slot))

    @property
    def is_cpu_op(self) -> bool:
        return bool(self.attr("is_cpu_op", False))

    @property
    def duration_ns(self) -> int:
        """Exact duration when calib recorded one, else duration_micros x 1000."""
        exact = self.attr("duration_ns")
        return int(exact) if exact is not None else int(self.duration_micros) * 1000


@dataclass
class ExecutionTrace:
    """One rank's ET: GlobalMetadata (version, attrs) followed by its nodes."""

    nodes: list[Node] = field(default_factory=list)
    version: str = ET_VERSION
    metadata_attrs: list[Attr] = field(default_factory=list)

    def by_id(self) -> dict[int, Node]:
        return {n.id: n for n in self.nodes}

    def copy(self) -> ExecutionTrace:
        """A deep copy: what copy.deepcopy gives for these nodes, attributes and I/O infos, in a fraction of
        its time (a replay copies every converted ET it simulates)."""
        return ExecutionTrace(nodes=[_copy_node(n) for n in self.nodes], version=self.version,
                              metadata_attrs=[_copy_attr(a) for a in self.metadata_attrs])


def _copy_attr(a: Attr) -> Attr:
    v = a.value
    return Attr(a.name, list(v) if isinstance(v, list) else v, a.slot)


def _copy_io(io: IOInfo | None) -> IOInfo | None:
    return None if io is None else IOInfo(io.values, io.shapes, io.types)


def _copy_node(n: Node) -> Node:
    return Node(n.id, n.name, n.type, list(n.ctrl_deps), list(n.data_deps), n.start_time_micros, n.duration_micros,
                _copy_io(n.inputs), _copy_io(n.outputs), [_copy_attr(a) for a in n.attrs])
