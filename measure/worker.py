"""One rank of a training measurement, started by torchrun from measure.train (never by hand).

    python -m torch.distributed.run ... -m measure.worker REQUEST.json

Writes into the request's work_dir: rank.N.json (step times, memory, versions), host.N.json and
device.N.json (the profiled step's PyTorch execution trace and Kineto trace), and on any failure
rank.N.error.json with a one-line reason (an out-of-memory error says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from calib.bundle.schema import STEP_OPTIONAL_COLUMNS
from measure import own_pace
from measure.env import apply_safe_env, software_versions
from measure.request import TrainRequest


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _stage(rank: int, what: str, t0: float) -> None:
    """Progress on stderr (the run's log), rank 0 only: where the time of a run goes."""
    if rank == 0:
        print(f"[rank 0 +{time.monotonic() - t0:7.2f}s] {what}", file=sys.stderr, flush=True)


def memory_probe(at: str, cuda: bool) -> dict:
    """The device's used memory beside what torch's caching allocator holds, between steps.

    What the device uses beyond the allocator's reserve (CUDA context, NCCL and library buffers,
    loaded kernels) is what an out-of-memory verdict from allocator bytes alone misses. Device-wide
    (cudaMemGetInfo): one process per GPU, as `calib measure` runs them."""
    if not cuda:
        return {"at": at, "used_bytes": 0, "reserved_bytes": 0, "total_bytes": 0}
    import torch

    free, total = torch.cuda.mem_get_info()
    # `total` is what the device lets a process use (79.2 GiB on an H100 whose total_memory is 79.6).
    return {"at": at, "used_bytes": int(total - free), "reserved_bytes": int(torch.cuda.memory_reserved()),
            "total_bytes": int(total)}


def run(req: TrainRequest, rank: int, world: int, local_rank: int, out: Path) -> None:
    t0 = req.t0_monotonic
    _stage(rank, "worker started", t0)
    import torch
    import torch.distributed as dist

    cuda = req.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    model = req.model_spec()
    _stage(rank, "process group up", t0)
    if cuda:
        from measure.mcore import build_training

        step, info = build_training(req, model)
    else:
        from measure.cpu_model import build_training

        step, info = build_training(req, model)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    _stage(rank, f"model built ({info.get('backend')})", t0)
    rows: list[dict] = []
    probes: list[dict] = []
    for _ in range(req.warmup):
        step()
    sync()
    n = req.warmup
    _stage(rank, "warm-up done", t0)
    probes.append(memory_probe("warm-up", cuda))

    own = own_pace.timer(cuda) if req.own_pace else None

    def timed_step(profiled: bool) -> None:
        nonlocal n
        sync()
        start = time.monotonic()
        step()
        sync()
        end = time.monotonic()
        row = {"rank": rank, "step": n, "start_s": start - req.t0_monotonic, "time_s": end - start, "profiled": profiled}
        if own is not None:
            if profiled:  # nothing after a profiled step: it would land in the step's traces
                row.update(dict.fromkeys(STEP_OPTIONAL_COLUMNS, float("nan")))
            else:
                row.update(own())
                if world > 1:
                    dist.barrier()  # every rank starts the next step together, whatever its own timing took
        rows.append(row)
        n += 1

    for _ in range(req.steps):
        timed_step(False)
    probes.append(memory_probe("measured steps", cuda))
    profiled: list[int] = []
    if req.profile_steps > 0:
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        et = ExecutionTraceObserver()
        et.register_callback(str(out / f"host.{rank}.json"))
        dist.barrier()
        with profile(activities=activities, record_shapes=True, execution_trace_observer=et) as prof:
            for _ in range(req.profile_steps):
                profiled.append(n)
                timed_step(True)
        _stage(rank, "profiled step done", t0)
        prof.export_chrome_trace(str(out / f"device.{rank}.json"))
        _stage(rank, "Kineto trace written", t0)
        with contextlib.suppress(Exception):  # already stopped by profile() on some torch versions
            et.unregister_callback()
        probes.append(memory_probe("profiled steps", cuda))
    memory = {"rank": rank, "peak_allocated_bytes": 0, "peak_reserved_bytes": 0}
    if cuda:
        memory["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        memory["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        memory["outside_allocator_bytes"] = max(p["used_bytes"] - p["reserved_bytes"] for p in probes)
        memory["device_used_bytes"] = max(p["used_bytes"] for p in probes)
        memory["probes"] = probes
    result = {
        "rank": rank, "world": world, "steps": rows, "profiled": profiled, "memory": memory,
        "software": software_versions() if rank == 0 else {}, "info": info,
    }
    if cuda and rank == 0:
        props = torch.cuda.get_device_properties(local_rank)
        result["gpu"] = {"name": props.name, "memory_bytes": int(props.total_memory)}
    _write_json(out / f"rank.{rank}.json", result)
    dist.barrier()
    _stage(rank, "results written", t0)


def main(argv: list[str]) -> int:
    apply_safe_env()
    req = TrainRequest.load(argv[1])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    out = Path(req.work_dir)
    fail_at = os.environ.get("CALIB_TEST_FAIL_RANK")  # tests: make one rank crash on purpose
    try:
        if fail_at is not None and int(fail_at) == rank:
            raise RuntimeError(f"injected failure on rank {rank} (CALIB_TEST_FAIL_RANK)")
        run(req, rank, world, local_rank, out)
        sys.stdout.flush()
        sys.stderr.flush()
        # Results are on disk and every rank passed the barrier: skip NCCL/CUDA teardown and
        # interpreter shutdown, which took tens of seconds per run on the H200 hosts.
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a one-line reason for the bundle
        reason = ("out of memory: " if is_oom(exc) else "") + one_line(exc)
        _write_json(out / f"rank.{rank}.error.json", {"rank": rank, "error": reason, "oom": is_oom(exc)})
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)  # skip NCCL teardown, which can hang when a peer is gone
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
