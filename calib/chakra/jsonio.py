"""ET <-> JSON-able dict: for people reading a trace and for tests; lossless (slots kept).

Layout: {"schema": "calib.chakra-json/1", "version", "metadata_attrs": [attr...], "nodes": [node...]}
with node = {"id", "name", "type" (NodeType name), "ctrl_deps", "data_deps", "start_time_micros",
"duration_micros", "inputs"/"outputs" ({"values","shapes","types"}, omitted when absent), "attrs"} and
attr = {"name", "slot", "value"}; bytes values are written as hex strings.
"""

from __future__ import annotations

from typing import Any

from calib.chakra.model import Attr, ExecutionTrace, IOInfo, Node, NodeType
from calib.errors import CalibError

SCHEMA = "calib.chakra-json/1"


def _attr_json(a: Attr) -> dict[str, Any]:
    v = a.value
    if a.slot == "bytes_val":
        v = bytes(v).hex()
    elif a.slot == "bytes_list":
        v = [bytes(x).hex() for x in v]
    return {"name": a.name, "slot": a.slot, "value": v}


def _attr_from(d: dict[str, Any]) -> Attr:
    v = d.get("value")
    slot = d["slot"]
    if slot == "bytes_val":
        v = bytes.fromhex(v)
    elif slot == "bytes_list":
        v = [bytes.fromhex(x) for x in v]
    return Attr(d["name"], v, slot)


def _io(io: IOInfo) -> dict[str, str]:
    return {"values": io.values, "shapes": io.shapes, "types": io.types}


def node_to_json(n: Node) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": n.id,
        "name": n.name,
        "type": NodeType(n.type).name if int(n.type) in NodeType._value2member_map_ else int(n.type),
        "ctrl_deps": list(n.ctrl_deps),
        "data_deps": list(n.data_deps),
        "start_time_micros": n.start_time_micros,
        "duration_micros": n.duration_micros,
    }
    if n.inputs is not None:
        d["inputs"] = _io(n.inputs)
    if n.outputs is not None:
        d["outputs"] = _io(n.outputs)
    d["attrs"] = [_attr_json(a) for a in n.attrs]
    return d


def to_json(trace: ExecutionTrace) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": trace.version,
        "metadata_attrs": [_attr_json(a) for a in trace.metadata_attrs],
        "nodes": [node_to_json(n) for n in trace.nodes],
    }


def from_json(data: dict[str, Any]) -> ExecutionTrace:
    try:
        nodes = []
        for d in data["nodes"]:
            t = d.get("type", "COMP_NODE")
            nodes.append(
                Node(
                    id=int(d["id"]),
                    name=d.get("name", ""),
                    type=NodeType[t] if isinstance(t, str) else NodeType(int(t)),
                    ctrl_deps=[int(x) for x in d.get("ctrl_deps", [])],
                    data_deps=[int(x) for x in d.get("data_deps", [])],
                    start_time_micros=int(d.get("start_time_micros", 0)),
                    duration_micros=int(d.get("duration_micros", 0)),
                    inputs=IOInfo(**d["inputs"]) if "inputs" in d else None,
                    outputs=IOInfo(**d["outputs"]) if "outputs" in d else None,
                    attrs=[_attr_from(a) for a in d.get("attrs", [])],
                )
            )
        return ExecutionTrace(
            nodes=nodes,
            version=data.get("version", ""),
            metadata_attrs=[_attr_from(a) for a in data.get("metadata_attrs", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CalibError(f"ET JSON is malformed: {type(exc).__name__}: {exc}") from None
