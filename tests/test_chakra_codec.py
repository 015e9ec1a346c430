"""Chakra ET codec: byte-identical round trip on ASTRA-sim's reference ETs, framing, errors, speed."""

from __future__ import annotations

import copy
import gzip
import lzma
import time
from pathlib import Path

import pytest

from calib.chakra.codec import _read_varint, decode, encode, encode_slow, node_from_pb, read_et, write_et
from calib.chakra.jsonio import from_json, to_json
from calib.chakra.model import Attr, CommType, ExecutionTrace, IOInfo, Node, NodeType
from calib.chakra.schema import LIST_SLOTS, messages
from calib.chakra.summary import summarize
from calib.chakra.validate import check, find_cycle, problems
from calib.errors import CalibError


@pytest.fixture(scope="module")
def reference_ets(astra_cases: Path) -> list[tuple[Path, bytes]]:
    files = sorted(astra_cases.glob("*/wl.*.et"))
    assert len(files) > 100
    return [(f, f.read_bytes()) for f in files]


def test_round_trip_byte_identical_on_every_reference_et(reference_ets: list[tuple[Path, bytes]]) -> None:
    for path, data in reference_ets:
        trace = decode(data, str(path))
        assert trace.version == "0.0.4", path
        assert encode(trace) == data, f"round trip differs for {path}"


def test_reference_ets_validate_and_json_round_trip(reference_ets: list[tuple[Path, bytes]]) -> None:
    for path, data in reference_ets[::7]:
        trace = decode(data, str(path))
        assert problems(trace) == [], path
        assert encode(from_json(to_json(trace))) == data, path


def test_wire_example_all_gather(astra_cases: Path) -> None:
    # The all_gather example of chakra-et-format.md: metadata "07 0a 05 0.0.4", then one COLL node.
    data = (astra_cases / "allgather_ring8_1MiB_ring_s1a1" / "wl.0.et").read_bytes()
    assert data[:8] == b"\x07\x0a\x050.0.4"
    trace = decode(data)
    (node,) = trace.nodes
    assert node.type == NodeType.COMM_COLL_NODE
    assert node.attr("comm_type") == CommType.ALL_GATHER
    assert node.attr("comm_size") == 1048576
    assert [(a.name, a.slot) for a in node.attrs] == [
        ("is_cpu_op", "bool_val"),
        ("comm_type", "int64_val"),
        ("comm_size", "int64_val"),
    ]


def _sample_trace() -> ExecutionTrace:
    a = Node(id=1, name="gemm", type=NodeType.COMP_NODE, duration_micros=3, attrs=[Attr("duration_ns", 2600)])
    b = Node(
        id=2,
        name="ar",
        type=NodeType.COMM_COLL_NODE,
        data_deps=[1],
        inputs=IOInfo("[1]", "[[4]]", "['float']"),
        outputs=IOInfo(),
        attrs=[
            Attr("is_cpu_op", False),
            Attr("comm_type", int(CommType.ALL_REDUCE)),
            Attr("comm_size", 1 << 20),
            Attr("pg_name", "3"),
            Attr("weights", [0.5, 1.5], "float_list"),
            Attr("blob", b"\x00\x01", "bytes_val"),
            Attr("neg", -5, "sint64_val"),
        ],
    )
    c = Node(
        id=3,
        name="send",
        type=NodeType.COMM_SEND_NODE,
        ctrl_deps=[2],
        attrs=[Attr("comm_src", 0), Attr("comm_dst", 1), Attr("comm_tag", 7), Attr("comm_size", 64)],
    )
    return ExecutionTrace(nodes=[a, b, c], metadata_attrs=[Attr("rank", 0)])


def test_a_trace_copy_is_deep() -> None:
    """ExecutionTrace.copy (what a replay simulates) equals the trace and copy.deepcopy's copy, and nothing
    changed in it (dependencies, attribute values, list values, I/O infos) reaches the original."""
    trace = _sample_trace()
    out = trace.copy()
    assert out == trace == copy.deepcopy(trace)
    b = out.nodes[1]
    b.data_deps.append(9)
    b.attrs[0].value = True
    b.attr("weights").append(2.5)
    b.inputs.values = "[2]"
    out.metadata_attrs[0].value = 1
    assert trace == _sample_trace()


def test_write_read_plain_gzip_and_xz(tmp_path: Path) -> None:
    trace = _sample_trace()
    plain, gz, xz = tmp_path / "rank.0.et", tmp_path / "rank.0.et.gz", tmp_path / "rank.0.et.xz"
    write_et(trace, plain)
    write_et(trace, gz)
    write_et(trace, xz)
    assert plain.read_bytes()[:2] != b"\x1f\x8b"
    assert gzip.decompress(gz.read_bytes()) == plain.read_bytes()
    assert lzma.decompress(xz.read_bytes()) == plain.read_bytes()
    for p in (plain, gz, xz):
        back = read_et(p)
        assert encode(back) == plain.read_bytes()
        assert back.nodes[1].attr("weights") == [0.5, 1.5]
        assert back.nodes[1].attr("blob") == b"\x00\x01"
        assert back.nodes[1].attr("neg") == -5
        assert back.nodes[1].outputs == IOInfo()
        assert back.nodes[0].outputs is None
        assert back.metadata_attrs[0].value == 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["rank.0.et", "rank.0.et.gz", "rank.0.et.xz"]  # no temp files left


def test_truncated_and_corrupt_files_give_one_line_errors(tmp_path: Path) -> None:
    data = encode(_sample_trace())
    cut = tmp_path / "cut.et"
    cut.write_bytes(data[:-3])
    with pytest.raises(CalibError, match=r"cut\.et: truncated Chakra ET: message at byte offset \d+") as e:
        read_et(cut)
    assert "\n" not in str(e.value)
    bad = tmp_path / "bad.et"
    meta_end = 1 + data[0]  # the metadata message is short: its length prefix is one byte
    bad.write_bytes(data[:meta_end] + b"\x05\xff\xff\xff\xff\xff")  # a node whose body is garbage
    with pytest.raises(CalibError, match=rf"bad\.et: corrupt Chakra ET: bad Node message at byte offset {meta_end}"):
        read_et(bad)
    gz = tmp_path / "x.et.gz"
    gz.write_bytes(gzip.compress(data)[:-10])
    with pytest.raises(CalibError, match=r"x\.et\.gz: corrupt or truncated gzip"):
        read_et(gz)
    xz = tmp_path / "x.et.xz"
    xz.write_bytes(lzma.compress(data)[:-10])
    with pytest.raises(CalibError, match=r"x\.et\.xz: corrupt or truncated xz"):
        read_et(xz)
    with pytest.raises(CalibError, match="cannot read"):
        read_et(tmp_path / "missing.et")
    with pytest.raises(CalibError, match="empty Chakra ET"):
        decode(b"", "empty.et")


def test_zero_length_ends_the_file() -> None:
    data = encode(_sample_trace())
    assert len(decode(data + b"\x00garbage-after-end").nodes) == 3


def test_cannot_frame_an_empty_message() -> None:
    with pytest.raises(CalibError, match="empty Chakra message"):
        encode(ExecutionTrace(nodes=[Node(id=0, type=NodeType.INVALID_NODE)]))


def test_attribute_that_does_not_fit_its_slot() -> None:
    t = ExecutionTrace(nodes=[Node(id=1, attrs=[Attr("comm_src", "zero")])])
    with pytest.raises(CalibError, match="comm_src.*int32_val"):
        encode(t)


def test_validation_finds_each_problem() -> None:
    t = _sample_trace()
    assert problems(t) == []
    t.nodes[2].attrs = [a for a in t.nodes[2].attrs if a.name != "comm_tag"]
    t.nodes[1].data_deps.append(99)
    t.nodes[0].ctrl_deps.append(3)  # 1 -> 2 -> 3 -> 1
    t.nodes.append(Node(id=2, name="dup"))
    t.nodes.append(Node(id=5, type=NodeType.COMM_COLL_NODE, attrs=[Attr("comm_type", 2, "int32_val")]))
    found = "\n".join(problems(t))
    assert "lacks required attribute comm_tag" in found
    assert "names missing node 99" in found
    assert "duplicate node id" in found
    assert "comm_type is in int32_val, consumers read int64_val" in found
    assert "lacks required attribute comm_size" in found
    assert "dependency cycle" in found
    with pytest.raises(CalibError, match=r"^rank\.3\.et: invalid Chakra ET: .*\(and \d+ more\)$"):
        check(t, "rank.3.et")


def test_find_cycle_returns_the_cycle() -> None:
    nodes = [Node(id=i, data_deps=[i - 1] if i else []) for i in range(5)]
    assert find_cycle(ExecutionTrace(nodes=nodes)) == []
    nodes[1].ctrl_deps.append(3)
    cyc = find_cycle(ExecutionTrace(nodes=nodes))
    assert set(cyc) == {1, 2, 3} and cyc[0] == cyc[-1]


def test_summary_counts_and_times() -> None:
    s = summarize(_sample_trace())
    assert s.nodes == 3
    assert s.by_type == {"COMP_NODE": 1, "COMM_COLL_NODE": 1, "COMM_SEND_NODE": 1}
    assert s.compute_time_s == pytest.approx(2.6e-6)
    kinds = {(g.kind, g.bytes, g.pg_name): g.count for g in s.collectives}
    assert kinds == {("ALL_REDUCE", 1 << 20, "3"): 1, ("SEND", 64, ""): 1}


def test_codec_speed_is_reasonable() -> None:
    # The workload generator writes ETs of 10^5+ nodes: keep encode+decode well above 10^4 nodes/s.
    n = 20000
    nodes = [
        Node(
            id=i,
            name=f"op{i}",
            data_deps=[i - 1] if i else [],
            duration_micros=5,
            attrs=[Attr("is_cpu_op", False), Attr("num_ops", 1 << 30), Attr("duration_ns", 5123), Attr("category", "compute")],
        )
        for i in range(n)
    ]
    t0 = time.perf_counter()
    data = encode(ExecutionTrace(nodes=nodes))
    back = decode(data)
    elapsed = time.perf_counter() - t0
    assert len(back.nodes) == n
    assert n / elapsed > 10000, f"{n / elapsed:.0f} nodes/s"


def _every_slot_trace() -> ExecutionTrace:
    values = {
        "double_val": -2.5, "float_val": 0.25, "int32_val": -7, "int64_val": -(1 << 40), "uint32_val": 1 << 31,
        "uint64_val": (1 << 64) - 1, "sint32_val": -3, "sint64_val": -(1 << 50), "fixed32_val": 7,
        "fixed64_val": 1 << 60, "sfixed32_val": -9, "sfixed64_val": -(1 << 45), "bool_val": False,
        "string_val": "héllo", "bytes_val": b"\x00\xff",
    }
    attrs = [Attr(f"a_{slot}", v, slot) for slot, v in values.items()]
    for slot in LIST_SLOTS:
        scalar = slot.replace("_list", "_val")
        attrs.append(Attr(f"l_{slot}", [values[scalar], values[scalar]], slot))
        attrs.append(Attr(f"e_{slot}", [], slot))
    attrs.append(Attr("", 3, "int64_val"))  # nameless
    nodes = [
        Node(id=0, name="first", type=NodeType.METADATA_NODE),
        Node(id=20000, name="ünïcode", type=NodeType.COMP_NODE, ctrl_deps=[0, 1 << 40], data_deps=[0, 5, 16384],
             start_time_micros=1 << 35, duration_micros=16383, inputs=IOInfo("v", "", "t"), outputs=IOInfo(), attrs=attrs),
        Node(id=3, type=NodeType.COMM_COLL_NODE, attrs=[Attr("comm_type", CommType.ALL_GATHER), Attr("comm_size", 1 << 20)]),
        Node(id=4, name="odd type", type=9),  # type: ignore[arg-type]
    ]
    return ExecutionTrace(nodes=nodes, metadata_attrs=[Attr("rank", 3), Attr("x", [1.5], "double_list")])


def _slow_decode(data: bytes) -> list[Node]:
    """Every node through the protobuf runtime (the reference for the hand-written decoder)."""
    node_cls = messages()["Node"]
    pos, out, first = 0, [], True
    while pos < len(data):
        n, pos = _read_varint(data, pos, "x")
        if not first:
            out.append(node_from_pb(node_cls.FromString(data[pos : pos + n])))
        first = False
        pos += n
    return out


def test_fast_encoder_and_decoder_match_the_protobuf_runtime() -> None:
    t = _every_slot_trace()
    data = encode(t)
    assert data == encode_slow(t)
    back = decode(data)
    assert to_json(back) == to_json(t)
    assert to_json(ExecutionTrace(nodes=_slow_decode(data)))["nodes"] == to_json(back)["nodes"]
    assert encode(back) == data


def test_fast_decoder_matches_on_reference_and_converted_ets(reference_ets: list[tuple[Path, bytes]]) -> None:
    for path, data in reference_ets[::5]:
        assert to_json(decode(data))["nodes"] == to_json(ExecutionTrace(nodes=_slow_decode(data)))["nodes"], path
