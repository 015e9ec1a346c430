"""What a blocking tensor-parallel all-reduce costs the GPU in plain (unprofiled) training steps.

    PYTHONPATH=.:/tmp/site python3 -m measure.probes.tp_rendezvous --out /tmp/tpr [--only NAME,...]

The steady tensor-parallel runs are predicted 2-3 % short, about 60 us per blocking all-reduce of the TP
group (docs/validate.md, thirty-fourth session; benchmarks/tp_rendezvous.py), and the profiled step's
NCCL kernels take only their transfer time. This probe times each such all-reduce from the compute
stream's side in plain steps: a CUDA event recorded on the current stream just before megatron-core's
`torch.distributed.all_reduce` call and one just after it, so that the time between them is what the
compute stream waited (the peer's arrival, NCCL's stream handshakes and the transfer). Asynchronous calls
(`async_op=True`, the backward's overlapped input-gradient reduction) are not timed: their wait falls
elsewhere. Per rank it keeps the plain steps' times, the steps' times with the events, and every timed
call's size and microseconds. With the events it also keeps each event step's start and each timed call's
host time from that start (`time.perf_counter_ns`, CLOCK_MONOTONIC: one clock for all ranks of a host), so
that the ranks' hosts can be lined up: which one reaches each call later, and whether it started later
or fell behind on the way.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from measure.env import host_cpu
from measure.probes.host_phases import Probe
from measure.probes.ranks import build_rank, probe_main

# The second run added the same Llama-3 8B at 2 and 16 micro-batches (a cost once per step against one per
# call) and at sequence 256 (a step whose GPU the host starves throughout, as the committed s256 runs').
CONFIGS: list[Probe] = [
    Probe("llama8b-tp2", "llama3-8b@L4,S2048", 1, 8, tp=2),
    Probe("gpt13b-tp2", "gpt3-13b@L4", 1, 8, tp=2),
    Probe("llama8b-tp2-m2", "llama3-8b@L4,S2048", 1, 2, tp=2),
    Probe("llama8b-tp2-m16", "llama3-8b@L4,S2048", 1, 16, tp=2),
    Probe("llama8b-tp2-s256", "llama3-8b@L4,S256", 1, 8, tp=2),
]


def run_one(probe: Probe, warmup: int, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    training = build_rank(probe.model, probe.par())
    step = training.parts.step
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()

    starts: list[int] = []

    def timed(n: int) -> list[float]:
        out = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter_ns()
            starts.append(t)
            step()
            torch.cuda.synchronize()
            out.append((time.perf_counter_ns() - t) / 1e9)
        return out

    plain = timed(steps)
    calls: list[tuple[int, Any, Any, int]] = []
    original = dist.all_reduce

    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op") or (len(args) >= 3 and args[2]):
            return original(tensor, *args, **kwargs)
        host = time.perf_counter_ns()
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        out = original(tensor, *args, **kwargs)
        after.record()
        calls.append((tensor.numel() * tensor.element_size(), before, after, host))
        return out

    dist.all_reduce = all_reduce  # megatron-core looks it up as torch.distributed.all_reduce at each call
    try:
        per_step: list[list[list[float]]] = []
        host_ns: list[list[int]] = []
        with_events = []
        starts.clear()
        for _ in range(steps):
            calls.clear()
            with_events += timed(1)
            per_step.append([[float(b), 1e3 * s.elapsed_time(e)] for b, s, e, _ in calls])
            host_ns.append([h - starts[-1] for *_, h in calls])
    finally:
        dist.all_reduce = original
    return {"name": probe.name, "model": probe.model, "par": probe.par().to_dict(), "rank": rank,
            "microbatches": training.info["microbatches"], "gpu": torch.cuda.get_device_name(local),
            "host_cpu": host_cpu(), "plain_step_s": plain, "events_step_s": with_events,
            "calls_bytes_us": per_step, "step_start_ns": starts, "calls_host_ns": host_ns}


def main(argv: list[str] | None = None) -> int:
    return probe_main("measure.probes.tp_rendezvous", __doc__.splitlines()[0], CONFIGS,
                      lambda probe, args: run_one(probe, args.warmup, args.steps),
                      lambda probe, result: f"{probe.name}.rank{result['rank']}.json", 29571, argv)


if __name__ == "__main__":
    sys.exit(main())
