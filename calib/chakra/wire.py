"""A fast hand-written protobuf encoder for Chakra Nodes (the hot path of writing big ETs).

It produces exactly the bytes the protobuf runtime produces (fields in number order, proto3
defaults omitted, oneof values always written, packed repeated numbers); the tests compare both on
every reference ET and on every attribute slot. Encoded attributes are cached by (name, slot,
value), since generated ETs repeat the same few attributes hundreds of thousands of times. Any
value it is not sure about raises _Unsupported and the caller falls back to the protobuf runtime,
which also produces the error message for values that do not fit their slot.
"""

from __future__ import annotations

import struct
from typing import Any

from calib.chakra.model import Attr, IOInfo, Node, NodeType
from calib.chakra.schema import LIST_SLOTS, SCALAR_SLOTS


class Unsupported(Exception):
    """A value this encoder does not handle; use the protobuf runtime instead."""


_MASK64 = (1 << 64) - 1
_VARINT = {"int32_val", "int64_val", "uint32_val", "uint64_val", "bool_val"}
_RANGES = {
    "int32_val": (-(1 << 31), (1 << 31) - 1),
    "int64_val": (-(1 << 63), (1 << 63) - 1),
    "uint32_val": (0, (1 << 32) - 1),
    "uint64_val": (0, _MASK64),
    "sint32_val": (-(1 << 31), (1 << 31) - 1),
    "sint64_val": (-(1 << 63), (1 << 63) - 1),
    "fixed32_val": (0, (1 << 32) - 1),
    "fixed64_val": (0, _MASK64),
    "sfixed32_val": (-(1 << 31), (1 << 31) - 1),
    "sfixed64_val": (-(1 << 63), (1 << 63) - 1),
}
_FIXED = {"double_val": "<d", "float_val": "<f", "fixed32_val": "<I", "fixed64_val": "<Q",
          "sfixed32_val": "<i", "sfixed64_val": "<q"}
_LIST_SCALAR = {list_slot: slot for slot in SCALAR_SLOTS for list_slot in LIST_SLOTS
                if list_slot.replace("_list", "") == slot.replace("_val", "")}


def varint(value: int) -> bytes:
    if value < 0:
        value &= _MASK64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [varint(i) for i in range(1 << 14)]


def _v(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < 16384 else varint(value)


def _ld(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _v(len(payload)) + payload if tag < 0x80 else varint(tag) + _v(len(payload)) + payload


def _tag(field: int, wire: int) -> bytes:
    return varint((field << 3) | wire)


def _scalar_payload(slot: str, value: Any) -> tuple[int, bytes]:
    """(wire type, payload) of one scalar in `slot`."""
    if slot == "bool_val":
        if not isinstance(value, bool):
            raise Unsupported
        return 0, b"\x01" if value else b"\x00"
    if slot == "string_val":
        if not isinstance(value, str):
            raise Unsupported
        b = value.encode("utf-8")
        return 2, _v(len(b)) + b
    if slot == "bytes_val":
        if not isinstance(value, bytes | bytearray):
            raise Unsupported
        return 2, _v(len(value)) + bytes(value)
    if slot in ("double_val", "float_val"):
        if not isinstance(value, float | int) or isinstance(value, bool):
            raise Unsupported
        if slot == "float_val":
            raise Unsupported  # float32 rounding rules: leave them to the runtime
        return 1, struct.pack("<d", value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Unsupported
    lo, hi = _RANGES[slot]
    if not lo <= value <= hi:
        raise Unsupported
    if slot in _VARINT:
        return 0, varint(value)
    if slot in ("sint32_val", "sint64_val"):
        return 0, varint((value << 1) ^ (value >> 63))
    fmt = _FIXED[slot]
    return (5 if fmt in ("<I", "<i") else 1), struct.pack(fmt, value)


def _list_payload(slot: str, values: Any) -> bytes:
    """The XxxList message body for `values`."""
    if not isinstance(values, list | tuple):
        raise Unsupported
    scalar = _LIST_SCALAR[slot]
    if scalar in ("string_val", "bytes_val"):
        return b"".join(_tag(1, 2) + _scalar_payload(scalar, v)[1] for v in values)
    if not values:
        return b""
    packed = b"".join(_scalar_payload(scalar, v)[1] for v in values)
    return _tag(1, 2) + _v(len(packed)) + packed


def attr_bytes(a: Attr) -> bytes:
    """AttributeProto body."""
    out = b""
    if a.name:
        nb = a.name.encode("utf-8")
        out = b"\x0a" + _v(len(nb)) + nb
    slot = a.slot
    if slot in SCALAR_SLOTS:
        num = SCALAR_SLOTS[slot][0]
        wire, payload = _scalar_payload(slot, a.value)
        return out + _tag(num, wire) + payload
    if slot in LIST_SLOTS:
        body = _list_payload(slot, a.value)
        return out + _tag(LIST_SLOTS[slot][0], 2) + _v(len(body)) + body
    raise Unsupported


class NodeEncoder:
    """Encodes Nodes; keeps a cache of framed attribute bytes across nodes of one trace."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, Any], bytes] = {}

    def node(self, n: Node) -> bytes:
        small = _SMALL
        nid, start, dur = n.id, n.start_time_micros, n.duration_micros
        if not (0 <= nid <= _MASK64 and 0 <= start <= _MASK64 and 0 <= dur <= _MASK64):
            raise Unsupported
        parts: list[bytes] = []
        add = parts.append
        if nid:
            add(b"\x08" + (small[nid] if nid < 16384 else varint(nid)))
        name = n.name
        if name:
            nb = name.encode("utf-8")
            add(b"\x12" + _v(len(nb)) + nb)
        t = _TYPE_BYTES.get(n.type)
        if t is None:
            t = b"\x18" + varint(int(n.type)) if int(n.type) else b""
        add(t)
        for key, deps in ((b"\x22", n.ctrl_deps), (b"\x2a", n.data_deps)):  # fields 4 and 5, packed
            if deps:
                if min(deps) < 0 or max(deps) > _MASK64:
                    raise Unsupported
                packed = b"".join([small[d] if d < 16384 else varint(d) for d in deps])
                add(key + _v(len(packed)) + packed)
        if start:
            add(b"\x30" + (small[start] if start < 16384 else varint(start)))
        if dur:
            add(b"\x38" + (small[dur] if dur < 16384 else varint(dur)))
        if n.inputs is not None:
            add(_ld(0x42, _io(n.inputs)))
        if n.outputs is not None:
            add(_ld(0x4A, _io(n.outputs)))
        cache = self._cache
        for a in n.attrs:
            v = a.value
            if v.__class__ in _HASHABLE:
                key = (a.name, a.slot, v.__class__, v)
                hit = cache.get(key)
                if hit is None:
                    hit = _ld(0x52, attr_bytes(a))
                    if len(cache) < 100000:
                        cache[key] = hit
                add(hit)
            else:
                add(_ld(0x52, attr_bytes(a)))
        return b"".join(parts)


_HASHABLE = {int, bool, str, float, bytes}
_TYPE_BYTES: dict[Any, bytes] = {}
for _t in NodeType:
    _TYPE_BYTES[_t] = b"\x18" + varint(int(_t)) if int(_t) else b""


def _io(io: IOInfo) -> bytes:
    out = b""
    for tag, s in ((0x0A, io.values), (0x12, io.shapes), (0x1A, io.types)):
        if s:
            if not isinstance(s, str):
                raise Unsupported
            b = s.encode("utf-8")
            out += bytes((tag,)) + _v(len(b)) + b
    return out


# ---------------------------------------------------------------- decoding


def _read(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > _MASK64:
                raise Unsupported
            return result, pos
        shift += 7
        if shift > 63:
            raise Unsupported


def _packed(data: bytes, pos: int, end: int) -> list[int]:
    out = []
    while pos < end:
        b = data[pos]
        if b < 0x80:
            out.append(b)
            pos += 1
        else:
            v, pos = _read(data, pos)
            out.append(v)
    if pos != end:
        raise Unsupported
    return out


_NODE_TYPES = {int(t): t for t in NodeType}


class NodeDecoder:
    """Decodes Node bodies by hand; attribute bodies are parsed once (by `parse_attr`) and cached."""

    def __init__(self, parse_attr: Any, parse_io: Any) -> None:
        self._parse_attr = parse_attr  # bytes -> Attr
        self._parse_io = parse_io  # bytes -> IOInfo
        self._cache: dict[bytes, Attr] = {}

    def node(self, data: bytes, pos: int, end: int) -> Node:
        nid = start = dur = 0
        ntype: Any = NodeType.INVALID_NODE
        name = ""
        ctrl: list[int] = []
        deps: list[int] = []
        inputs = outputs = None
        attrs: list[Attr] = []
        cache = self._cache
        while pos < end:
            tag = data[pos]
            pos += 1
            if tag & 7 == 2:  # length-delimited
                ln = data[pos]
                if ln < 0x80:
                    pos += 1
                else:
                    ln, pos = _read(data, pos)
                stop = pos + ln
                if stop > end:
                    raise Unsupported
                if tag == 0x52:
                    raw = data[pos:stop]
                    a = cache.get(raw)
                    if a is None:
                        a = self._parse_attr(raw)
                        if len(cache) < 100000:
                            cache[raw] = a
                    v = a.value
                    attrs.append(Attr(a.name, list(v) if v.__class__ is list else v, a.slot))
                elif tag == 0x12:
                    name = data[pos:stop].decode("utf-8")
                elif tag == 0x2A:
                    deps += _packed(data, pos, stop)
                elif tag == 0x22:
                    ctrl += _packed(data, pos, stop)
                elif tag == 0x42:
                    inputs = self._parse_io(data[pos:stop])
                elif tag == 0x4A:
                    outputs = self._parse_io(data[pos:stop])
                else:
                    raise Unsupported
                pos = stop
            else:
                b = data[pos]
                if b < 0x80:
                    v = b
                    pos += 1
                else:
                    v, pos = _read(data, pos)
                if tag == 0x08:
                    nid = v
                elif tag == 0x18:
                    ntype = _NODE_TYPES.get(v, v)
                elif tag == 0x30:
                    start = v
                elif tag == 0x38:
                    dur = v
                elif tag == 0x28:
                    deps.append(v)
                elif tag == 0x20:
                    ctrl.append(v)
                else:
                    raise Unsupported
        if pos != end:
            raise Unsupported
        return Node(nid, name, ntype, ctrl, deps, start, dur, inputs, outputs, attrs)
