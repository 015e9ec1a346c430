"""Why a host-paced step moves between runs: CPU placement, preemption, and the host's own pace.

    PYTHONPATH=.:/tmp/site python3 -m measure.probes.host_pace --out /tmp/pace [--trials 6] [--only NAME,...]

A configuration whose GPU waits for the host measured twice differs by up to 62 % (docs/host.md, "The
host-bound runs measured again"; `calib validate`'s repeated configurations), between two calls on one
lease as much as between leases. This probe runs such configurations (one GPU, megatron-core as
`calib measure` builds it) in fresh processes, each in blocks of plain steps under two CPU placements:
- `free`: every thread of the process may run on every CPU (how `calib measure` runs);
- `pin2`: every thread on two CPUs of the GPU's NUMA node (the main thread, which launches the
  forward, on one, the autograd engine's and the other threads on the other).
Around each block it records what could move the host's pace: the process's involuntary context
switches (another task took its CPU), the machine's steal and busy time from /proc/stat (the VM's
neighbours), and two host benchmarks of fixed work run in the same process just before the block: a
pure-Python loop and a run of tiny CUDA ops launched without waiting. If the step follows the
benchmarks, a measurement can carry its host's pace; if it follows placement, `calib measure` should
pin. Blocks alternate placements so that drift within a process does not pose as either. With
`--sidecar`, a second process samples the same work all along on whichever CPU it gets: if it sees the
trainer's slow spells, a measurement could record its host's pace beside its steps without touching them.
With `--threads`, every step also records, outside its timing, what each thread of the trainer did during it
(/proc/self/task/*/schedstat: time on a CPU, time waiting for one, and the CPU it ran on), each CPU's busy and
stolen ticks, and the launch pace (tiny CUDA ops) beside the Python work after it; the sidecar notes its CPU
per sample, with two more kinds of work whose data does not fit a core's caches (a walk over a large Python
heap, a gather over 256 MiB); the trainer's main and autograd threads' hardware counters (cycles, instructions,
cache misses: perf_event_open, where the VM has a PMU) and its time in the garbage collector are kept per
step. On the H200 the sidecar does not follow the steps (docs/host.md, thirty-sixth session): a slow step
that the trainer's main thread spent on a CPU is a slower CPU under it, one it spent waiting is a queue, and a
slow launch pace with a steady Python pace is the launch path (driver, PCIe), not the interpreter. What it
found: docs/host.md, "The trainer's threads, step by step" (benchmarks/host_threads.py reads its results).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from measure.env import apply_safe_env, child_env, host_cpu
from measure.own_pace import LAUNCH_FLOATS, launch_s
from measure.probes.host_phases import Probe
from measure.probes.ranks import build_rank
from measure.proctree import stat_fields
from measure.telemetry.host_pace import PACE_ITERATIONS, sample_forever
from measure.telemetry.host_pace import python_work_us as python_pace_us

PACE_SAMPLE = PACE_ITERATIONS  # iterations of python_pace_us after each step (about 1 ms)
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
STAT_CPU = 36  # in a task's stat_fields (from the 3rd field on): the 39th field, the CPU it last ran on


# The three one-GPU configurations whose committed repeats spread most (gpt1.3b-1gpu-s256: 3 runs,
# 126.6-205.2 ms; llama8b-1gpu-s256; mixtral-1gpu-s256).
CONFIGS: list[Probe] = [
    Probe("gpt1.3b-s256", "gpt3-1.3b@L8,S256", 4, 16),
    Probe("llama8b-s256", "llama3-8b@L4,S256", 2, 8),
    Probe("mixtral-s256", "mixtral-8x7b@L2,S256", 2, 4),
]


def cpu_times() -> dict[str, int]:
    """The machine's CPU time so far, in clock ticks, by /proc/stat's first line."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:1 + len(STAT_FIELDS)]]
    return dict(zip(STAT_FIELDS, values, strict=False))


def context_switches() -> dict[str, int]:
    """This process's context switches, all its threads together (/proc/self/task/*/status)."""
    out = {"voluntary": 0, "involuntary": 0}
    for task in Path("/proc/self/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                out["voluntary"] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out["involuntary"] += int(line.split()[1])
    return out


def thread_stats() -> dict[int, tuple[int, int, int, int]]:
    """Each thread of this process: (ns on a CPU, ns waiting for one, timeslices, the CPU it last ran
    on), from /proc/self/task/TID/schedstat and stat."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            run, wait, slices = (int(v) for v in (task / "schedstat").read_text().split()[:3])
            cpu = int(stat_fields((task / "stat").read_text())[STAT_CPU])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
        out[int(task.name)] = (run, wait, slices, cpu)
    return out


def thread_names() -> dict[int, str]:
    """Each thread's name (comm): torch names its autograd engine's threads pt_autograd_N."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            out[int(task.name)] = (task / "comm").read_text().strip()
    return out


def per_cpu_ticks() -> list[tuple[int, int]]:
    """Each CPU's (busy, steal) clock ticks so far, by /proc/stat's cpuN lines."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                if out:
                    break
                continue
            v = dict(zip(STAT_FIELDS, (int(x) for x in line.split()[1:1 + len(STAT_FIELDS)]), strict=False))
            out.append((v["user"] + v["nice"] + v["system"] + v["irq"] + v["softirq"], v["steal"]))
    return out


def step_threads(before: dict[int, tuple[int, int, int, int]], after: dict[int, tuple[int, int, int, int]]
                 ) -> list[list[int]]:
    """[tid, ns on a CPU, ns waiting, timeslices, CPU at the end] of every thread that ran or waited
    between two thread_stats()."""
    rows = []
    for tid, (run, wait, slices, cpu) in after.items():
        r0, w0, s0, _ = before.get(tid, (0, 0, 0, cpu))
        if run > r0 or wait > w0:
            rows.append([tid, run - r0, wait - w0, slices - s0, cpu])
    return rows


def cpu_topology() -> dict[int, dict[str, Any]]:
    """Each CPU this process may use: its core, package and SMT siblings as the guest sees them."""
    out: dict[int, dict[str, Any]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        top = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        entry: dict[str, Any] = {}
        for name in ("core_id", "physical_package_id", "thread_siblings_list"):
            with contextlib.suppress(OSError):
                entry[name] = (top / name).read_text().strip()
        out[cpu] = entry
    return out


def this_cpu() -> int:
    """The CPU this thread runs on now (/proc/thread-self/stat's 39th field)."""
    return int(stat_fields(Path("/proc/thread-self/stat").read_text())[STAT_CPU])


HEAP_OBJECTS = 400_000  # the sidecar's large heap: ~110 MB of small objects, far past one core's 2 MiB L2
HEAP_TOUCH = 4_000  # objects visited per heap sample, in a fixed shuffled order: about 1-2 ms
GATHER_WORDS = 1 << 25  # 256 MiB of int64 for the gather sample, near the whole L3 (300 MiB on the lent hosts)
GATHER_READS = 1 << 17  # random reads per gather sample: about 1-2 ms


def sample_with_cpu(log: Path, gap_s: float, iterations: int) -> None:
    """The telemetry sampler's samples with the CPU each ran on, and two more kinds of fixed work whose
    data does not fit a core's caches: `ns us cpu heap_us gather_us` per line, until killed. The small
    loop lives in L1; the trainer's launch path walks a large heap (modules, dispatcher, driver), so a
    slowdown of the memory system would reach it and not the loop."""
    import random

    import numpy as np

    class Box:
        __slots__ = ("v", "d")

        def __init__(self, v: int) -> None:
            self.v = v
            self.d = {"k": v}

    rng = random.Random(0)
    heap = [Box(i) for i in range(HEAP_OBJECTS)]
    rng.shuffle(heap)  # allocation order is address order: shuffled, neighbours in the list are far apart
    walk = heap[:HEAP_TOUCH]
    words = np.arange(GATHER_WORDS, dtype=np.int64)
    reads = np.random.default_rng(0).integers(0, GATHER_WORDS, GATHER_READS)
    parent = os.getppid()
    with open(log, "w") as f:
        while os.getppid() == parent:
            t = time.perf_counter_ns()
            us = python_pace_us(iterations, tries=1)
            cpu = this_cpu()
            h = time.perf_counter_ns()
            acc = 0
            for box in walk:
                acc += box.v + box.d["k"]
            g = time.perf_counter_ns()
            acc += int(words[reads].sum())
            e = time.perf_counter_ns()
            f.write(f"{t} {us:.1f} {cpu} {(g - h) / 1e3:.1f} {(e - g) / 1e3:.1f}\n")
            f.flush()
            time.sleep(gap_s)


def read_sidecar(text: str, threads: bool) -> dict[str, list]:
    """The sidecar's log as the result's lists: `sidecar` ([ns, us] per sample) and, with --threads, each
    sample's CPU and heap and gather work. The last piece, where the kill cut a line short, is dropped (the
    sampler ends every line it finishes), as is a line with another count of fields."""
    lines = [line.split() for line in text.split("\n")[:-1]]
    lines = [p for p in lines if len(p) == (5 if threads else 2)]
    out: dict[str, list] = {"sidecar": [[int(p[0]), float(p[1])] for p in lines]}
    if threads:
        out["sidecar_cpu"] = [int(p[2]) for p in lines]
        out["sidecar_heap_us"] = [float(p[3]) for p in lines]
        out["sidecar_gather_us"] = [float(p[4]) for p in lines]
    return out


# perf_event_open(2): struct perf_event_attr as of PERF_ATTR_SIZE_VER0 (64 bytes), hardware events
PERF_EVENTS = {"cycles": 0, "instructions": 1, "cache_misses": 3}
SYS_PERF_EVENT_OPEN = 298  # x86_64


class ThreadCounters:
    """Hardware counters of given threads (cycles, instructions, last-level cache misses), user and
    kernel, where the VM exposes a PMU; `error` says why not otherwise. Cycles over a step's CPU time is
    the clock the thread ran at; instructions per cycle falls when the memory system is slow."""

    def __init__(self, tids: list[int]) -> None:
        import ctypes

        self.fds: dict[int, dict[str, int]] = {}
        self.error = ""
        libc = ctypes.CDLL(None, use_errno=True)
        for tid in tids:
            for name, config in PERF_EVENTS.items():
                attr = (ctypes.c_uint8 * 64)()
                ctypes.memmove(attr, (ctypes.c_uint32 * 2)(0, 64), 8)  # type PERF_TYPE_HARDWARE, size
                ctypes.memmove(ctypes.byref(attr, 8), (ctypes.c_uint64 * 1)(config), 8)
                fd = libc.syscall(SYS_PERF_EVENT_OPEN, attr, tid, -1, -1, 0)
                if fd < 0:
                    self.error = f"perf_event_open {name} for thread {tid}: {os.strerror(ctypes.get_errno())}"
                    self.close()
                    return
                self.fds.setdefault(tid, {})[name] = fd

    def read(self) -> dict[int, dict[str, int]]:
        return {tid: {name: int.from_bytes(os.pread(fd, 8, 0), "little") for name, fd in fds.items()}
                for tid, fds in self.fds.items()}

    def close(self) -> None:
        for fds in self.fds.values():
            for fd in fds.values():
                os.close(fd)
        self.fds = {}


def gpu_cpus(index: int) -> list[int]:
    """The CPUs local to the GPU (its PCI device's local_cpulist), else every CPU this process may use."""
    try:
        import pynvml

        pynvml.nvmlInit()
        bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        text = Path(f"/sys/bus/pci/devices/{bus.lower()[-12:]}/local_cpulist").read_text().strip()
        cpus: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        return sorted(set(cpus) & os.sched_getaffinity(0)) or sorted(os.sched_getaffinity(0))
    except Exception:  # noqa: BLE001 - no NVML or sysfs entry: all CPUs are equally near
        return sorted(os.sched_getaffinity(0))


def place(policy: str, every: set[int], pair: tuple[int, int]) -> None:
    """Set every thread's CPUs for `policy` (the main thread is the process's own id)."""
    main = os.getpid()
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        cpus = every if policy == "free" else {pair[0]} if tid == main else {pair[1]}
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def launch_pace_us(n: int = 400, tries: int = 3) -> float:
    """Host microseconds per tiny CUDA op (measure.own_pace.launch_s, the timing `calib measure` keeps after
    every step), launched without waiting; the median of `tries` runs, each after the GPU drained."""
    import torch

    x = torch.zeros(LAUNCH_FLOATS, device="cuda")
    return statistics.median(launch_s(x, n) * 1e6 for _ in range(tries))


class _GcClock:
    """Nanoseconds this process has spent in the garbage collector (gc.callbacks), all threads."""

    def __init__(self) -> None:
        self.ns = 0
        self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._start


GC = _GcClock()


def run_one(probe: Probe, blocks: list[str], steps: int, warmup: int, threads: bool = False) -> dict[str, Any]:
    import gc

    import torch

    if threads:
        gc.callbacks.append(GC)

    training = build_rank(probe.model, probe.par())
    step = training.parts.step
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    every = set(os.sched_getaffinity(0))
    local = gpu_cpus(0)
    pair = (local[-2], local[-1]) if len(local) >= 2 else (local[0], local[0])
    out = []
    for policy in blocks:
        place(policy, every, pair)
        step()  # one step under the new placement before timing: threads move at their next wake-up
        torch.cuda.synchronize()
        py, launch = python_pace_us(), launch_pace_us()
        cs0, st0 = context_switches(), cpu_times()
        times, paces, starts = [], [], []
        per_thread: list[list[list[int]]] = []
        per_cpu: list[list[tuple[int, int]]] = []
        launches: list[float] = []
        names = thread_names() if threads else {}
        counters = ThreadCounters([tid for tid, n in names.items() if tid == os.getpid() or n.startswith("pt_autograd")]
                                  ) if threads else None
        per_counter: list[dict[str, dict[str, int]]] = []
        gc_ns: list[int] = []
        for _ in range(steps):
            torch.cuda.synchronize()
            if threads:
                th0, cpu0 = thread_stats(), per_cpu_ticks()
                k0, gc0 = counters.read(), GC.ns
            t = time.perf_counter_ns()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter_ns() - t) / 1e9)
            starts.append(t)
            if threads:
                k1, gc_ns_step = counters.read(), GC.ns - gc0
                th1, cpu1 = thread_stats(), per_cpu_ticks()
                per_thread.append(step_threads(th0, th1))
                per_cpu.append([(b1 - b0, s1 - s0) for (b0, s0), (b1, s1) in zip(cpu0, cpu1, strict=True)])
                per_counter.append({str(tid): {n: k1[tid][n] - k0[tid][n] for n in k1[tid]} for tid in k1})
                gc_ns.append(gc_ns_step)
            # ~1 ms of fixed work after each step, outside its timing: the host's pace step by step.
            paces.append(python_pace_us(PACE_SAMPLE, tries=1))
            if threads:
                launches.append(launch_pace_us(200, tries=1))
        cs1, st1 = context_switches(), cpu_times()
        block: dict[str, Any] = {
            "policy": policy, "cpus": sorted(every) if policy == "free" else list(pair), "step_s": times,
            "python_pace_us": py, "launch_pace_us": launch, "pace_after_step_us": paces, "step_start_ns": starts,
            "ctx_switches": {k: cs1[k] - cs0[k] for k in cs0}, "cpu_ticks": {k: st1[k] - st0[k] for k in st0},
        }
        if threads:
            names.update(thread_names())
            block.update({"main_tid": os.getpid(), "thread_names": {str(k): v for k, v in names.items()},
                          "step_threads": per_thread, "step_cpu_ticks": per_cpu, "launch_after_step_us": launches,
                          "step_counters": per_counter, "counters_error": counters.error, "step_gc_ns": gc_ns})
            counters.close()
        out.append(block)
    place("free", every, pair)
    return {"name": probe.name, "model": probe.model, "par": probe.par().to_dict(),
            "microbatches": training.info["microbatches"], "gpu": torch.cuda.get_device_name(0),
            "host_cpu": host_cpu(), "local_cpus": local, "blocks": out,
            **({"topology": {str(k): v for k, v in cpu_topology().items()}} if threads else {})}


def summary(results: list[dict]) -> str:
    lines = [f"{'config':14s} {'trial':>5s} {'policy':6s} {'step ms':>8s} {'p10-p90':>8s} {'py us':>7s} "
             f"{'launch us':>9s} {'invol':>6s} {'steal%':>6s} {'busy%':>6s}"]
    for r in results:
        for b in r["blocks"]:
            ts = sorted(b["step_s"])
            med = statistics.median(ts)
            p10, p90 = ts[len(ts) // 10], ts[(9 * len(ts)) // 10]
            ticks = b["cpu_ticks"]
            total = sum(ticks.values()) or 1
            busy = total - ticks["idle"] - ticks["iowait"]
            lines.append(f"{r['name']:14s} {r['trial']:5d} {b['policy']:6s} {med * 1e3:8.1f} "
                         f"{(p90 - p10) / med * 100:7.1f}% {b['python_pace_us']:7.0f} {b['launch_pace_us']:9.2f} "
                         f"{b['ctx_switches']['involuntary']:6d} {ticks['steal'] / total * 100:6.2f} "
                         f"{busy / total * 100:6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--trials", type=int, default=4, help="fresh processes per configuration")
    ap.add_argument("--blocks", default="free,pin2,free,pin2", help="placements of a trial's blocks, in order "
                    "(odd trials reverse them)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per process")
    ap.add_argument("--sidecar", action="store_true", help="sample the pace from a second process meanwhile")
    ap.add_argument("--sidecar-every", type=int, default=1, help="with --sidecar: in every Nth trial only (the "
                    "others run without it, on the same machine, for its cost)")
    ap.add_argument("--sidecar-gap", type=float, default=0.004, help="seconds the second process waits between samples")
    ap.add_argument("--threads", action="store_true", help="per step: each thread's CPU time and waits, each "
                    "CPU's ticks, and the launch pace after it; the sidecar's CPU per sample")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--pace-log", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.pace_log:
        if args.threads:
            sample_with_cpu(Path(args.pace_log), args.sidecar_gap, PACE_SAMPLE)
        else:
            sample_forever(Path(args.pace_log), args.sidecar_gap, PACE_SAMPLE)
    if args.one:
        apply_safe_env()
        probe = next(c for c in CONFIGS if c.name == args.one)
        result = run_one(probe, args.blocks.split(","), args.steps, args.warmup, args.threads)
        (out / f"{args.one}.one.json").write_text(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)
    wanted = [c for c in CONFIGS if not args.only or c.name in args.only.split(",")]
    results = []
    port = 29611
    # Trials interleave configurations so that a slow spell of the machine falls on all of them.
    for trial in range(args.trials):
        order = args.blocks.split(",")
        blocks = ",".join(order if trial % 2 == 0 else order[::-1])
        for probe in wanted:
            port += 1
            start = time.monotonic()
            cmd = [sys.executable, "-m", "measure.probes.host_pace", "--out", str(out), "--one", probe.name,
                   "--blocks", blocks, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   *(["--threads"] if args.threads else [])]
            env = child_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                             "LOCAL_RANK": "0"})
            pace_log = out / f"{probe.name}.{trial}.pace"
            with_side = args.sidecar and trial % args.sidecar_every == args.sidecar_every - 1
            side = subprocess.Popen([sys.executable, "-m", "measure.probes.host_pace", "--out", str(out),
                                     "--pace-log", str(pace_log), "--sidecar-gap", str(args.sidecar_gap),
                                     *(["--threads"] if args.threads else [])]) \
                if with_side else None
            with open(out / f"{probe.name}.{trial}.log", "w") as log:
                try:
                    rc: object = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            if side is not None:
                side.kill()
                side.wait()
            one = out / f"{probe.name}.one.json"
            if one.exists():
                result = json.loads(one.read_text())
                one.unlink()
                result["trial"] = trial
                if side is not None:
                    result["sidecar_gap_s"] = args.sidecar_gap
                    result.update(read_sidecar(pace_log.read_text(), args.threads))
                results.append(result)
            pace_log.unlink(missing_ok=True)
            print(f"{probe.name} trial {trial}: rc {rc} in {time.monotonic() - start:.0f} s", flush=True)
            # Written after every process: a call cut short keeps the trials it finished.
            (out / "host-pace.json").write_text(json.dumps({"results": results, "host_cpu": host_cpu()}))
    print(summary(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
