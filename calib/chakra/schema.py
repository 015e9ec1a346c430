"""The Chakra ET protobuf schema (package ChakraProtoMsg), built at run time without protoc.

Field numbers are the interface facts listed in shared/reference/chakra-et-format.md. Message
classes built from a FileDescriptorProto serialize byte-identically to protoc-generated ones.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "ChakraProtoMsg"

# oneof slot of AttributeProto -> (field number, scalar type or list message name)
_F = descriptor_pb2.FieldDescriptorProto
SCALAR_SLOTS: dict[str, tuple[int, int]] = {
    "double_val": (3, _F.TYPE_DOUBLE),
    "float_val": (5, _F.TYPE_FLOAT),
    "int32_val": (7, _F.TYPE_INT32),
    "int64_val": (9, _F.TYPE_INT64),
    "uint32_val": (11, _F.TYPE_UINT32),
    "uint64_val": (13, _F.TYPE_UINT64),
    "sint32_val": (15, _F.TYPE_SINT32),
    "sint64_val": (17, _F.TYPE_SINT64),
    "fixed32_val": (19, _F.TYPE_FIXED32),
    "fixed64_val": (21, _F.TYPE_FIXED64),
    "sfixed32_val": (23, _F.TYPE_SFIXED32),
    "sfixed64_val": (25, _F.TYPE_SFIXED64),
    "bool_val": (27, _F.TYPE_BOOL),
    "string_val": (29, _F.TYPE_STRING),
    "bytes_val": (31, _F.TYPE_BYTES),
}
LIST_SLOTS: dict[str, tuple[int, str, int]] = {
    "double_list": (4, "DoubleList", _F.TYPE_DOUBLE),
    "float_list": (6, "FloatList", _F.TYPE_FLOAT),
    "int32_list": (8, "Int32List", _F.TYPE_INT32),
    "int64_list": (10, "Int64List", _F.TYPE_INT64),
    "uint32_list": (12, "Uint32List", _F.TYPE_UINT32),
    "uint64_list": (14, "Uint64List", _F.TYPE_UINT64),
    "sint32_list": (16, "Sint32List", _F.TYPE_SINT32),
    "sint64_list": (18, "Sint64List", _F.TYPE_SINT64),
    "fixed32_list": (20, "Fixed32List", _F.TYPE_FIXED32),
    "fixed64_list": (22, "Fixed64List", _F.TYPE_FIXED64),
    "sfixed32_list": (24, "Sfixed32List", _F.TYPE_SFIXED32),
    "sfixed64_list": (26, "Sfixed64List", _F.TYPE_SFIXED64),
    "bool_list": (28, "BoolList", _F.TYPE_BOOL),
    "string_list": (30, "StringList", _F.TYPE_STRING),
    "bytes_list": (32, "BytesList", _F.TYPE_BYTES),
}
SLOTS = frozenset(SCALAR_SLOTS) | frozenset(LIST_SLOTS)

NODE_TYPES = [
    "INVALID_NODE",
    "METADATA_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
    "COMP_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "COMM_COLL_NODE",
]
COMM_TYPES = [
    "ALL_REDUCE",
    "REDUCE",
    "ALL_GATHER",
    "GATHER",
    "SCATTER",
    "BROADCAST",
    "ALL_TO_ALL",
    "REDUCE_SCATTER",
    "REDUCE_SCATTER_BLOCK",
    "BARRIER",
]


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    *,
    repeated: bool = False,
    type_name: str = "",
    oneof: int | None = None,
) -> None:
    f = msg.field.add(name=name, number=number, type=ftype)
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    fp = descriptor_pb2.FileDescriptorProto(name="calib_chakra_et_def.proto", package=PACKAGE, syntax="proto3")
    for _, list_name, vtype in LIST_SLOTS.values():
        lm = fp.message_type.add(name=list_name)
        _field(lm, "values", 1, vtype, repeated=True)

    attr = fp.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for slot, (num, stype) in SCALAR_SLOTS.items():
        _field(attr, slot, num, stype, oneof=0)
    for slot, (num, list_name, _) in LIST_SLOTS.items():
        _field(attr, slot, num, _F.TYPE_MESSAGE, type_name=list_name, oneof=0)
    attr.field.sort(key=lambda f: f.number)

    meta = fp.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, _F.TYPE_STRING)
    _field(meta, "attr", 2, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    io = fp.message_type.add(name="IOInfo")
    _field(io, "values", 1, _F.TYPE_STRING)
    _field(io, "shapes", 2, _F.TYPE_STRING)
    _field(io, "types", 3, _F.TYPE_STRING)

    tensor = fp.message_type.add(name="Tensor")
    for i, name in enumerate(["tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"], start=1):
        _field(tensor, name, i, _F.TYPE_UINT64)
    _field(tensor, "device", 6, _F.TYPE_STRING)

    node = fp.message_type.add(name="Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    f = node.field.add(name="type", number=3, type=_F.TYPE_ENUM, label=_F.LABEL_OPTIONAL)
    f.type_name = f".{PACKAGE}.NodeType"
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, repeated=True)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, repeated=True)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    nt = fp.enum_type.add(name="NodeType")
    for i, name in enumerate(NODE_TYPES):
        nt.value.add(name=name, number=i)
    ct = fp.enum_type.add(name="CollectiveCommType")
    for i, name in enumerate(COMM_TYPES):
        ct.value.add(name=name, number=i)
    return fp


@cache
def messages() -> dict[str, Any]:
    """Message classes by name: GlobalMetadata, Node, AttributeProto, IOInfo, Tensor and the lists."""
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(_file_proto())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in fd.message_types_by_name}
