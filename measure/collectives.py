"""`calib measure collectives`: NCCL (or gloo on CPU) collective microbenchmarks -> a collectives bundle.

Each point (kind, group size, bytes) is timed `repeats` times after `warmup` untimed runs: the
members meet at a barrier, then each times `iters` back-to-back collectives with one pair of CUDA
events (wall clock on CPU) and divides by `iters`, as nccl-tests does. With iters = 1 (the first
H200 campaigns) the events bracket one call on an idle GPU and the time carries the launch floor,
50-70 us on H200, which hides every size below ~16 MiB; back-to-back calls keep the GPU busy, so
the floor is paid once per window. Per repetition, time_s is the slowest member's time and
transfer_s the fastest member's (the member that arrived last waited least, so its time is the
closest to pure transfer); wait_s is their difference. The table holds the medians over
repetitions and the nccl-tests algbw/busbw of the median time (measure/conventions.py). Groups are
the first n ranks of the host.

`timing="kernel"` (CUDA only) times what the simulator consumes instead: after `warmup` calls and a
barrier, `repeats` back-to-back collectives run under the CUDA profiler (Kineto) and each call is
timed by its NCCL kernel's duration, as the collectives inside profiled training steps are
(calib.convert.run). Per call, time_s is the longest member's kernel and transfer_s the shortest
(the last member to launch waits least), the medians over calls go to the table. No launch floor:
these points share the training collectives' latency.

`timing="kernel-isolated"` (CUDA only) times each call as a training step meets it, alone on an idle GPU: per
call a device sync, then one collective, the members meeting no barrier (they arrive within their hosts'
jitter, as a step's ranks do; a CPU barrier per call made 441 points outlast a 300 s call); `repeats` calls
under the CUDA profiler. transfer_s is the training steps' split (calib.convert.run): per call each
member's kernel end less the last member's start, averaged over the members as calib.models.network_points
merges a training call's ranks. For all-to-all on 2 and 4 x H200 the fastest member's kernel is 10-17 %
shorter than that split at 8-9.5 MiB, and back-to-back calls of 32-64 MiB in groups of 4 4-23 % longer than calls
alone (measure/probes/a2a_context.py, traces/README.md, round 42). The
manifest's notes.timing_method says which of the four ways a bundle was timed ("events-one-call",
"events-loop", "kernel", "kernel-isolated").
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from calib.bundle.schema import COLLECTIVE_COLUMNS, KERNEL_TIMING_METHODS, GpuInfo, Manifest, Software
from calib.errors import CalibError
from measure.conventions import KINDS, bandwidths_gbps
from measure.env import child_env, host_name, visible_gpus
from measure.train import REPO_ROOT, last_error_line, open_writer, run_process

GLOO_KINDS = ("all_reduce", "all_gather", "send_recv")
# Timings whose points calib fit refuses (calib.fit.timed_by_events: a method it does not know) until the model reads
# them: "kernel-released", each call's members released together on the GPU and one (`late_member`, by default the
# group's last: a send/recv's receiver) `late_us` after.
RELEASED = "kernel-released"
TIMINGS = ("events", *KERNEL_TIMING_METHODS, RELEASED)
# The GPU sleeps this long before a released pass's calls so that the host's launches (a release, a sleep and the
# collective a call) are all queued before the first runs (measure.probes.a2a_stagger: without it the host paced
# calls of 8-32 MiB, members 50-90 us apart at no delay).
HEAD_START_US = 20_000.0


def default_sizes(lo: int = 2**10, hi: int = 2**30, step: int = 4, per_doubling: int = 0, align: int = 1) -> list[int]:
    """Message sizes from lo to hi: each `step` times the last, or, with per_doubling > 0, that many per
    doubling (lo * 2^(k / per_doubling)) rounded to a multiple of `align` bytes, to resolve the bends of
    NCCL's curve between its protocol ranges that a grid of factors of 2 steps over. Training messages are
    multiples of large powers of two (a hidden size times tokens in bf16); a 2 x H200 host took up to 1.8x
    longer for sizes that are only multiples of 4 bytes (traces/README.md, round 39), so align those."""
    if lo < 1 or hi < lo or step < 2 or per_doubling < 0 or align < 1:
        raise CalibError(f"message sizes need 1 <= min-bytes <= max-bytes, a size factor >= 2, per-doubling >= 0 and "
                         f"align >= 1, got {lo}, {hi}, {step}, {per_doubling}, {align}")
    if per_doubling:
        doublings = math.floor(math.log2(hi / lo) * per_doubling + 1e-9)
        sizes = {max(align, round(lo * 2 ** (k / per_doubling) / align) * align) for k in range(doublings + 1)}
        return sorted(s for s in sizes if s <= hi)
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return out


def _elements(kind: str, n: int, nbytes: int, elem: int) -> int:
    """Elements of the per-rank buffer for a point sized by nccl-tests' convention (divisible by n)."""
    total = max(nbytes // elem, n)
    return total - total % n


def _make_op(dist: Any, torch: Any, kind: str, n: int, count: int, dtype: Any, dev: Any, group: Any,
             rank: int) -> Callable[[], object]:
    """One collective call over fresh buffers of `count` elements (nccl-tests sizing)."""
    if kind == "all_gather":
        inp = torch.ones(count // n, dtype=dtype, device=dev)
        outp = torch.empty(count, dtype=dtype, device=dev)
        return lambda: dist.all_gather_into_tensor(outp, inp, group=group)
    if kind == "reduce_scatter":
        inp = torch.ones(count, dtype=dtype, device=dev)
        outp = torch.empty(count // n, dtype=dtype, device=dev)
        return lambda: dist.reduce_scatter_tensor(outp, inp, group=group)
    if kind == "all_to_all":
        inp = torch.ones(count, dtype=dtype, device=dev)
        outp = torch.empty(count, dtype=dtype, device=dev)
        return lambda: dist.all_to_all_single(outp, inp, group=group)
    buf = torch.ones(count, dtype=dtype, device=dev)
    if kind == "send_recv":
        return (lambda: dist.send(buf, 1)) if rank == 0 else (lambda: dist.recv(buf, 0))
    return lambda: dist.all_reduce(buf, group=group)


def nccl_kernels(torch: Any, calls: Callable[[], None]) -> list[tuple[float, float, float]]:
    """(trace base us, start us from it, duration us) of the NCCL kernels `calls` launches, in launch order, from a
    CUDA profile of just them (the base keeps the starts exact; one clock for the host's ranks)."""
    import tempfile

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        calls()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        data = json.loads(path.read_text())
    base_us = int(data.get("baseTimeNanoseconds", 0) or 0) / 1e3
    return sorted((base_us, float(e["ts"]), float(e["dur"])) for e in data.get("traceEvents", [])
                  if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower())


def cycles_per_us(torch: Any) -> float:
    """The GPU's sleep cycles (`torch.cuda._sleep`) per microsecond, from one timed 2 M-cycle sleep."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / (start.elapsed_time(end) * 1e3)


def released_calls(torch: Any, op: Callable[[], object], warmup: int, repeats: int, dist: Any, group: Any,
                   late_cycles: int, per_us: float) -> list[tuple[float, float, float]]:
    """`nccl_kernels` of `repeats` calls, each after a one-element all-reduce that releases the members together on
    the GPU, this member sleeping `late_cycles` first (the late member, or nobody), all queued behind a HEAD_START_US
    GPU sleep (`per_us`: `cycles_per_us`); the releases' kernels, every other one in launch order, are left out.
    The harness's `--timing kernel-released` and the probes measure.probes.a2a_stagger and p2p_batched."""
    flag = torch.zeros(1, dtype=torch.float32, device=torch.device("cuda", torch.cuda.current_device()))

    def call() -> None:
        dist.all_reduce(flag, group=group)
        if late_cycles:
            torch.cuda._sleep(late_cycles)
        op()

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    head = int(HEAD_START_US * per_us)

    def calls() -> None:
        torch.cuda._sleep(head)
        for _ in range(repeats):
            call()

    kernels = nccl_kernels(torch, calls)
    if len(kernels) != 2 * repeats:
        raise CalibError(f"released timing: the profile holds {len(kernels)} NCCL kernels for {repeats} calls and "
                         f"their releases")
    return kernels[1::2]


def _kernel_calls(torch: Any, op: Callable[[], object], warmup: int, repeats: int, dist: Any, group: Any,
                  isolated: bool = False) -> list[tuple[float, float, float]]:
    """`nccl_kernels` of `repeats` calls (warm-up calls and the barrier stay outside the profile): back to back after
    one barrier, or (`isolated`) each after a device sync, on an idle GPU."""
    for _ in range(warmup):
        op()
    dist.barrier(group=group)
    torch.cuda.synchronize()

    def calls() -> None:
        for _ in range(repeats):
            if isolated:
                torch.cuda.synchronize()
            op()

    kernels = nccl_kernels(torch, calls)
    if len(kernels) != repeats:
        raise CalibError(f"kernel timing: the profile holds {len(kernels)} NCCL kernels for {repeats} calls")
    return kernels


def call_starts(calls: Any) -> tuple[Any, Any]:
    """(starts, durations) in us, members x calls, on one clock, from members x calls x (trace base us, start us from
    it, duration us) as `nccl_kernels` gives them per member."""
    import numpy as np

    t = np.asarray(calls, dtype=float)
    return (t[:, :, 0] - t[:, :, 0].min()) + t[:, :, 1], t[:, :, 2]


def call_times(calls: Any) -> tuple[Any, Any, Any]:
    """Per call, from members x calls x (trace base us, start us, duration us): the longest member's kernel, the
    shortest's, and the training steps' transfer (calib.convert.run.transfer_split, averaged over the members as
    calib.models.network_points merges a training call's ranks), in seconds."""
    from calib.convert.run import transfer_split

    start, dur = call_starts(calls)
    _, transfer = transfer_split(start, dur)
    return dur.max(axis=0) * 1e-6, dur.min(axis=0) * 1e-6, transfer.mean(axis=0) * 1e-6


def _bench(args: dict) -> None:
    """Body of one rank (under torchrun)."""
    import torch
    import torch.distributed as dist

    cuda = args["device"] == "cuda"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cuda:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
        dtype = torch.bfloat16
    else:
        dist.init_process_group("gloo")
        dev = torch.device("cpu")
        dtype = torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    groups = {}
    for n in args["group_sizes"]:
        if n <= world:
            groups[n] = dist.new_group(list(range(n))) if n < world else dist.group.WORLD
    iters = int(args.get("iters", 1))  # collectives per timed window
    timing = args.get("timing", "events")
    kernel_timing = timing in (*KERNEL_TIMING_METHODS, RELEASED)
    per_us = cycles_per_us(torch) if timing == RELEASED else 0.0
    late_cycles = int(float(args.get("late_us", 0.0)) * per_us)
    results = []

    def clock() -> tuple:
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ("ev", ev)
        return ("t", time.perf_counter())

    def elapsed(a: tuple, b: tuple) -> float:
        if cuda:
            torch.cuda.synchronize()
            return a[1].elapsed_time(b[1]) * 1e-3
        return b[1] - a[1]

    for kind in args["kinds"]:
        for n, group in groups.items():
            if kind == "send_recv" and n != 2:
                continue
            member = rank < n
            for nbytes in args["sizes"]:
                count = _elements(kind, n, nbytes, elem)
                if member:
                    op = _make_op(dist, torch, kind, n, count, dtype, dev, group, rank)
                    if timing == RELEASED:
                        calls = released_calls(torch, op, args["warmup"], args["repeats"], dist, group,
                                               late_cycles if rank == int(args.get("late_member", -1)) % n else 0,
                                               per_us)
                        mine = torch.tensor(calls, dtype=torch.float64, device=dev)
                    elif kernel_timing:
                        calls = _kernel_calls(torch, op, args["warmup"], args["repeats"], dist, group,
                                              isolated=timing == "kernel-isolated")
                        mine = torch.tensor(calls, dtype=torch.float64, device=dev)
                    else:
                        times = []
                        for i in range(args["warmup"] + args["repeats"]):
                            dist.barrier(group=group)
                            if cuda:
                                torch.cuda.synchronize()
                            a = clock()
                            for _ in range(iters):
                                op()
                            b = clock()
                            t = elapsed(a, b) / iters
                            if i >= args["warmup"]:
                                times.append(t)
                        mine = torch.tensor(times, dtype=torch.float64, device=dev)
                    allt = [torch.empty_like(mine) for _ in range(n)]
                    dist.all_gather(allt, mine, group=group)
                    if rank == 0:
                        per = torch.stack(allt).cpu().numpy()
                        if kernel_timing:
                            slow, fast, training = call_times(per)
                            transfer = training if timing in ("kernel-isolated", RELEASED) else fast
                        else:
                            slow, transfer = per.max(0), per.min(0)
                        results.append(_point(kind, n, count * elem, slow, transfer))
                    del op
                dist.barrier()
            if cuda:
                torch.cuda.empty_cache()
    if rank == 0:
        out = Path(args["out"])
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(results))
        os.replace(tmp, out)
    dist.barrier()
    dist.destroy_process_group()


def _point(kind: str, n: int, nbytes: int, slow: Any, transfer: Any) -> dict[str, Any]:
    """One table row from per-call times: the slowest member's and the transfer, in seconds."""
    slow, transfer = [float(x) for x in slow], [float(x) for x in transfer]
    return {"kind": kind, "group_size": n, "bytes": nbytes, "time_s": statistics.median(slow),
            "transfer_s": statistics.median(transfer),
            "wait_s": statistics.median([s - f for s, f in zip(slow, transfer, strict=True)]),
            "repeats": len(slow), "min_s": min(slow), "max_s": max(slow)}


def _timing_note(timing: str, iters: int, repeats: int, late_us: float = 0.0, late_member: int = -1) -> str:
    """The manifest's words for how the points were timed."""
    if timing == RELEASED:
        return (f"warm-up, then {repeats} collectives under the CUDA profiler after a {HEAD_START_US / 1e3:.0f} ms GPU "
                "sleep (every call queued first), each after a one-element all-reduce that releases the members "
                f"together on the GPU, member {late_member} of the group (-1: the last) sleeping {late_us:g} us on "
                "the GPU before the call, "
                "timed by its NCCL kernels; time_s = median over calls of the longest member's kernel, transfer_s = "
                "of the training steps' transfer (each member's kernel end less the last member's start, averaged "
                "over the members), wait_s = of their difference")
    if timing == "kernel-isolated":
        return (f"warm-up, barrier, then {repeats} collectives under the CUDA profiler, each alone on an idle GPU (device "
                "sync, then one call; no barrier), timed by its NCCL kernels; time_s = median over calls of "
                "the longest member's kernel, transfer_s = of the training steps' transfer (each member's kernel end "
                "less the last member's start, averaged over the members), wait_s = of their difference")
    if timing == "kernel":
        return (f"warm-up, barrier, then {repeats} back-to-back collectives under the CUDA profiler, each timed by its "
                "NCCL kernel; time_s = median over calls of the longest member's kernel, transfer_s = of the shortest, "
                "wait_s = of their difference")
    window = (f"CUDA events around {iters} back-to-back collectives, divided by {iters}" if iters > 1
              else "CUDA events around one collective")
    return (f"per repetition: barrier, then {window}; time_s = median over repetitions of the slowest member, "
            "transfer_s = of the fastest, wait_s = of their difference")


def measure_collectives(
    out: str | Path, gpus: int, device: str = "cuda", sizes: list[int] | None = None,
    kinds: list[str] | None = None, group_sizes: tuple[int, ...] = (2, 4, 8), warmup: int = 5,
    repeats: int = 20, master_port: int = 29700, timeout_s: float = 1200.0, overwrite: bool = False,
    iters: int = 1, timing: str = "events", late_us: float = 0.0, late_member: int = -1,
) -> Path:
    kinds = list(kinds or KINDS)
    if timing not in TIMINGS:
        raise CalibError(f"collective timing is one of {', '.join(TIMINGS)}, not {timing!r}")
    if timing != "events" and device != "cuda":
        raise CalibError("kernel timing reads NCCL kernels from the CUDA profiler: it needs --device cuda")
    if (late_us and timing != RELEASED) or not 0 <= late_us <= 1e6:
        raise CalibError(f"--late-us (0-1e6 us) sets a member's delay of --timing {RELEASED}, got {late_us:g} "
                         f"with --timing {timing}")
    if late_member != -1 and (timing != RELEASED or not 0 <= late_member < min(group_sizes, default=2)):
        raise CalibError(f"--late-member picks which member of every group is late in --timing {RELEASED}: -1 (the "
                         f"last) or 0-{min(group_sizes, default=2) - 1}, got {late_member} with --timing {timing}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise CalibError(f"unknown collective(s) {', '.join(bad)}; known: {', '.join(KINDS)}")
    unsupported = []
    if device == "cpu":
        unsupported = [{"option": k, "why": "gloo has no such tensor collective"} for k in kinds if k not in GLOO_KINDS]
        kinds = [k for k in kinds if k in GLOO_KINDS]
    else:
        have = visible_gpus()
        if gpus > len(have):
            raise CalibError(f"asked for {gpus} GPUs, {len(have)} visible")
    if gpus < 2:
        raise CalibError("collectives need at least 2 ranks")
    if iters < 1 or repeats < 1 or warmup < 0:
        raise CalibError(f"collectives need iters >= 1, repeats >= 1 and warmup >= 0, got {iters}, {repeats}, {warmup}")
    sizes = sizes or default_sizes()
    gs = tuple(n for n in group_sizes if n <= gpus)
    manifest = Manifest(kind="collectives", host=host_name(), unsupported=unsupported)
    manifest.notes.update({
        "sizes_bytes": sizes, "group_sizes": list(gs), "warmup": warmup, "repeats": repeats, "iters": iters,
        "dtype": "bfloat16" if device == "cuda" else "float32", "groups": "first n ranks of the host",
        "conventions": "nccl-tests: all_gather sized by total output, reduce_scatter by total input; GB/s = 1e9 B/s",
        "timing": _timing_note(timing, iters, repeats, late_us, late_member),
        "timing_method": timing if timing != "events" else ("events-loop" if iters > 1 else "events-one-call"),
        **({"late_us": late_us, "late_member": late_member} if timing == RELEASED else {}),
    })
    writer = open_writer(out, manifest, overwrite)
    work = writer.dir("work")
    result = work / "result.json"
    args = {"device": device, "sizes": sizes, "kinds": kinds, "group_sizes": list(gs), "warmup": warmup,
            "repeats": repeats, "iters": iters, "timing": timing, "late_us": late_us, "late_member": late_member,
            "out": str(result)}
    (work / "args.json").write_text(json.dumps(args))
    env = child_env({"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={master_port}", "-m", "measure.collectives",
            str(work / "args.json")]
    rc, wall = run_process(argv, env, work / "log.txt", timeout_s)
    manifest.notes["wall_s"] = round(wall, 2)
    _fill_host_facts(manifest, gpus, device)
    failure = ""
    if rc is None:
        failure = f"timed out after {timeout_s:.0f} s"
    elif rc != 0 or not result.is_file():
        failure = f"torchrun exited with status {rc}: {last_error_line(work / 'log.txt')}"
    else:
        rows = json.loads(result.read_text())
        df = pd.DataFrame(rows)
        bw = [bandwidths_gbps(k, n, b, t) for k, n, b, t in zip(df["kind"], df["group_size"], df["bytes"], df["time_s"], strict=True)]
        df["algbw_gbps"] = [a for a, _ in bw]
        df["busbw_gbps"] = [b for _, b in bw]
        df = df[COLLECTIVE_COLUMNS + [c for c in df.columns if c not in COLLECTIVE_COLUMNS]]
        writer.write_table("collectives", df)
    if failure:
        log = work / "log.txt"
        if log.is_file():
            (writer.tmp / "log_tail.txt").write_text("\n".join(log.read_text(errors="replace").splitlines()[-80:]) + "\n")
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return writer.fail(failure) if failure else writer.finish()


def _fill_host_facts(manifest: Manifest, count: int, device: str) -> None:
    from measure.env import software_versions

    sw = software_versions()
    manifest.software = Software(**{k: v for k, v in sw.items() if k in Software.__dataclass_fields__})
    if device == "cpu":
        manifest.gpu = GpuInfo(name="cpu", count=count, vendor="cpu")
        return
    try:
        from measure.telemetry import open_backend

        b = open_backend("auto", visible_gpus()[:1])
        info = b.info(b.gpus[0])  # type: ignore[attr-defined]
        b.close()
        manifest.gpu = GpuInfo(count=count, **info)
    except CalibError as exc:
        manifest.notes["gpu_info"] = f"unavailable: {exc}"


if __name__ == "__main__":
    from measure.env import apply_safe_env

    apply_safe_env()
    _bench(json.loads(Path(sys.argv[1]).read_text()))
