"""Read and write Chakra ET files: varint-length-delimited protobuf, GlobalMetadata then Nodes.

Reading is gzip- and xz-aware (by the magic bytes, not the name) and stops at EOF or at a 0 length,
as readers in the wild do. Writing is plain unless the name ends in .gz or .xz (ASTRA-sim's newer
feeder reads neither; committed bundles keep theirs in xz) and atomic: a temp file in the same folder, then os.replace. Attributes keep
their oneof slot and their order, so read-then-write is byte-identical for protobuf-written files.
"""

from __future__ import annotations

import gc
import gzip
import lzma
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from calib.chakra.model import Attr, ExecutionTrace, IOInfo, Node, NodeType
from calib.chakra.schema import LIST_SLOTS, SCALAR_SLOTS, messages
from calib.chakra.wire import NodeDecoder, NodeEncoder, Unsupported, varint
from calib.compressed import decompress
from calib.errors import CalibError

# xz holds a committed bundle's ETs in about half of gzip's bytes (the tree travels with every device
# call under a size limit); extreme preset: ~0.5 s per 2 MB rank, paid once when a bundle is written.
XZ_PRESET = 9 | lzma.PRESET_EXTREME
_FAST_PATH_ERRORS = (Unsupported, UnicodeEncodeError, TypeError, ValueError, OverflowError, struct.error, KeyError, AttributeError)
# An attribute read without any value set keeps this pseudo slot so that it is written back empty.
NO_VALUE_SLOT = "none"
_NODE_TYPES = list(NodeType)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: building 10^5+ small objects (none in cycles) otherwise
    triggers collections that rescan everything alive, which costs more than the work itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_varint(data: bytes, pos: int, source: str) -> tuple[int, int]:
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= len(data):
            raise CalibError(f"{source}: truncated Chakra ET: length prefix cut off at byte offset {start}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CalibError(f"{source}: corrupt Chakra ET: bad length prefix at byte offset {start}")


# ---------------------------------------------------------------- protobuf <-> model


def _attr_from_pb(a: Any) -> Attr:
    slot = a.WhichOneof("value")
    if slot is None:
        return Attr(a.name, None, NO_VALUE_SLOT)
    if slot in LIST_SLOTS:
        return Attr(a.name, list(getattr(a, slot).values), slot)
    return Attr(a.name, getattr(a, slot), slot)


def _attrs_to_pb(attrs: list[Attr], repeated: Any, where: str) -> None:
    for at in attrs:
        pa = repeated.add(name=at.name)
        slot = at.slot
        if slot == NO_VALUE_SLOT:
            continue
        try:
            if slot in SCALAR_SLOTS:
                setattr(pa, slot, at.value)
            elif slot in LIST_SLOTS:
                getattr(pa, slot).values.extend(at.value)
            else:
                raise CalibError(f"{where}: attribute {at.name!r} has unknown slot {slot!r}")
        except (TypeError, ValueError) as exc:
            raise CalibError(f"{where}: attribute {at.name!r} value {at.value!r} does not fit slot {slot}: {exc}") from None


def _io_from_pb(io: Any) -> IOInfo:
    return IOInfo(io.values, io.shapes, io.types)


def node_from_pb(pb: Any) -> Node:
    t = pb.type
    return Node(
        id=pb.id,
        name=pb.name,
        type=_NODE_TYPES[t] if 0 <= t < len(_NODE_TYPES) else t,
        ctrl_deps=list(pb.ctrl_deps),
        data_deps=list(pb.data_deps),
        start_time_micros=pb.start_time_micros,
        duration_micros=pb.duration_micros,
        inputs=_io_from_pb(pb.inputs) if pb.HasField("inputs") else None,
        outputs=_io_from_pb(pb.outputs) if pb.HasField("outputs") else None,
        attrs=[_attr_from_pb(a) for a in pb.attr],
    )


def node_to_pb(node: Node) -> Any:
    pb = messages()["Node"](
        id=node.id,
        name=node.name,
        type=int(node.type),
        ctrl_deps=node.ctrl_deps,
        data_deps=node.data_deps,
        start_time_micros=node.start_time_micros,
        duration_micros=node.duration_micros,
    )
    if node.inputs is not None:
        io = node.inputs
        pb.inputs.SetInParent()
        pb.inputs.values, pb.inputs.shapes, pb.inputs.types = io.values, io.shapes, io.types
    if node.outputs is not None:
        io = node.outputs
        pb.outputs.SetInParent()
        pb.outputs.values, pb.outputs.shapes, pb.outputs.types = io.values, io.shapes, io.types
    _attrs_to_pb(node.attrs, pb.attr, f"node {node.id}")
    return pb


# ---------------------------------------------------------------- bytes <-> model


def encode(trace: ExecutionTrace) -> bytes:
    """The file's bytes: varint(len) + GlobalMetadata, then varint(len) + Node for each node."""
    with no_gc():
        return _encode(trace)


def _encode(trace: ExecutionTrace) -> bytes:
    meta = messages()["GlobalMetadata"](version=trace.version)
    _attrs_to_pb(trace.metadata_attrs, meta.attr, "global metadata")
    fast = NodeEncoder()
    parts: list[bytes] = []
    bodies = [meta.SerializeToString()]
    for node in trace.nodes:
        try:
            bodies.append(fast.node(node))
        except _FAST_PATH_ERRORS:
            # the protobuf runtime: same bytes, and the one-line error for a value that does not fit
            try:
                bodies.append(node_to_pb(node).SerializeToString())
            except (ValueError, TypeError) as exc:  # e.g. a negative duration_micros (uint64 field)
                raise CalibError(f"cannot write node {node.id} ({node.name!r}): {exc}") from None
    for body in bodies:
        if not body:
            # A 0 length ends the file for every reader: an all-default message cannot be framed.
            raise CalibError("cannot write an empty Chakra message (all fields default): readers stop at a 0 length")
        parts.append(varint(len(body)))
        parts.append(body)
    return b"".join(parts)


def encode_slow(trace: ExecutionTrace) -> bytes:
    """encode() through the protobuf runtime only (the reference the fast encoder is tested against)."""
    meta = messages()["GlobalMetadata"](version=trace.version)
    _attrs_to_pb(trace.metadata_attrs, meta.attr, "global metadata")
    out = []
    for pb in (meta, *map(node_to_pb, trace.nodes)):
        body = pb.SerializeToString()
        out.append(varint(len(body)) + body)
    return b"".join(out)


def decode(data: bytes, source: str = "<bytes>") -> ExecutionTrace:
    """Parse a whole ET (plain, gzip or xz bytes); errors name `source` and the byte offset."""
    with no_gc():
        return _decode(data, source)


def _decode(data: bytes, source: str) -> ExecutionTrace:
    if not isinstance(data, bytes):
        data = bytes(data)  # the decoder slices and hashes: bytearray / memoryview would not do
    data = decompress(data, source)
    msgs = messages()
    node_cls = msgs["Node"]
    attr_cls, io_cls = msgs["AttributeProto"], msgs["IOInfo"]
    fast = NodeDecoder(lambda raw: _attr_from_pb(attr_cls.FromString(raw)), lambda raw: _io_from_pb(io_cls.FromString(raw)))
    trace = ExecutionTrace(nodes=[])
    mv = memoryview(data)
    pos = 0
    end = len(data)
    first = True
    while pos < end:
        start = pos
        length, pos = _read_varint(data, pos, source)
        if length == 0:
            break
        if pos + length > end:
            if first:  # the very first message does not fit: most likely not an ET at all
                raise CalibError(
                    f"{source}: not a Chakra ET (or truncated): its first message claims {length} bytes, "
                    f"the file has {end - pos} after the length prefix"
                )
            raise CalibError(
                f"{source}: truncated Chakra ET: message at byte offset {start} needs {length} bytes, "
                f"{end - pos} left"
            )
        chunk = mv[pos : pos + length]
        try:
            if first:
                meta = msgs["GlobalMetadata"].FromString(chunk)
                trace.version = meta.version
                trace.metadata_attrs = [_attr_from_pb(a) for a in meta.attr]
            else:
                try:
                    node = fast.node(data, pos, pos + length)
                except _FAST_PATH_ERRORS + (IndexError, UnicodeDecodeError):
                    # the protobuf runtime: same result, and DecodeError for a corrupt message
                    node = node_from_pb(node_cls.FromString(chunk))
                trace.nodes.append(node)
        except DecodeError as exc:
            what = "GlobalMetadata" if first else "Node"
            raise CalibError(f"{source}: corrupt Chakra ET: bad {what} message at byte offset {start}: {exc}") from None
        first = False
        pos += length
    if first:
        raise CalibError(f"{source}: empty Chakra ET: no GlobalMetadata message")
    return trace


def read_et(path: str | os.PathLike[str]) -> ExecutionTrace:
    """Read one ET file, plain, gzip- or xz-compressed."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CalibError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return decode(data, str(p))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temp name in the same folder, then rename: never a half-written file."""
    p = Path(path)
    if p.is_dir():
        raise CalibError(f"{p}: cannot write: is a folder, expected a file name")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".partial", dir=p.parent)
    except OSError as exc:
        raise CalibError(f"{p}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, p)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CalibError(f"{p}: cannot write: {exc.strerror or exc}") from None
        raise


def write_et(trace: ExecutionTrace, path: str | os.PathLike[str]) -> None:
    """Write an ET: plain, gzip when the name ends in .gz (mtime 0 so that output is reproducible), xz
    when it ends in .xz."""
    data = encode(trace)
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif str(path).endswith(".xz"):
        data = lzma.compress(data, preset=XZ_PRESET)
    write_bytes_atomic(path, data)
