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
from measure.probes.host_phases import Probe
from measure.probes.ranks import build_rank
from measure.telemetry.host_pace import PACE_ITERATIONS, sample_forever
from measure.telemetry.host_pace import python_work_us as python_pace_us

PACE_SAMPLE = PACE_ITERATIONS  # iterations of python_pace_us after each step (about 1 ms)
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


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


def launch_pace_us(n: int = 400) -> float:
    """Host microseconds per tiny CUDA op (an in-place add on 1 KiB), launched without waiting; the
    median of three runs, each after the GPU drained."""
    import torch

    x = torch.zeros(256, device="cuda")
    runs = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(n):
            x.add_(1.0)
        runs.append((time.perf_counter_ns() - t) / 1e3 / n)
    torch.cuda.synchronize()
    return statistics.median(runs)


def run_one(probe: Probe, blocks: list[str], steps: int, warmup: int) -> dict[str, Any]:
    import torch

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
        for _ in range(steps):
            torch.cuda.synchronize()
            t = time.perf_counter_ns()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter_ns() - t) / 1e9)
            starts.append(t)
            # ~1 ms of fixed work after each step, outside its timing: the host's pace step by step.
            paces.append(python_pace_us(PACE_SAMPLE, tries=1))
        cs1, st1 = context_switches(), cpu_times()
        out.append({
            "policy": policy, "cpus": sorted(every) if policy == "free" else list(pair), "step_s": times,
            "python_pace_us": py, "launch_pace_us": launch, "pace_after_step_us": paces, "step_start_ns": starts,
            "ctx_switches": {k: cs1[k] - cs0[k] for k in cs0}, "cpu_ticks": {k: st1[k] - st0[k] for k in st0},
        })
    place("free", every, pair)
    return {"name": probe.name, "model": probe.model, "par": probe.par().to_dict(),
            "microbatches": training.info["microbatches"], "gpu": torch.cuda.get_device_name(0),
            "host_cpu": host_cpu(), "local_cpus": local, "blocks": out}


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
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--pace-log", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.pace_log:
        sample_forever(Path(args.pace_log), args.sidecar_gap, PACE_SAMPLE)
    if args.one:
        apply_safe_env()
        probe = next(c for c in CONFIGS if c.name == args.one)
        result = run_one(probe, args.blocks.split(","), args.steps, args.warmup)
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
                   "--blocks", blocks, "--steps", str(args.steps), "--warmup", str(args.warmup)]
            env = child_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                             "LOCAL_RANK": "0"})
            pace_log = out / f"{probe.name}.{trial}.pace"
            with_side = args.sidecar and trial % args.sidecar_every == args.sidecar_every - 1
            side = subprocess.Popen([sys.executable, "-m", "measure.probes.host_pace", "--out", str(out),
                                     "--pace-log", str(pace_log), "--sidecar-gap", str(args.sidecar_gap)]) \
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
                    result["sidecar"] = [[int(a), float(b)] for a, b in
                                         (line.split() for line in pace_log.read_text().splitlines() if " " in line)]
                results.append(result)
            pace_log.unlink(missing_ok=True)
            print(f"{probe.name} trial {trial}: rc {rc} in {time.monotonic() - start:.0f} s", flush=True)
            # Written after every process: a call cut short keeps the trials it finished.
            (out / "host-pace.json").write_text(json.dumps({"results": results, "host_cpu": host_cpu()}))
    print(summary(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
