"""P2P kernels whose host link is missing (the pipeline-parallel defect, traces/README.md).

Every input here is the real h200x2-collectives sample (plain dist.send on rank 0, dist.recv on
rank 1, twice), copied into tmp_path and transformed inside the test to reproduce the defect:
the host-side link of the send/recv kernels is removed, so only the kernels' own Kineto args are
left. No measured number is changed; the expected sizes and tags are those of the untouched
conversion of the same files.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from calib.chakra.model import NodeType
from calib.chakra.validate import problems
from calib.convert import RunConversion, convert_traces
from calib.errors import CalibError

P2P_CALLS = ("send", "recv")
P2P_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
            "Process Group Description", "Process Group Ranks", "Src Rank", "Dst Rank")


def _load(path: Path) -> Any:
    with gzip.open(path) as f:
        return json.load(f)


def _write(path: Path, data: Any) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def _p2p_kernels(dev: Any) -> list[dict[str, Any]]:
    return [e for e in dev["traceEvents"] if e.get("cat") == "kernel"
            and (e.get("args") or {}).get("Collective name") in P2P_CALLS]


def _drop_launch_links(dev: Any) -> int:
    """Remove the External id of the launches of the send/recv kernels and the Kineto CPU ops that
    enclose those launches on their thread: the kernel reaches no CPU op at all."""
    corr = {e["args"]["correlation"] for e in _p2p_kernels(dev)}
    launches = []
    n = 0
    for e in dev["traceEvents"]:
        a = e.get("args") or {}
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and a.get("correlation") in corr and "External id" in a:
            del a["External id"]
            launches.append((e.get("tid"), e["ts"]))
            n += 1

    def encloses(e: dict[str, Any]) -> bool:
        return (e.get("cat") in ("cpu_op", "user_annotation") and not str(e.get("name", "")).startswith("ProfilerStep#")
                and any(e.get("tid") == tid and e["ts"] <= ts <= e["ts"] + e.get("dur", 0) for tid, ts in launches))

    dev["traceEvents"] = [e for e in dev["traceEvents"] if not encloses(e)]
    return n


def test_launch_without_external_id_links_to_the_enclosing_op(coll_dir: Path, coll: RunConversion,
                                                              tmp_path: Path) -> None:
    """Kineto gives driver-API launches no External id; the CPU op running around the launch is its op."""
    def fix(dev: Any) -> None:
        for e in dev["traceEvents"]:
            a = e.get("args") or {}
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "External id" in a:
                del a["External id"]

    conv = _convert(coll_dir, tmp_path, dev_fix=fix)
    _check_pairs(conv, coll)
    sends = [n for n in conv.traces[0].nodes if n.type == NodeType.COMM_SEND_NODE]
    assert sends and all(n.attr("aten_op") for n in sends)


def _drop_host_comm_records(host: Any) -> int:
    """Remove the host's record_param_comms nodes of the send/recv calls."""
    def is_p2p(n: dict[str, Any]) -> bool:
        attrs = {a["name"]: a.get("value") for a in n.get("attrs", [])}
        return n["name"] == "record_param_comms" and attrs.get("collective_name") in P2P_CALLS

    before = len(host["nodes"])
    host["nodes"] = [n for n in host["nodes"] if not is_p2p(n)]
    return before - len(host["nodes"])


def _convert(coll_dir: Path, tmp_path: Path, host_fix: Any = None, dev_fix: Any = None) -> RunConversion:
    hosts: dict[int, Path] = {}
    devs: dict[int, Path] = {}
    for r in (0, 1):
        host, dev = _load(coll_dir / f"host.{r}.json.gz"), _load(coll_dir / f"device.{r}.json.gz")
        if host_fix is not None:
            assert host_fix(host) == 2  # two sends on rank 0, two recvs on rank 1
        if dev_fix is not None:
            dev_fix(dev)
        hosts[r] = _write(tmp_path / f"host.{r}.json.gz", host)
        devs[r] = _write(tmp_path / f"device.{r}.json.gz", dev)
    return convert_traces(hosts, devs)


def _p2p(conv: RunConversion, rank: int, t: NodeType) -> list[tuple[Any, ...]]:
    return [(n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
            for n in conv.traces[rank].nodes if n.type == t]


def _check_pairs(conv: RunConversion, linked: RunConversion) -> None:
    sends, recvs = _p2p(conv, 0, NodeType.COMM_SEND_NODE), _p2p(conv, 1, NodeType.COMM_RECV_NODE)
    assert len(sends) == 2 and sorted(sends) == sorted(recvs)
    assert len({s[2] for s in sends}) == 2  # distinct tags: the k-th send matches the k-th recv
    assert {(s[0], s[1]) for s in sends} == {(0, 1)}
    assert all(s[3] == 1048576 * 4 for s in sends)  # In msg nelems x float32
    # exactly what the host-linked conversion of the same run gives
    assert sends == _p2p(linked, 0, NodeType.COMM_SEND_NODE)
    assert recvs == _p2p(linked, 1, NodeType.COMM_RECV_NODE)
    assert _p2p(conv, 1, NodeType.COMM_SEND_NODE) == [] and _p2p(conv, 0, NodeType.COMM_RECV_NODE) == []
    for r in (0, 1):
        assert len(conv.traces[r].nodes) == len(linked.traces[r].nodes)
        assert problems(conv.traces[r]) == []
        # no NCCL kernel was written as a compute kernel
        assert not conv.kernels["name"].str.startswith("ncclDevKernel_").any()
        comp = [n for n in conv.traces[r].nodes if n.type == NodeType.COMP_NODE]
        assert not any(n.name.startswith("ncclDevKernel_") for n in comp)
    p2p_rows = conv.collectives[conv.collectives["kind"].isin(P2P_CALLS)]
    assert len(p2p_rows) == 4 and (p2p_rows["bytes"] == 1048576 * 4).all()


def test_p2p_from_kineto_args_without_host_record(coll_dir: Path, coll: RunConversion, tmp_path: Path) -> None:
    conv = _convert(coll_dir, tmp_path, host_fix=_drop_host_comm_records)
    _check_pairs(conv, coll)


def test_p2p_from_kineto_args_without_launch_link(coll_dir: Path, coll: RunConversion, tmp_path: Path) -> None:
    """As in the pipeline-parallel bundles: the kernel reaches no CPU op at all (empty aten_op)."""
    conv = _convert(coll_dir, tmp_path, dev_fix=_drop_launch_links)
    _check_pairs(conv, coll)
    p2p = [n for n in conv.traces[0].nodes if n.type == NodeType.COMM_SEND_NODE]
    assert all(n.attr("aten_op") is None for n in p2p)


def _strip_kernel_args(dev: Any) -> None:
    for e in _p2p_kernels(dev):
        for k in P2P_ARGS:
            e["args"].pop(k, None)


def test_p2p_without_host_link_or_kineto_args_is_one_line_error(coll_dir: Path, tmp_path: Path) -> None:
    def fix(dev: Any) -> None:
        _drop_launch_links(dev)
        _strip_kernel_args(dev)

    with pytest.raises(CalibError) as exc:
        _convert(coll_dir, tmp_path, dev_fix=fix)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "device.0.json.gz" in msg and "ncclDevKernel_SendRecv" in msg and " ns " in msg


def test_p2p_without_record_and_kineto_args_is_one_line_error(coll_dir: Path, tmp_path: Path) -> None:
    """The kernel still reaches its CPU op (record_param_comms), but the host trace lost that op."""
    with pytest.raises(CalibError) as exc:
        _convert(coll_dir, tmp_path, host_fix=_drop_host_comm_records, dev_fix=_strip_kernel_args)
    msg = str(exc.value)
    assert "\n" not in msg and "ncclDevKernel_SendRecv" in msg and "record_param_comms" in msg


def test_unlinked_coalesced_kernel_is_one_line_error(coll_dir: Path, tmp_path: Path) -> None:
    """A batched (coalesced) P2P kernel with no host op: its args cannot say which calls it ran."""
    def fix(dev: Any) -> None:
        kernels = _p2p_kernels(dev)
        _drop_launch_links(dev)
        for e in kernels:
            e["args"]["Collective name"] = "coalesced"

    with pytest.raises(CalibError) as exc:
        _convert(coll_dir, tmp_path, dev_fix=fix)
    msg = str(exc.value)
    assert "\n" not in msg and "coalesced" in msg and "ncclDevKernel_SendRecv" in msg


def test_fused_send_recv_from_kineto_args(coll_dir: Path, tmp_path: Path) -> None:
    """Synthetic (never data): rank 0's first send kernel also names a source, as a launch that sends
    and receives would; with no host op it becomes a SEND and a RECV running together."""
    dev = _load(coll_dir / "device.0.json.gz")
    first = min(_p2p_kernels(dev), key=lambda e: e["ts"])
    _drop_launch_links(dev)
    first["args"]["Collective name"] = "send_recv"
    first["args"]["Src Rank"] = 1
    conv = convert_traces({0: coll_dir / "host.0.json.gz"}, {0: _write(tmp_path / "device.0.json.gz", dev)})
    t = conv.traces[0]
    p2p = [n for n in t.nodes if n.type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)]
    assert [n.type for n in p2p] == [NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE, NodeType.COMM_SEND_NODE]
    s, r, s2 = p2p
    assert (s.attr("comm_src"), s.attr("comm_dst"), r.attr("comm_src"), r.attr("comm_dst")) == (0, 1, 1, 0)
    assert r.attr("coalesced_with") == s.id and r.data_deps == s.data_deps
    assert s.attr("comm_size") == r.attr("comm_size") == 1048576 * 4
    # the later plain send is the second message of the pair 0->1; the recv is the first of 1->0
    assert (s.attr("comm_tag"), s2.attr("comm_tag"), r.attr("comm_tag")) == (0, 1, 0)
    assert len(t.nodes) == 73 and problems(t) == []
