"""PyTorch host ET + Kineto -> Chakra on the real H200 samples (both folders)."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from calib.chakra.codec import decode, encode, read_et
from calib.chakra.model import CommType, NodeType
from calib.chakra.validate import problems
from calib.convert import (
    COLLECTIVE_COLUMNS,
    KERNEL_COLUMNS,
    RunConversion,
    convert_pair,
    convert_run,
    convert_traces,
)
from calib.convert.kineto import GPU_CATS, us_to_ns
from calib.errors import CalibError


def _load(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def mcore_dir(samples: Path) -> Path:
    return samples / "h200x2-mcore-tp2"


@pytest.fixture(scope="session")
def mcore(mcore_dir: Path) -> RunConversion:
    return convert_traces({0: mcore_dir / "host.0.json.gz"}, {0: mcore_dir / "device.0.json.gz"})


@pytest.fixture(scope="session")
def kineto_gpu(coll_dir: Path, mcore_dir: Path) -> dict[tuple[str, int], list[dict]]:
    out = {}
    for name, d, ranks in (("coll", coll_dir, (0, 1)), ("mcore", mcore_dir, (0,))):
        for r in ranks:
            ev = _load(d / f"device.{r}.json.gz")["traceEvents"]
            out[(name, r)] = [e for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    return out


def _conv(name: str, coll: RunConversion, mcore: RunConversion) -> RunConversion:
    return coll if name == "coll" else mcore


@pytest.mark.parametrize("name,rank", [("coll", 0), ("coll", 1), ("mcore", 0)])
def test_every_gpu_activity_exactly_once(name: str, rank: int, coll: RunConversion, mcore: RunConversion,
                                         kineto_gpu: dict) -> None:
    trace = _conv(name, coll, mcore).traces[rank]
    events = kineto_gpu[(name, rank)]
    assert len(trace.nodes) == len(events)
    want = Counter((e["name"], int(e["args"]["stream"]), us_to_ns(e["ts"]) // 1000, us_to_ns(e["dur"])) for e in events)
    got = Counter((n.name, n.attr("stream"), n.start_time_micros, n.attr("duration_ns")) for n in trace.nodes)
    assert got == want
    cats = Counter(n.attr("category") for n in trace.nodes)
    assert cats["memcpy"] == sum(e["cat"] == "gpu_memcpy" for e in events)
    assert cats["memset"] == sum(e["cat"] == "gpu_memset" for e in events) > 0


@pytest.mark.parametrize("name,rank", [("coll", 0), ("coll", 1), ("mcore", 0)])
def test_time_per_stream_equals_kineto(name: str, rank: int, coll: RunConversion, mcore: RunConversion,
                                       kineto_gpu: dict) -> None:
    trace = _conv(name, coll, mcore).traces[rank]
    kineto_ns: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    for e in kineto_gpu[(name, rank)]:
        kineto_ns[int(e["args"]["stream"])] += us_to_ns(e["dur"])
        count[int(e["args"]["stream"])] += 1
    exact: dict[int, int] = defaultdict(int)
    micros: dict[int, int] = defaultdict(int)
    for n in trace.nodes:
        exact[n.attr("stream")] += n.attr("duration_ns")
        micros[n.attr("stream")] += n.duration_micros
    assert dict(exact) == dict(kineto_ns)
    for s, ns in kineto_ns.items():
        assert abs(micros[s] * 1000 - ns) <= 500 * count[s]


def test_sub_microsecond_kernels_are_rounded_not_floored(mcore: RunConversion) -> None:
    small = [n for n in mcore.traces[0].nodes if n.attr("duration_ns") < 1000]
    assert small, "the megatron-core sample has sub-microsecond kernels"
    for n in small:
        assert n.duration_micros == (n.attr("duration_ns") + 500) // 1000


@pytest.mark.parametrize("name,rank", [("coll", 0), ("coll", 1), ("mcore", 0)])
def test_converted_ets_validate_and_round_trip(name: str, rank: int, coll: RunConversion, mcore: RunConversion) -> None:
    trace = _conv(name, coll, mcore).traces[rank]
    assert problems(trace) == []
    data = encode(trace)
    assert encode(decode(data)) == data
    for n in trace.nodes:
        for d in (*n.data_deps, *n.ctrl_deps):
            assert d < n.id  # ids follow GPU start time
            dep = trace.nodes[d]
            assert dep.start_time_micros <= n.start_time_micros


def test_streams_are_ordered(coll: RunConversion) -> None:
    for trace in coll.traces.values():
        last: dict[int, int] = {}
        for n in trace.nodes:
            s = n.attr("stream")
            if s in last:
                assert last[s] in n.data_deps
            last[s] = n.id


def test_cross_stream_dependencies_found(coll: RunConversion) -> None:
    # DDP all-reduces run on their own NCCL stream and the optimizer waits for them
    trace = coll.traces[0]
    cross = [(d, n.id) for n in trace.nodes for d in n.data_deps if trace.nodes[d].attr("stream") != n.attr("stream")]
    assert cross
    for d, i in cross:
        src, dst = trace.nodes[d], trace.nodes[i]
        assert src.attr("duration_ns") is not None and dst.start_time_micros >= src.start_time_micros


def test_collectives_attrs_and_sizes(coll: RunConversion) -> None:
    trace = coll.traces[0]
    colls = [n for n in trace.nodes if n.type == NodeType.COMM_COLL_NODE]
    kinds = Counter(CommType(n.attr("comm_type")).name for n in colls)
    assert kinds == {"ALL_REDUCE": 6, "ALL_GATHER": 2, "REDUCE_SCATTER": 2, "BROADCAST": 2, "ALL_TO_ALL": 2}
    ag = next(n for n in colls if n.attr("comm_type") == CommType.ALL_GATHER)
    assert ag.attr("comm_size") == 4 * (1 << 20)  # the per-rank shard (ASTRA-sim's convention)
    assert {n.attr("pg_name") for n in colls} == {"0", "1"}
    assert coll.comm_groups == {1: [0, 1]}
    # collectives on one group are chained across streams
    by_pg = [n for n in colls if n.attr("pg_name") == "0"]
    for prev, n in zip(by_pg, by_pg[1:], strict=False):
        if prev.attr("stream") != n.attr("stream"):
            assert prev.id in n.ctrl_deps


def test_send_recv_pairs_match_across_ranks(coll: RunConversion) -> None:
    def p2p(rank: int, t: NodeType) -> list[tuple]:
        return [(n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
                for n in coll.traces[rank].nodes if n.type == t]

    sends, recvs = p2p(0, NodeType.COMM_SEND_NODE), p2p(1, NodeType.COMM_RECV_NODE)
    assert len(sends) == 2 and sorted(sends) == sorted(recvs)
    assert len(set(sends)) == 2  # distinct tags
    assert p2p(1, NodeType.COMM_SEND_NODE) == [] and p2p(0, NodeType.COMM_RECV_NODE) == []


def test_wait_transfer_split(coll: RunConversion, mcore: RunConversion) -> None:
    df = coll.collectives
    assert list(df.columns) == COLLECTIVE_COLUMNS
    assert len(df) == 32 and df["wait_s"].notna().all()
    assert ((df["wait_s"] + df["transfer_s"] - df["time_s"]).abs() < 1e-12).all()
    # in each instance the last rank to arrive does not wait (send/recv: the pair is one instance)
    df = df.assign(call=df["kind"].replace({"send": "p2p", "recv": "p2p"}))
    for _, g in df.groupby(["pg_name", "seq", "call"]):
        assert len(g) == 2 and g["wait_s"].min() == 0
    # the README's example: rank 1's all-reduce took ~809 us of which most is waiting for rank 0
    first = df[(df["rank"] == 1) & (df["seq"] == 17)].iloc[0]
    assert first["time_s"] > 8e-4 and first["transfer_s"] < 1e-4
    # transfer times agree across the two ranks within a few microseconds
    for _, g in df.groupby(["pg_name", "seq", "call"]):
        assert g["transfer_s"].max() - g["transfer_s"].min() < 1e-5
    # attrs on nodes
    n = next(n for n in coll.traces[1].nodes if n.attr("seq") == 17)
    assert n.attr("wait_ns") + n.attr("transfer_ns") == n.attr("duration_ns")
    # rank 0 only: the peer is missing, no split
    assert mcore.collectives["wait_s"].isna().all()
    assert all(n.attr("wait_ns") is None for n in mcore.traces[0].nodes)


def test_transfer_split_waits_for_the_last_member() -> None:
    """A member waits from its start to the last member's, at most its whole kernel; one call or calls in columns."""
    from calib.convert.run import transfer_split

    wait, transfer = transfer_split([100, 130, 160], [90, 80, 30])
    assert wait.tolist() == [60, 30, 0] and transfer.tolist() == [30, 50, 30]
    # a member whose kernel ended before the last arrived (a kernel 40 long, the last 60 later) waited all of it
    wait, transfer = transfer_split([[0, 0], [60, 5]], [[40, 40], [10, 10]])
    assert wait.tolist() == [[40, 5], [0, 0]] and transfer.tolist() == [[0, 35], [10, 10]]


def test_kernels_table(coll: RunConversion, mcore: RunConversion, kineto_gpu: dict) -> None:
    for conv, name in ((coll, "coll"), (mcore, "mcore")):
        df = conv.kernels
        assert list(df.columns) == KERNEL_COLUMNS
        n_comm = sum(len([c for c in b.comms]) for b in conv.builds.values())
        n_gpu = sum(len(v) for k, v in kineto_gpu.items() if k[0] == name)
        assert len(df) + n_comm == n_gpu
    assert set(coll.kernels["step"]) == {2, 3}
    assert set(mcore.kernels["step"]) == {0}
    gemm = mcore.kernels[mcore.kernels["op_class"] == "gemm"]
    assert len(gemm) > 100 and (gemm["flops"] == 2 * gemm["m"] * gemm["n"] * gemm["k"] * gemm["batch"]).all()
    assert set(mcore.kernels["op_class"]) <= {"gemm", "attention", "memory", "other"}
    assert (mcore.kernels["time_s"] > 0).all()
    # kernels of one stream run one after another: the span of their starts covers their busy time
    k = mcore.kernels[mcore.kernels["stream"] == 7].sort_values("start_s")
    assert k["start_s"].iloc[-1] - k["start_s"].iloc[0] >= k["time_s"].iloc[:-1].sum() - 1e-6


def test_convert_run_writes_ets_and_groups(coll_dir: Path, tmp_path: Path) -> None:
    conv = convert_run(coll_dir, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["comm_groups.json", "rank.0.et", "rank.1.et"]
    assert json.loads((tmp_path / "out" / "comm_groups.json").read_text()) == {"1": [0, 1]}
    back = read_et(tmp_path / "out" / "rank.1.et")
    assert encode(back) == encode(conv.traces[1])
    meta = {a.name: a.value for a in back.metadata_attrs}
    assert meta == {"rank": 1, "converted_by": "calib.convert/1", "host_trace": "host.1.json.gz",
                    "device_trace": "device.1.json.gz"}
    assert {n.attr("step") for n in back.nodes} == {2, 3}
    assert (tmp_path / "out" / "rank.0.et").read_bytes()[:2] != b"\x1f\x8b"  # plain for ASTRA-sim


def test_convert_pair(mcore_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rank.0.et.gz"
    convert_pair(mcore_dir / "host.0.json.gz", mcore_dir / "device.0.json.gz", out)
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert len(read_et(out).nodes) == 982


# ------------------------------------------------------------------ bad input


def _write_json(path: Path, data: object) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def test_host_and_device_of_different_ranks(coll_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(CalibError, match="different (processes|ranks)"):
        convert_traces({0: coll_dir / "host.0.json.gz"}, {0: coll_dir / "device.1.json.gz"})
    with pytest.raises(CalibError, match="different ranks"):
        convert_pair(coll_dir / "host.0.json.gz", coll_dir / "device.1.json.gz", tmp_path / "x.et")
    assert not list(tmp_path.iterdir())


def test_device_trace_without_record_function_ids(coll_dir: Path, tmp_path: Path) -> None:
    dev = _load(coll_dir / "device.0.json.gz")
    for e in dev["traceEvents"]:
        (e.get("args") or {}).pop("Record function id", None)
    bad = _write_json(tmp_path / "device.0.json.gz", dev)
    with pytest.raises(CalibError, match=r"device\.0\.json\.gz: .*no 'Record function id'.*execution_trace_observer"):
        convert_traces({0: coll_dir / "host.0.json.gz"}, {0: bad})


def test_host_trace_missing_fields_and_unknown_schema(coll_dir: Path, tmp_path: Path) -> None:
    host = _load(coll_dir / "host.0.json.gz")
    no_schema = {k: v for k, v in host.items() if k != "schema"}
    p = _write_json(tmp_path / "host.0.json.gz", no_schema)
    with pytest.raises(CalibError, match=r"host\.0\.json\.gz: .*lacks the field 'schema'"):
        convert_traces({0: p}, {0: coll_dir / "device.0.json.gz"})
    no_rf = json.loads(json.dumps(host))
    for n in no_rf["nodes"]:
        n["attrs"] = [a for a in n["attrs"] if a["name"] != "rf_id"]
    p = _write_json(tmp_path / "host.0.json.gz", no_rf)
    with pytest.raises(CalibError, match="lacks the attribute 'rf_id'"):
        convert_traces({0: p}, {0: coll_dir / "device.0.json.gz"})
    other = dict(host, schema="1.0.3-chakra.0.0.4")
    p = _write_json(tmp_path / "host.0.json.gz", other)
    with pytest.warns(UserWarning, match="not one calib was tested with"):
        conv = convert_traces({0: p}, {0: coll_dir / "device.0.json.gz"})
    assert len(conv.traces[0].nodes) == 72


def test_truncated_and_garbage_inputs(coll_dir: Path, tmp_path: Path) -> None:
    data = (coll_dir / "host.0.json.gz").read_bytes()
    cut = tmp_path / "host.0.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CalibError, match=r"host\.0\.json\.gz: corrupt or truncated gzip") as e:
        convert_traces({0: cut}, {0: coll_dir / "device.0.json.gz"})
    assert "\n" not in str(e.value)
    plain = tmp_path / "device.0.json"
    plain.write_text('{"traceEvents": [')
    with pytest.raises(CalibError, match=r"device\.0\.json: not valid JSON"):
        convert_traces({0: coll_dir / "host.0.json.gz"}, {0: plain})


def test_failed_run_conversion_writes_nothing(coll_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        (run / f"host.{r}.json.gz").write_bytes((coll_dir / f"host.{r}.json.gz").read_bytes())
        (run / f"device.{r}.json.gz").write_bytes((coll_dir / f"device.{r}.json.gz").read_bytes())
    data = (run / "device.1.json.gz").read_bytes()
    (run / "device.1.json.gz").write_bytes(data[:-100])
    out = tmp_path / "out"
    with pytest.raises(CalibError, match=r"device\.1\.json\.gz"):
        convert_run(run, out)
    assert not out.exists() or not list(out.iterdir())
    (run / "device.1.json.gz").unlink()
    with pytest.raises(CalibError, match="rank 1 has a host trace but no device trace"):
        convert_run(run, out)


def _as_coalesced(host: dict, dev: dict, call: str) -> None:
    """Synthetic input for the linking logic (never data): re-point the kernels of `call` (send or recv)
    to an "nccl:coalesced" op issued after the call, as torch does for batch_isend_irecv."""
    nodes = host["nodes"]
    rf_of = {n["id"]: next(a["value"] for a in n["attrs"] if a["name"] == "rf_id") for n in nodes}
    calls = [n for n in nodes if n["name"] == "record_param_comms"
             and any(a["name"] == "collective_name" and a["value"] == call for a in n["attrs"])]
    next_rf = max(rf_of.values()) + 1000
    cpu = {(e["args"] or {}).get("Record function id"): e for e in dev["traceEvents"] if e.get("cat") == "cpu_op"}
    for k, n in enumerate(calls):
        # ids follow execution order: endCoalescing's op comes right after the call (ids share a counter
        # with tensors, so there are free ids between ops)
        free = next(i for i in range(n["id"] + 1, n["id"] + 100) if i not in rf_of)
        new = {"id": free, "name": "nccl:coalesced", "ctrl_deps": n["ctrl_deps"],
               "inputs": {}, "outputs": {}, "attrs": [{"name": "rf_id", "type": "uint64", "value": next_rf + k}]}
        nodes.append(new)
        e = cpu[rf_of[n["id"]]]
        e["name"], e["args"]["Record function id"] = "nccl:coalesced", next_rf + k
    for e in dev["traceEvents"]:
        if e.get("cat") == "kernel" and (e.get("args") or {}).get("Collective name") == call:
            e["args"]["Collective name"] = "coalesced"


def test_coalesced_p2p_kernels(coll_dir: Path, tmp_path: Path) -> None:
    paths: dict[str, dict[int, Path]] = {"host": {}, "device": {}}
    for r, call in ((0, "send"), (1, "recv")):
        host, dev = _load(coll_dir / f"host.{r}.json.gz"), _load(coll_dir / f"device.{r}.json.gz")
        _as_coalesced(host, dev, call)
        paths["host"][r] = _write_json(tmp_path / f"host.{r}.json.gz", host)
        paths["device"][r] = _write_json(tmp_path / f"device.{r}.json.gz", dev)
    conv = convert_traces(paths["host"], paths["device"])
    sends = [(n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
             for n in conv.traces[0].nodes if n.type == NodeType.COMM_SEND_NODE]
    recvs = [(n.attr("comm_src"), n.attr("comm_dst"), n.attr("comm_tag"), n.attr("comm_size"))
             for n in conv.traces[1].nodes if n.type == NodeType.COMM_RECV_NODE]
    assert len(sends) == 2 and sorted(sends) == sorted(recvs)
    assert all(problems(t) == [] for t in conv.traces.values())
    assert len(conv.traces[0].nodes) == 72


def test_cuda_sync_events_give_exact_stream_waits(coll_dir: Path, tmp_path: Path) -> None:
    """Synthetic sync events (never data) added to the real trace, in the format Kineto writes with
    enable_cuda_sync_events: each cudaStreamWaitEvent says which stream waited for which record."""
    dev = _load(coll_dir / "device.0.json.gz")
    calls = sorted((e for e in dev["traceEvents"] if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    last_record = None
    added = 0
    # the DDP all-reduce (External id 558): after its kernel on stream 17, stream 7 waits for it
    after_kernel = [e for e in calls if e["args"].get("External id") == 558 and e["name"] == "cudaStreamWaitEvent"][-1:]
    for e in calls:
        if e["name"] == "cudaEventRecord":
            last_record = e["args"]["correlation"]
        elif e in after_kernel and last_record is not None:
            dev["traceEvents"].append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7,
                                       "ts": e["ts"], "dur": 0.001, "args": {"cuda_sync_kind": "Stream Wait Event",
                                       "stream": 7, "wait_on_stream": 17, "correlation": e["args"]["correlation"],
                                       "wait_on_cuda_event_record_corr_id": last_record}})
            added += 1
    assert added == 1
    p = _write_json(tmp_path / "device.0.json.gz", dev)
    conv = convert_traces({0: coll_dir / "host.0.json.gz"}, {0: p})
    t = conv.traces[0]
    ar = next(n for n in t.nodes if n.attr("stream") == 17)
    nxt = next(n for n in t.nodes if n.id > ar.id and n.attr("stream") == 7)
    assert ar.id in nxt.data_deps and problems(t) == []


def test_coalesced_kernel_with_two_calls(coll_dir: Path, tmp_path: Path) -> None:
    """Synthetic (never data): rank 0's two sends issued as one batch, i.e. one coalesced kernel after
    both calls; the first send's own kernel is removed. Both calls become SEND nodes running together."""
    host, dev = _load(coll_dir / "host.0.json.gz"), _load(coll_dir / "device.0.json.gz")
    sends = [e for e in dev["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("Collective name") == "send"]
    dev["traceEvents"].remove(sends[0])
    _as_coalesced(host, dev, "send")
    # only the second call's coalesced op launches a kernel; drop the first coalesced op
    first = min((n for n in host["nodes"] if n["name"] == "nccl:coalesced"), key=lambda n: n["id"])
    host["nodes"].remove(first)
    conv = convert_traces({0: _write_json(tmp_path / "host.0.json.gz", host)},
                          {0: _write_json(tmp_path / "device.0.json.gz", dev)})
    t = conv.traces[0]
    nodes = [n for n in t.nodes if n.type == NodeType.COMM_SEND_NODE]
    assert len(nodes) == 2 and len(t.nodes) == 72
    a, b = nodes
    assert b.id == a.id + 1 and b.attr("coalesced_with") == a.id and b.data_deps == a.data_deps
    assert (a.start_time_micros, a.attr("duration_ns")) == (b.start_time_micros, b.attr("duration_ns"))
    assert [n.attr("comm_tag") for n in nodes] == [0, 1]
    later = [n for n in t.nodes if n.id > b.id and n.attr("stream") == a.attr("stream")]
    assert not later or {a.id, b.id} <= set(later[0].data_deps)
    assert problems(t) == []


@pytest.mark.parametrize("name,kind,ct", [
    ("allreduce", "allreduce", CommType.ALL_REDUCE), ("_allgather_base", "allgather", CommType.ALL_GATHER),
    ("allgather_into_tensor_coalesced", "allgather", CommType.ALL_GATHER),
    ("_reduce_scatter_base", "reducescatter", CommType.REDUCE_SCATTER), ("all_to_allv", "alltoall", CommType.ALL_TO_ALL),
    ("broadcast", "broadcast", CommType.BROADCAST), ("barrier", "allreduce", CommType.ALL_REDUCE),
    ("send", "send", None), ("recv", "recv", None),
])
def test_collective_names(name: str, kind: str, ct: CommType | None) -> None:
    from calib.convert.link import comm_kind

    assert comm_kind(name) == (kind, ct)
    assert comm_kind("coalesced") is None and comm_kind("frobnicate") is None
