"""Every `calib` command against bad input, as a demanding user would hit it.

The rule (DEVELOPERS.md): bad input gets ONE line `error: ...` on stderr and exit status 2; never a
traceback, never a silently wrong number, never a half-written output that looks complete. Each case
builds its bad input in a temp folder, runs `calib.cli.main` in-process, and checks the status, that
stderr is exactly one `error:` line naming the cause, and that nothing new was left in the folder.

Known open problems in files other engineers own are marked xfail(strict=True) with the reason.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import lzma
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.chakra.codec import write_et
from calib.chakra.model import CommType, ExecutionTrace, Node, NodeType
from calib.cli import main

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "traces" / "h200"
GOOD = H200 / "llama8b-tp2"  # a real 2-GPU training bundle (TP 2), 450 KiB
OTHER = H200 / "gpt13b-tp2"
H100_KERNELS = ROOT / "traces" / "h100" / "kernels-h100"
CPU_BUNDLE = ROOT / "tests" / "data" / "cpu-gloo-dp2"
SHARED = Path(os.environ.get("CALIB_SHARED", ROOT.parent / "shared"))
SAMPLE = SHARED / "samples" / "h200x2-collectives"

Argv = list[str]
Build = Callable[[Path], Argv]


@dataclass
class Case:
    id: str
    build: Build  # makes the bad input under the temp folder; returns the argv
    says: str  # a piece of the error line: the cause, in the user's words
    xfail: str = ""  # an open problem in a file this test's author may not edit

    def param(self) -> object:
        marks = [pytest.mark.xfail(reason=self.xfail, strict=True)] if self.xfail else []
        return pytest.param(self, id=self.id, marks=marks)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_bad(case: Case, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run the case; assert exit 2, one `error:` line on stderr naming the cause, nothing new on disk."""
    argv = case.build(tmp)
    before = _files(tmp)
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except BaseException as exc:  # noqa: BLE001 - the failure we are looking for: a traceback
        pytest.fail(f"traceback instead of an error line: {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert rc == 2, f"exit status {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"stderr is not one error line: {err!r}"
    assert "Traceback" not in err
    assert case.says in lines[0], f"{case.says!r} not in {lines[0]!r}"
    left = _files(tmp) - before
    assert not left, f"output left behind: {sorted(left)}"


# ----------------------------------------------------------------------------------------------
# inputs


def _raw_et() -> bytes:
    return lzma.decompress((GOOD / "et" / "rank.0.et.xz").read_bytes())


def _write(tmp: Path, name: str, data: bytes | str) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        p.write_text(data)
    else:
        p.write_bytes(data)
    return p


def _gpu_node(i: int, deps: tuple[int, ...] = (), kind: NodeType = NodeType.COMP_NODE) -> Node:
    n = Node(id=i, name=f"n{i}", type=kind, duration_micros=5, data_deps=list(deps))
    n.set_attr("is_cpu_op", False)
    return n


def _allreduce(i: int, deps: tuple[int, ...] = (), size: int = 1 << 20) -> Node:
    n = _gpu_node(i, deps, NodeType.COMM_COLL_NODE)
    n.set_attr("comm_type", int(CommType.ALL_REDUCE))
    n.set_attr("comm_size", size)
    return n


def _send(i: int, dst: int) -> Node:
    n = _gpu_node(i, (), NodeType.COMM_SEND_NODE)
    for k, v in (("comm_src", 0), ("comm_dst", dst), ("comm_size", 1024), ("comm_tag", 7)):
        n.set_attr(k, v)
    return n


def _et_file(tmp: Path, name: str, nodes: list[Node]) -> Path:
    p = tmp / name
    write_et(ExecutionTrace(nodes=nodes), p)
    return p


SYSTEM = {
    "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"], "all-to-all-implementation": ["ring"],
    "collective-optimization": "localBWAware",
}
CG_OUTSIDE = json.dumps({"1": [0, 9]})
NETWORK_2 = "topology: [ FullyConnected ]\nnpus_count: [ 2 ]\nbandwidth: [ 100.0 ]\nlatency: [ 250.0 ]\n"


def _sim(tmp: Path, per_rank: Callable[[int], list[Node]] | None = None, ranks: int = 2,
         network: str = NETWORK_2, system: dict | str | None = None, memory: str = '{"memory-type": "NO_MEMORY_EXPANSION"}',
         extra: Argv = ()) -> Argv:
    """A `calib sim` command line over `ranks` ETs (default: compute then a world all-reduce)."""
    make = per_rank or (lambda r: [_gpu_node(0), _allreduce(1, (0,))])
    (tmp / "wl").mkdir(exist_ok=True)
    for r in range(ranks):
        _et_file(tmp, f"wl/et.{r}.et", make(r))
    sys_text = system if isinstance(system, str) else json.dumps(system or SYSTEM)
    return [
        "sim", f"--workload-configuration={tmp / 'wl' / 'et'}",
        f"--system-configuration={_write(tmp, 'system.json', sys_text)}",
        f"--network-configuration={_write(tmp, 'network.yml', network)}",
        f"--remote-memory-configuration={_write(tmp, 'memory.json', memory)}", *extra,
    ]


def _bundle(tmp: Path, change: Callable[[Path], object] | None = None, name: str = "b") -> Path:
    """A copy of a real bundle with one thing broken."""
    d = tmp / name
    shutil.copytree(GOOD, d)
    if change is not None:
        change(d)
    return d


def _manifest(**kw: object) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        m = json.loads((d / "manifest.json").read_text())
        m.update(kw)
        (d / "manifest.json").write_text(json.dumps(m))
    return change


def _column(table: str, column: str, value: object) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        df = pd.read_parquet(d / f"{table}.parquet")
        df[column] = value
        df.to_parquet(d / f"{table}.parquet")
    return change


def _drop_column(table: str, column: str) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        pd.read_parquet(d / f"{table}.parquet").drop(columns=[column]).to_parquet(d / f"{table}.parquet")
    return change


def _truncate(rel: str, keep: int) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        (d / rel).write_bytes((d / rel).read_bytes()[:keep])
    return change


# ----------------------------------------------------------------------------------------------
# calib trace show / json / convert

TRACE_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda t: t / "nope.et", "No such file"),
    "folder": (lambda t: (t / "d.et").mkdir() or t / "d.et", "Is a directory"),
    "empty": (lambda t: _write(t, "e.et", b""), "empty Chakra ET"),
    "random-bytes": (lambda t: _write(t, "r.et", np.random.default_rng(1).bytes(4000)), "Chakra ET"),
    "truncated-et": (lambda t: _write(t, "t.et", _raw_et()[: len(_raw_et()) // 2]), "truncated Chakra ET"),
    "truncated-gz": (lambda t: _write(t, "t.et.gz", gzip.compress(_raw_et())[:5000]), "truncated gzip"),
    "truncated-xz": (lambda t: _write(t, "t.et.xz", (GOOD / "et" / "rank.0.et.xz").read_bytes()[:5000]), "truncated xz"),
    "json-not-et": (lambda t: _write(t, "j.et", json.dumps({"schema": "1.0", "nodes": []})), "Chakra ET"),
}

TRACE_CASES: list[Case] = []
for _name, (_make, _says) in TRACE_FILES.items():
    TRACE_CASES.append(Case(f"show-{_name}", lambda t, m=_make: ["trace", "show", m(t)], _says))
    TRACE_CASES.append(Case(f"json-{_name}", lambda t, m=_make: ["trace", "json", m(t), "-o", t / "out.json"], _says))


def _convert(host: Callable[[Path], Path | str], device: Callable[[Path], Path | str], out: str = "rank.0.et") -> Build:
    return lambda t: ["trace", "convert", host(t), device(t), "-o", t / out]


def _sample(name: str) -> Callable[[Path], Path]:
    def get(t: Path) -> Path:
        if not SAMPLE.is_dir():
            pytest.skip(f"shared samples not found at {SAMPLE}")
        return SAMPLE / name
    return get


def _host_without(key: str) -> Callable[[Path], Path]:
    """The real rank-0 host trace with every node's `key` attribute removed (profiler run without the observer's ids)."""
    def make(t: Path) -> Path:
        data = json.loads(gzip.decompress(_sample("host.0.json.gz")(t).read_bytes()))
        for n in data["nodes"]:
            n["attrs"] = [a for a in n.get("attrs", []) if a.get("name") != key]
        return _write(t, "host.0.json", json.dumps(data))
    return make


def _run_dir(t: Path, names: tuple[str, ...], truncated: str = "") -> Path:
    d = t / "run"
    d.mkdir()
    for n in names:
        shutil.copy(_sample(n)(t), d / n)
    if truncated:
        (d / truncated).write_bytes(_sample(truncated)(t).read_bytes()[:4000])
    return d


def _other_sample(name: str) -> Path:
    other = SAMPLE.parent / "h200x2-mcore-tp2" / name
    if not other.is_file():
        pytest.skip(f"shared sample {other} not found")
    return other


def _device_durations(value: float) -> Callable[[Path], Path]:
    """The real rank-0 Kineto trace with every event's duration replaced (NaN, negative)."""
    def make(t: Path) -> Path:
        data = json.loads(gzip.decompress(_sample("device.0.json.gz")(t).read_bytes()))
        for e in data["traceEvents"]:
            if "dur" in e:
                e["dur"] = value
        return _write(t, "device.0.json", json.dumps(data))
    return make


CONVERT_CASES = [
    Case("convert-host-missing", _convert(lambda t: t / "nope.json", _sample("device.0.json.gz")), "No such file"),
    Case("convert-host-random", _convert(lambda t: _write(t, "h.json", b"\x00\xff" * 50), _sample("device.0.json.gz")), "JSON"),
    Case("convert-host-empty", _convert(lambda t: _write(t, "h.json", ""), _sample("device.0.json.gz")), "not valid JSON"),
    Case("convert-host-wrong-schema", _convert(lambda t: _write(t, "h.json", json.dumps({"schema": "9.9"})), _sample("device.0.json.gz")),
         "lacks the field 'nodes'"),
    Case("convert-host-no-rf-id", _convert(_host_without("rf_id"), _sample("device.0.json.gz")), "rf_id"),
    Case("convert-device-not-kineto", _convert(_sample("host.0.json.gz"), lambda t: _write(t, "d.json", "{}")), "not a Kineto trace"),
    Case("convert-device-truncated", _convert(_sample("host.0.json.gz"),
                                              lambda t: _write(t, "d.json.gz", _sample("device.0.json.gz")(t).read_bytes()[:3000])), "truncated"),
    Case("convert-device-truncated-xz", _convert(_sample("host.0.json.gz"),
                                                 lambda t: _write(t, "d.json.xz", lzma.compress(gzip.decompress(
                                                     _sample("device.0.json.gz")(t).read_bytes()))[:3000])), "truncated xz"),
    Case("convert-ranks-differ", _convert(_sample("host.0.json.gz"), _sample("device.1.json.gz")), "different ranks"),
    Case("convert-device-is-folder", _convert(_sample("host.0.json.gz"), lambda t: (t / "dev").mkdir() or t / "dev"), "Is a directory"),
    Case("convert-out-is-folder", lambda t: (t / "o").mkdir() or _convert(_sample("host.0.json.gz"), _sample("device.0.json.gz"), "o")(t),
         "is a folder"),
    Case("convert-out-under-file", lambda t: _write(t, "f", "x") and _convert(_sample("host.0.json.gz"), _sample("device.0.json.gz"), "f/r.et")(t),
         "cannot write"),
    Case("convert-dir-missing-rank", lambda t: ["trace", "convert", "--dir", _run_dir(t, ("host.0.json.gz", "device.0.json.gz", "host.1.json.gz")),
                                                "-o", t / "out"], "rank 1 has a host trace but no device trace"),
    Case("convert-dir-empty", lambda t: ["trace", "convert", "--dir", _run_dir(t, ()), "-o", t / "out"], "no host.N.json"),
    Case("convert-dir-not-folder", lambda t: ["trace", "convert", "--dir", _write(t, "f", "x"), "-o", t / "out"], "not a folder"),
    Case("convert-traces-of-other-runs", _convert(lambda t: _other_sample("host.0.json.gz"), _sample("device.0.json.gz")),
         "different runs or ranks"),
    Case("convert-host-nodes-malformed", _convert(lambda t: _write(t, "host.0.json", json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": [1]})),
                                                  _sample("device.0.json.gz")), "malformed host execution trace"),
    Case("convert-device-events-not-list", _convert(_sample("host.0.json.gz"), lambda t: _write(t, "device.0.json", '{"traceEvents": 5}')),
         "not a list of event objects"),
    Case("convert-device-nan-duration", _convert(_sample("host.0.json.gz"), _device_durations(float("nan"))), "bad 'dur'"),
    Case("convert-device-negative-duration", _convert(_sample("host.0.json.gz"), _device_durations(-5)), "negative duration"),
    Case("convert-dir-one-rank-truncated", lambda t: ["trace", "convert", "--dir", _run_dir(t, ("host.0.json.gz", "device.0.json.gz", "host.1.json.gz"),
                                                                                        truncated="device.1.json.gz"), "-o", t / "out"], "truncated"),
    Case("convert-no-inputs", lambda t: ["trace", "convert", "-o", t / "out.et"], "needs HOST and DEVICE"),
]


@pytest.mark.parametrize("case", [c.param() for c in TRACE_CASES + CONVERT_CASES])
def test_trace(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(case, tmp_path, capsys)


@pytest.mark.parametrize("name", list(TRACE_FILES))
def test_trace_check_reports_each_bad_file(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trace check` is a validator: exit 1 and one stdout line per bad file (its verdict), never a traceback."""
    make, says = TRACE_FILES[name]
    bad = make(tmp_path)
    good = _write(tmp_path, "good.et", _raw_et())
    rc = main(["trace", "check", str(good), str(bad)])
    out, err = capsys.readouterr()
    assert rc == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"{good}: ok" and len(lines) == 2 and lines[1].startswith(str(bad)) and says in lines[1]


@pytest.mark.parametrize(("nodes", "says"), [
    ([_gpu_node(0, (5,))], "missing node 5"),
    ([_gpu_node(0, (1,)), _gpu_node(1, (0,))], "dependency cycle through nodes 0 -> 1 -> 0"),
])
def test_trace_check_names_the_node(nodes: list[Node], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _et_file(tmp_path, "x.et", nodes)
    assert main(["trace", "check", str(p)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(str(p)) and says in out


# ----------------------------------------------------------------------------------------------
# calib sim

SIM_CASES = [
    Case("sim-missing-dep", lambda t: _sim(t, lambda r: [_gpu_node(0, (9,))]), "depends on node 9, which is not in its ET"),
    Case("sim-cycle", lambda t: _sim(t, lambda r: [_gpu_node(0, (1,)), _gpu_node(1, (0,))]), "dependency cycle"),
    Case("sim-collective-deadlock", lambda t: _sim(t, lambda r: [_gpu_node(0), _allreduce(1, (0,))] if r else [_gpu_node(0)]), "deadlock"),
    Case("sim-send-without-recv", lambda t: _sim(t, lambda r: [_send(0, 1)] if r == 0 else [_gpu_node(0)]), "no matching receive"),
    Case("sim-send-outside", lambda t: _sim(t, lambda r: [_send(0, 5)]), "outside the 2 ranks"),
    Case("sim-negative-size", lambda t: _sim(t, lambda r: [_allreduce(0, size=-5)]), "negative comm_size"),
    Case("sim-negative-duration", lambda t: _sim(t, lambda r: [_with_attr(_gpu_node(0), "duration_ns", -5, "int64_val")]),
         "rank 0: node 0 ('n0') has a negative duration"),
    Case("sim-invalid-node-type", lambda t: _sim(t, lambda r: [_with_type(_gpu_node(0), 99)]), "rank 0: node 0 ('n0') has node type 99"),
    Case("sim-missing-rank-et", lambda t: _sim(t, ranks=1), "et.1.et is missing"),
    Case("sim-truncated-et", lambda t: (_sim(t), _truncate("wl/et.1.et", 20)(t))[0], "truncated Chakra ET"),
    Case("sim-dims-fewer-than-ets", lambda t: _sim(t, ranks=4), "network has only 2 NPUs"),
    Case("sim-dims-more-than-ets", lambda t: _sim(t, network=NETWORK_2.replace("[ 2 ]", "[ 4 ]")), "et.2.et is missing"),
    Case("sim-dims-lengths-differ", lambda t: _sim(t, network=NETWORK_2.replace("[ FullyConnected ]", "[ FullyConnected, Switch ]")),
         "differ in length"),
    Case("sim-bandwidth-nan", lambda t: _sim(t, network=NETWORK_2.replace("100.0", ".nan")), "bandwidth"),
    Case("sim-latency-nan", lambda t: _sim(t, network=NETWORK_2.replace("250.0", ".nan")), "latency"),
    Case("sim-npus-not-a-number", lambda t: _sim(t, network=NETWORK_2.replace("[ 2 ]", "[ two ]")), "must be numbers"),
    Case("sim-topology-unknown", lambda t: _sim(t, network=NETWORK_2.replace("FullyConnected", "Torus3D")), "Torus3D"),
    Case("sim-network-not-yaml", lambda t: _sim(t, network="topology: [ Ring\n npus"), "network configuration"),
    Case("sim-system-not-json", lambda t: _sim(t, system="{"), "system configuration"),
    Case("sim-system-string-number", lambda t: _sim(t, system={**SYSTEM, "active-chunks-per-dimension": "x"}),
         "active-chunks-per-dimension must be a positive integer"),
    Case("sim-system-negative-peak", lambda t: _sim(t, system={**SYSTEM, "peak-perf": -5}), "peak-perf must be a positive number"),
    Case("sim-system-unknown-impl", lambda t: _sim(t, system={**SYSTEM, "all-reduce-implementation": ["bogus"]}), "bogus"),
    Case("sim-memory-expansion", lambda t: _sim(t, memory='{"memory-type": "PER_NODE_MEMORY_EXPANSION"}'), "not modelled"),
    Case("sim-comm-group-outside", lambda t: _sim(t, extra=[f"--comm-group-configuration={_write(t, 'cg.json', CG_OUTSIDE)}"]),
         "outside 0..1"),
    Case("sim-unknown-group", lambda t: _sim(t, lambda r: [_allreduce(0)] if r else [_named_group(_allreduce(0))]), "not in the comm groups"),
    Case("sim-timeline-under-file", lambda t: _sim(t, extra=[f"--timeline={_write(t, 'f', 'x')}/tl.json"]), "cannot write"),
    Case("sim-timeline-is-folder", lambda t: _sim(t, extra=[f"--timeline={t / 'wl'}"]), "is a folder"),
    Case("sim-logging-folder-is-file", lambda t: _sim(t, extra=[f"--logging-folder={_write(t, 'f', 'x')}"]), "logging folder"),
    Case("sim-backend-unknown", lambda t: _sim(t, extra=["--backend=foo"]), "unknown simulator backend"),
    Case("sim-astrasim-binary-missing", lambda t: _sim(t, extra=["--backend=astrasim", f"--astra-sim-bin={t / 'none'}"]), "not executable"),
]


def _with_attr(n: Node, name: str, value: object, slot: str) -> Node:
    n.set_attr(name, value, slot)
    return n


def _with_type(n: Node, node_type: int) -> Node:
    n.type = node_type  # type: ignore[assignment] - a value outside NodeType, as a corrupt file has
    return n


def _named_group(n: Node) -> Node:
    n.set_attr("pg_name", "42")
    return n


@pytest.mark.parametrize("case", [c.param() for c in SIM_CASES])
def test_sim(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(case, tmp_path, capsys)


# ----------------------------------------------------------------------------------------------
# calib measure (CPU path: every case fails before anything is launched)

def _need_torch() -> None:
    # find_spec, not importorskip: importing torch costs seconds, and these errors come before it is needed
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install -e .[measure])")


def _train(*args: str) -> Build:
    return lambda t: ["measure", "train", "--device", "cpu", "--steps", "1", "--warmup", "0", *args, "-o", t / "bundle"]


MEASURE_CASES = [
    Case("train-unknown-model", _train("--model", "nosuch"), "unknown model 'nosuch'"),
    Case("train-bad-scaled-model", _train("--model", "llama3-8b@Lfoo"), "unknown model"),
    Case("train-model-file-missing", _train("--model", "nope.yaml"), "does not exist"),
    Case("train-heads-not-divisible", _train("--model", "llama3-8b@L4", "--tp", "3"), "does not divide the 32 attention heads"),
    Case("train-ep-not-dividing-dp", _train("--model", "mixtral-8x7b@L2", "--ep", "3", "--dp", "2"), "EP 3 must divide DP 2"),
    Case("train-dp-zero", _train("--model", "llama3-8b@L2", "--dp", "0"), "dp must be a positive integer"),
    Case("train-recompute-unknown", _train("--model", "llama3-8b@L2", "--recompute", "sometimes"), "recompute must be one of"),
    Case("train-steps-zero", _train("--model", "llama3-8b@L2", "--steps", "0"), "steps >= 1"),
    Case("train-device-unknown", _train("--model", "llama3-8b@L2", "--device", "tpu"), "device must be one of"),
    Case("train-timeout-negative", _train("--model", "llama3-8b@L2", "--timeout", "-1"), "timeout must be a positive"),
    Case("train-gpus-not-int", _train("--model", "llama3-8b@L2", "--dp", "two"), "Invalid value for '--dp'"),
    Case("train-out-exists", lambda t: (t / "bundle").mkdir() or _train("--model", "llama3-8b@L2")(t), "already exists"),
    Case("train-out-under-file", lambda t: ["measure", "train", "--device", "cpu", "--model", "llama3-8b@L2",
                                             "-o", _write(t, "f", "x") / "b"], "cannot create it"),
    Case("collectives-group-sizes", lambda t: ["measure", "collectives", "--device", "cpu", "--gpus", "2", "--group-sizes", "x",
                                               "-o", t / "c"], "--group-sizes must be comma-separated integers"),
    Case("collectives-factor-one", lambda t: ["measure", "collectives", "--device", "cpu", "--gpus", "2", "--factor", "1",
                                              "-o", t / "c"], "size factor >= 2"),
    Case("collectives-one-rank", lambda t: ["measure", "collectives", "--device", "cpu", "--gpus", "1", "-o", t / "c"], "at least 2 ranks"),
    Case("convert-not-a-bundle", lambda t: ["measure", "convert", t / "nope"], "does not exist"),
    Case("convert-without-raw", lambda t: ["measure", "convert", _bundle(t)], "raw/ lacks traces"),
]


@pytest.mark.parametrize("case", [c.param() for c in MEASURE_CASES])
def test_measure(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _need_torch()
    run_bad(case, tmp_path, capsys)


def test_measure_run_that_dies_is_one_error_line_and_a_failed_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank lost mid-run (here: made to crash) ends in one error line and a bundle marked failed, never
    a complete-looking one; the output is relative to a cwd other than the repo (workers run in the repo)."""
    _need_torch()
    monkeypatch.setenv("CALIB_TEST_FAIL_RANK", "1")
    monkeypatch.chdir(tmp_path)
    rc = main(["measure", "train", "--device", "cpu", "--model", "gpt3-1.3b@L2", "--dp", "2", "--gbs", "4",
               "--warmup", "0", "--steps", "1", "--profile-steps", "0", "--master-port", "29877", "-o", "crash"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: run failed: rank 1: RuntimeError: injected failure")
    m = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert m["status"] == "failed" and "injected failure on rank 1" in m["failure"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crash"]


# ----------------------------------------------------------------------------------------------
# calib fit

def _fit(*bundles: Callable[[Path], Path], out: str = "cal.yaml", extra: Argv = ()) -> Build:
    return lambda t: ["fit", *[b(t) for b in bundles], "-o", t / out, *extra]


def _broken(change: Callable[[Path], object] | None, name: str = "b") -> Callable[[Path], Path]:
    return lambda t: _bundle(t, change, name)


def _real(p: Path) -> Callable[[Path], Path]:
    return lambda t: p


FIT_CASES = [
    Case("fit-missing-path", _fit(lambda t: t / "nope"), "neither a bundle nor a folder of bundles"),
    Case("fit-empty-file", _fit(lambda t: _write(t, "f", "")), "neither a bundle nor a folder of bundles"),
    Case("fit-empty-folder", _fit(lambda t: (t / "d").mkdir() or t / "d"), "no bundles to fit"),
    Case("fit-partial-folder", _fit(_broken(None, "run.partial")), "a .partial folder"),
    Case("fit-failed-manifest", _fit(_broken(_manifest(status="failed", failure="rank 1: CUDA error: device lost"))), "failed run: rank 1"),
    Case("fit-wrong-schema", _fit(_broken(_manifest(schema="calib.bundle/9"))), "schema 'calib.bundle/9' is not supported"),
    Case("fit-manifest-not-json", _fit(_broken(lambda d: (d / "manifest.json").write_text('{"schema": '))), "not valid JSON"),
    Case("fit-manifest-not-object", _fit(_broken(lambda d: (d / "manifest.json").write_text("[1]"))), "not a JSON object"),
    Case("fit-manifest-missing", _fit(_broken(lambda d: (d / "manifest.json").unlink())), "has no manifest.json"),
    Case("fit-missing-rank-et", _fit(_broken(lambda d: (d / "et" / "rank.1.et.xz").unlink())), "et/ lacks rank(s) [1]"),
    Case("fit-two-files-one-rank", _fit(_broken(lambda d: shutil.copy(d / "et" / "rank.1.et.xz", d / "et" / "rank.1.et.gz"))),
         "more than one file for rank(s) [1]"),
    Case("fit-misnamed-et", _fit(_broken(lambda d: shutil.copy(d / "et" / "rank.1.et.xz", d / "et" / "rank.x.et.xz"))),
         "et/rank.x.et.xz is not named rank.N.et"),
    Case("fit-nan-telemetry", _fit(_broken(_column("telemetry", "power_w", np.nan))), "NaN in power_w"),
    Case("fit-nan-steps", _fit(_broken(_column("steps", "time_s", np.nan))), "NaN step times"),
    Case("fit-negative-steps", _fit(_broken(_column("steps", "time_s", -1.0))), "step times <= 0"),
    Case("fit-nan-kernels", _fit(_broken(_column("kernels", "time_s", np.nan))), "kernels.parquet has NaN"),
    Case("fit-steps-column-missing", _fit(_broken(_drop_column("steps", "time_s"))), "lacks column(s) time_s"),
    Case("fit-steps-missing", _fit(_broken(lambda d: (d / "steps.parquet").unlink())), "missing steps.parquet"),
    Case("fit-truncated-parquet", _fit(_broken(_truncate("kernels.parquet", 500))), "kernels.parquet is unreadable"),
    Case("fit-mixed-gpus", _fit(_real(H100_KERNELS), _real(GOOD)), "different GPU models"),
    Case("fit-cpu-bundle", _fit(_real(CPU_BUNDLE)), "nothing to fit"),
    Case("fit-gpu-filter-matches-none", _fit(_real(GOOD), extra=["--gpu", "h100"]), "no bundle was measured on GPU 'h100'"),
    Case("fit-folds-one", _fit(_real(GOOD), extra=["--folds", "1"]), "Invalid value for '--folds'"),
    Case("fit-too-few-power-windows", _fit(_real(GOOD)), "power model"),
    Case("fit-out-is-folder", lambda t: (t / "o").mkdir() or _fit(_real(GOOD), _real(OTHER), out="o")(t), "is a folder"),
    Case("fit-out-under-file", lambda t: _write(t, "f", "x") and _fit(_real(GOOD), _real(OTHER), out="f/cal.yaml")(t),
         "is a file, not a folder"),
]


@pytest.mark.parametrize("case", [c.param() for c in FIT_CASES])
def test_fit(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(case, tmp_path, capsys)


# ----------------------------------------------------------------------------------------------
# calib project

@pytest.fixture(scope="module")
def h200_calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration fitted here on two real H200 bundles (the fit is what `calib fit` writes)."""
    out = tmp_path_factory.mktemp("cal") / "h200.yaml"
    assert main(["fit", str(GOOD), str(OTHER), "-o", str(out)]) == 0
    return out


def _cluster_nan_bandwidth(t: Path) -> Path:
    import yaml

    c = yaml.safe_load((ROOT / "simconfigs" / "h200-8.yaml").read_text())
    c["network"]["dims"][0]["bandwidth_bytes_per_s"]["value"] = float("nan")
    return _write(t, "cluster.yaml", yaml.safe_dump(c))


def _model_file(t: Path, **change: object) -> Path:
    import yaml

    arch = dict(name="m", layers=4, hidden=4096, ffn_hidden=14336, heads=32, kv_groups=8, seq_length=2048, vocab=128256,
                experts=0, top_k=0, norm="rmsnorm", activation="swiglu")
    arch.update(change)
    return _write(t, "model.yaml", yaml.safe_dump(arch))


def _project(*args: str) -> Build:
    return lambda t: ["project", "--gbs", "64", "--calibration", "none", *args]


PROJECT_CASES = [
    Case("project-unknown-model", _project("--model", "nosuch", "--gpus", "8"), "unknown model 'nosuch'"),
    Case("project-unknown-cluster", _project("--model", "llama3-8b", "--gpus", "8", "--cluster", "nosuch"), "unknown cluster 'nosuch'"),
    Case("project-cluster-file-wrong", lambda t: _project("--model", "llama3-8b", "--gpus", "8", "--cluster", _write(t, "c.yaml", "name: c\n"))(t),
         "schema must be 'calib.cluster/1'"),
    Case("project-model-file-incomplete", lambda t: _project("--model", _write(t, "m.yaml", "name: m\nlayers: 2\n"), "--gpus", "8")(t),
         "missing model key"),
    Case("project-cluster-nan-bandwidth", lambda t: _project("--model", "llama3-8b", "--gpus", "8", "--cluster", _cluster_nan_bandwidth(t))(t),
         "bandwidth_bytes_per_s.value: must be a finite non-negative number, got nan"),
    Case("project-model-nan-hidden", lambda t: _project("--model", _model_file(t, hidden=float("nan")), "--gpus", "8")(t),
         "hidden must be a positive integer, got nan"),
    Case("project-gpus-not-tp-pp-dp", _project("--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--dp", "4"),
         "must equal TP x PP x DP"),
    Case("project-gpus-not-multiple-of-tp", _project("--model", "llama3-8b", "--gpus", "8", "--tp", "3"), "not a multiple of TP x PP"),
    Case("project-gpus-not-whole-nodes", _project("--model", "llama3-8b", "--gpus", "12", "--tp", "4"), "not a multiple of the node size 8"),
    Case("project-ep-not-dividing-dp", _project("--model", "mixtral-8x7b", "--gpus", "8", "--ep", "3"), "EP 3 must divide DP 8"),
    Case("project-tp-vs-kv-groups", _project("--model", "llama3-8b", "--gpus", "16", "--tp", "16"), "does not divide the 8 KV groups"),
    Case("project-layers-not-divisible", _project("--model", "llama3-8b@L6", "--gpus", "4", "--pp", "4", "--cluster", "h200-4"),
         "PP 4 does not divide the 6 layers"),
    Case("project-gpus-zero", _project("--model", "llama3-8b", "--gpus", "0"), "GPU count must be a positive integer"),
    Case("project-gpus-not-int", _project("--model", "llama3-8b", "--gpus", "abc"), "Invalid value for '--gpus'"),
    Case("project-missing-option", lambda t: ["project", "--model", "llama3-8b"], "Missing option '--gpus'"),
    Case("project-gbs-not-multiple", lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "12", "--calibration", "none"],
         "not a multiple of micro-batch x DP"),
    Case("project-recompute-unknown", _project("--model", "llama3-8b", "--gpus", "8", "--recompute", "x"), "recompute must be one of"),
    Case("project-sp-without-tp", _project("--model", "llama3-8b", "--gpus", "8", "--sp"), "sequence parallel needs TP > 1"),
    Case("project-backend-unknown", _project("--model", "llama3-8b", "--gpus", "8", "--backend", "foo"), "backend must be one of"),
    Case("project-calibration-missing", lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "64",
                                                   "--calibration", t / "nope.yaml"], "does not exist"),
    Case("project-calibration-not-yaml", lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "64",
                                                    "--calibration", _write(t, "c.yaml", "schema: [")], "calibration file"),
    Case("project-calibration-wrong-schema", lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "64", "--calibration",
                                                        _write(t, "c.yaml", "schema: calib.calibration/7\ngpu: NVIDIA H200\n")],
         "schema 'calib.calibration/7' is not supported"),
    Case("project-calibration-folder", lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "64", "--calibration", t],
         "Is a directory"),
    Case("project-sweep-impossible", _project("--model", "llama3-8b", "--gpus", "7", "--cluster", "h200-7", "--sweep"),
         "no valid parallel configuration"),
    Case("project-plot-suffix", lambda t: _project("--model", "llama3-8b", "--gpus", "8", "--plot", t / "p.txt")(t), "must end in .png or .html"),
    Case("project-emit-into-file", lambda t: _project("--model", "llama3-8b", "--gpus", "8", "--emit-astra-sim", _write(t, "f", "x"))(t), "is a file"),
    Case("project-sweep-max-zero", _project("--model", "llama3-8b", "--gpus", "8", "--sweep", "--sweep-max", "0"), "sweep-max"),
]


@pytest.mark.parametrize("case", [c.param() for c in PROJECT_CASES])
def test_project(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(case, tmp_path, capsys)


@pytest.mark.parametrize("cluster", ["dgx-h100", "mi250"])
def test_project_calibration_from_another_gpu(cluster: str, h200_calibration: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = Case(f"project-h200-calibration-on-{cluster}",
                lambda t: ["project", "--model", "llama3-8b", "--gpus", "8", "--gbs", "64", "--cluster", cluster,
                           "--calibration", h200_calibration], "--allow-gpu-mismatch")
    run_bad(case, tmp_path, capsys)


# ----------------------------------------------------------------------------------------------
# calib validate (no held-out fits: the bad input must be refused before or without them)

def _validate(bundle: Callable[[Path], Path], calibration: Callable[[Path], Path | str] | None = None, out: str = "reports",
              replay: bool = True) -> Build:
    def build(t: Path) -> Argv:
        cal = calibration(t) if calibration else t / "no-calibration.yaml"
        return ["validate", "--no-heldout", "--no-write-calibration", "--replay" if replay else "--no-replay", bundle(t),
                "--calibration", cal, "--out", t / out]
    return build


VALIDATE_CASES = [
    Case("validate-missing-path", _validate(lambda t: t / "nope"), "neither a bundle nor a folder of bundles"),
    Case("validate-failed-bundle", _validate(_broken(_manifest(status="failed", failure="GPU 1 fell off the bus"))), "failed run: GPU 1"),
    Case("validate-partial-bundle", _validate(_broken(None, "run.partial")), "a .partial folder"),
    Case("validate-missing-rank", _validate(_broken(lambda d: (d / "et" / "rank.1.et.xz").unlink())), "et/ lacks rank(s) [1]"),
    Case("validate-nan-telemetry", _validate(_broken(_column("telemetry", "power_w", np.nan))), "NaN in power_w"),
    Case("validate-calibration-missing", _validate(_real(GOOD)), "does not exist"),
    Case("validate-calibration-not-yaml", _validate(_real(GOOD), lambda t: _write(t, "c.yaml", "schema: [")), "calibration file"),
]


@pytest.mark.parametrize("case", [c.param() for c in VALIDATE_CASES])
def test_validate(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(case, tmp_path, capsys)


@pytest.mark.parametrize("what", [
    "empty-folder",
    "only-cpu-bundles",
])
def test_validate_nothing_to_validate(what: str, h200_calibration: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundles = (lambda t: (t / "d").mkdir() or t / "d") if what == "empty-folder" else _real(CPU_BUNDLE)
    run_bad(Case(f"validate-{what}", _validate(bundles, lambda _: h200_calibration), "bundle"), tmp_path, capsys)


def test_validate_out_is_a_file(h200_calibration: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(Case("validate-out-is-file", lambda t: (_write(t, "f", "x"), _validate(_real(GOOD), lambda _: h200_calibration, "f", replay=False)(t))[1],
                 "f"), tmp_path, capsys)


def test_validate_thresholds_missing(h200_calibration: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(Case("validate-thresholds-missing",
                 lambda t: [*_validate(_real(GOOD), lambda _: h200_calibration, replay=False)(t), "--check", "--thresholds", t / "nope.yaml"],
                 "nope.yaml does not exist"), tmp_path, capsys)


def test_validate_truncated_et(h200_calibration: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(Case("validate-truncated-et", _validate(_broken(_truncate("et/rank.1.et.xz", 1000)), lambda _: h200_calibration),
                 "rank.1.et.xz"), tmp_path, capsys)


# ----------------------------------------------------------------------------------------------
# the CLI itself

@pytest.mark.parametrize(("argv", "says"), [
    ([], "calib needs a command"),
    (["trace"], "calib trace needs a command"),
    (["nosuch"], "No such command 'nosuch'"),
    (["fit"], "Missing argument"),
    (["trace", "show", "--bogus"], "No such option"),
])
def test_usage_errors_are_one_line(argv: Argv, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and says in err


def test_convert_writes_no_rank_when_one_cannot_be_encoded(tmp_path: Path) -> None:
    """Rank 1 cannot be written (a negative duration): rank 0 must not be left behind as a converted run."""
    from calib.convert.run import RunConversion, write_outputs
    from calib.errors import CalibError

    bad = _gpu_node(0)
    bad.duration_micros = -3
    conv = RunConversion({0: ExecutionTrace(nodes=[_gpu_node(0)]), 1: ExecutionTrace(nodes=[bad])}, {}, pd.DataFrame(), pd.DataFrame())
    with pytest.raises(CalibError, match="cannot write node 0"):
        write_outputs(conv, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sim_astrasim_that_stops_early(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A binary named by a relative path (it runs in another folder) that reports only rank 0: one error line."""
    monkeypatch.chdir(tmp_path)
    fake = _write(tmp_path, "fake_astra.sh", "#!/bin/sh\necho 'sys[0] finished, 10 cycles, exposed communication 5 cycles.'\n")
    fake.chmod(0o755)
    run_bad(Case("sim-astrasim-incomplete", lambda t: _sim(t, extra=["--backend=astrasim", "--astra-sim-bin=./fake_astra.sh"]),
                 "reported 1 of 2 ranks"), tmp_path, capsys)
