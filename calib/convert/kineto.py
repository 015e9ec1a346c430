"""The Kineto (chrome trace) side: GPU activities, their launches, CPU ops, sync and event calls.

Times are kept as integer nanoseconds: Kineto writes microseconds with three decimals.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib.convert.loader import load_json
from calib.errors import CalibError

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
CPU_CATS = {"cpu_op", "user_annotation"}
SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"}
RECORD_CALLS = {"cudaEventRecord", "cudaEventRecordWithFlags"}
WAIT_CALLS = {"cudaStreamWaitEvent"}
ENCLOSING_LOOKBACK = 4096  # CPU ops searched back from a launch for the one that encloses it


def us_to_ns(us: float) -> int:
    return int(round(float(us) * 1000.0))


def _event_ns(e: dict[str, Any], key: str, path: Path) -> int:
    """An event's `ts`/`dur` in ns; NaN, infinite or negative durations are bad input, not numbers."""
    try:
        ns = us_to_ns(e.get(key, 0))
    except (TypeError, ValueError, OverflowError):
        raise CalibError(f"{path}: event {e.get('name')!r} has a bad {key!r} {e.get(key)!r}") from None
    if key == "dur" and ns < 0:
        raise CalibError(f"{path}: event {e.get('name')!r} has a negative duration {e.get(key)!r} us")
    return ns


@dataclass(slots=True)
class GpuActivity:
    kind: str  # kernel | memcpy | memset
    name: str
    stream: int
    start_ns: int
    dur_ns: int
    correlation: int | None
    args: dict[str, Any]


@dataclass(slots=True)
class RuntimeCall:
    name: str
    tid: Any
    ts_ns: int
    dur_ns: int
    correlation: int | None
    external_id: int | None


@dataclass
class KinetoTrace:
    path: Path
    rank: int | None
    world_size: int | None
    pid: int | None
    base_time_ns: int
    gpu: list[GpuActivity] = field(default_factory=list)
    launches: dict[int, RuntimeCall] = field(default_factory=dict)  # correlation -> runtime call
    calls: list[RuntimeCall] = field(default_factory=list)  # every runtime/driver call, time order
    cpu_ops: dict[tuple[Any, int], dict[str, Any]] = field(default_factory=dict)  # (tid, External id)
    has_record_ids: bool = False
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (start_ns, end_ns, N) of ProfilerStep#N
    # CUDA sync events (enable_cuda_sync_events): correlation of a cudaStreamWaitEvent call ->
    # (waiting stream, stream waited on, correlation of the cudaEventRecord call)
    stream_waits: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    pg_config: list[dict[str, Any]] = field(default_factory=list)
    # per thread, (start_ns, end_ns, event) of every CPU op and annotation, by start: for launches
    # that carry no External id (driver-API launches such as NCCL's cuLaunchKernelEx)
    cpu_spans: dict[Any, list[tuple[int, int, dict[str, Any]]]] = field(default_factory=dict)


def parse_kineto(data: Any, path: Path) -> KinetoTrace:
    if not isinstance(data, dict) or "traceEvents" not in data:
        raise CalibError(f"{path}: not a Kineto trace (no 'traceEvents')")
    if not isinstance(data["traceEvents"], list) or not all(isinstance(e, dict) for e in data["traceEvents"]):
        raise CalibError(f"{path}: malformed Kineto trace: 'traceEvents' is not a list of event objects")
    try:
        return _parse_kineto(data, path)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of the wrong shape: one line
        raise CalibError(f"{path}: malformed Kineto trace ({type(exc).__name__}: {exc})") from None


def _parse_kineto(data: dict[str, Any], path: Path) -> KinetoTrace:
    dist = data.get("distributedInfo") or {}
    kt = KinetoTrace(
        path=path,
        rank=int(dist["rank"]) if "rank" in dist else None,
        world_size=int(dist["world_size"]) if "world_size" in dist else None,
        pid=None,
        base_time_ns=int(data.get("baseTimeNanoseconds", 0) or 0),
        pg_config=list(dist.get("pg_config", []) or []),
    )
    pids: Counter[Any] = Counter()
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        args = e.get("args") or {}
        if cat in GPU_CATS:
            if "ts" not in e or "dur" not in e:
                raise CalibError(f"{path}: GPU event {e.get('name')!r} lacks 'ts' or 'dur'")
            kt.gpu.append(GpuActivity(GPU_CATS[cat], str(e.get("name", "")), int(args.get("stream", e.get("tid", 0))),
                                      _event_ns(e, "ts", path), _event_ns(e, "dur", path), args.get("correlation"), args))
        elif cat == "cuda_sync":
            if "wait_on_stream" in args and args.get("correlation") is not None:
                rec = args.get("wait_on_cuda_event_record_corr_id")
                if rec is not None:
                    kt.stream_waits[int(args["correlation"])] = (int(args.get("stream", -1)), int(args["wait_on_stream"]), int(rec))
        elif cat in LAUNCH_CATS:
            call = RuntimeCall(str(e.get("name", "")), e.get("tid"), _event_ns(e, "ts", path), _event_ns(e, "dur", path),
                               args.get("correlation"), args.get("External id"))
            kt.calls.append(call)
            if call.correlation is not None:
                kt.launches[int(call.correlation)] = call
        elif cat in CPU_CATS:
            pids[e.get("pid")] += 1
            name = str(e.get("name", ""))
            start = _event_ns(e, "ts", path)
            end = start + _event_ns(e, "dur", path)
            if name.startswith("ProfilerStep#") and name[13:].isdigit():
                kt.steps.append((start, end, int(name[13:])))
            if "Record function id" in args:
                kt.has_record_ids = True
            kt.cpu_spans.setdefault(e.get("tid"), []).append((start, end, e))
            ext = args.get("External id")
            if ext is not None:
                key = (e.get("tid"), int(ext))
                # a cpu_op wins over a user_annotation that shares its External id
                if key not in kt.cpu_ops or cat == "cpu_op":
                    kt.cpu_ops[key] = e
    kt.calls.sort(key=lambda c: c.ts_ns)
    kt.steps.sort()
    for spans in kt.cpu_spans.values():
        spans.sort(key=lambda s: s[0])
    kt.pid = pids.most_common(1)[0][0] if pids else None
    return kt


def enclosing_cpu_op(kt: KinetoTrace, tid: Any, ts_ns: int) -> dict[str, Any] | None:
    """The innermost CPU op or annotation on thread `tid` running at `ts_ns` (latest start that
    still covers it), or None. Kineto gives driver-API launches no External id, so this is how such
    a launch finds the op that issued it (megatron's batched send/recv: "nccl:coalesced")."""
    spans = kt.cpu_spans.get(tid)
    if not spans:
        return None
    i = bisect.bisect_right(spans, ts_ns, key=lambda s: s[0])
    for j in range(i - 1, max(i - ENCLOSING_LOOKBACK, 0) - 1, -1):
        _start, end, e = spans[j]
        if end >= ts_ns and not str(e.get("name", "")).startswith("ProfilerStep#"):
            return e
    return None


def step_at(kt: KinetoTrace, ts_ns: int) -> int | None:
    """N of the ProfilerStep#N window holding a CPU time, None outside every window."""
    for start, end, n in kt.steps:
        if start <= ts_ns <= end:
            return n
    return None


def read_kineto(path: str | Path) -> KinetoTrace:
    p = Path(path)
    return parse_kineto(load_json(p), p)
