"""Does an all-to-all whose members arrive apart finish sooner after the last one arrives?

    torchrun --nproc-per-node 4 -m measure.probes.a2a_stagger --out DIR

The committed Mixtral EP 4 steps' 4-GPU all-to-alls whose members arrived within 5 us of each other took 113 us at
32.6 MiB and 193 us at 66 MiB by the training steps' split (each member's kernel end less the last member's start,
calib.convert.run.transfer_split), those whose members arrived over 0.5 ms apart 89 and 165 us (traces/README.md,
round 43). NCCL runs an all-to-all as grouped sends and receives: members that are already in the kernel can
exchange their own parts before the last one arrives, which the split does not see. This probe sets the arrival
on the GPU: per call, a one-element all-reduce lets the members leave together, then each sleeps on the GPU
(`torch.cuda._sleep`, cycles from a timed sleep) for its delay, then `all_to_all_single` runs:

- `one_late`: the group's last member `delay` after the others;
- `ramp`: member i at i / (n - 1) x `delay`.

Per group size (2: ranks 0-1; 4: all), size, pattern and delay it keeps every call's all-to-all kernel start and
duration on every member (Kineto's base and start times: one clock for the host's ranks; the all-reduces left
out: measure.collectives.released_calls), in DIR/a2a_stagger.json; benchmarks/a2a_stagger.py reads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from measure.probes.nccl_probe import finish, probe_main

SIZES_MIB = (8.0, 16.0, 32.0, 64.0)
DELAYS_US = (0.0, 20.0, 50.0, 100.0, 200.0, 500.0, 2000.0)
PATTERNS = ("one_late", "ramp")
WARMUP = 3
REPEATS = 16


def delay_of(pattern: str, rank: int, n: int, delay_us: float) -> float:
    """This member's delay (us) after the members leave the all-reduce together."""
    if pattern == "one_late":
        return delay_us if rank == n - 1 else 0.0
    if pattern == "ramp":
        return delay_us * rank / (n - 1)
    raise ValueError(f"unknown pattern {pattern!r} (known: {', '.join(PATTERNS)})")


def _time(torch: Any, dist: Any, n: int, mib: float, pattern: str, delay_us: float, group: Any,
          per_us: float) -> list[tuple[float, float, float]]:
    """This member's (trace base us, start us, duration us) of REPEATS all-to-alls of `mib` MiB."""
    from measure.collectives import released_calls

    rank, dev = dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    count = int(mib * 2**20) // 2 // n * n
    inp = torch.randn(count, dtype=torch.bfloat16, device=dev)
    outp = torch.empty(count, dtype=torch.bfloat16, device=dev)
    late_cycles = int(delay_of(pattern, rank, n, delay_us) * per_us)
    return released_calls(torch, lambda: dist.all_to_all_single(outp, inp, group=group), WARMUP, REPEATS, dist, group,
                          late_cycles, per_us)


def run(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from measure.collectives import cycles_per_us

    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, dev = dist.get_rank(), torch.device("cuda", local)
    per_us = cycles_per_us(torch)
    sizes = [n for n in (2, 4) if n <= world]
    groups = {n: dist.new_group(list(range(n))) for n in sizes}
    results: list[dict[str, Any]] = []
    for n in sizes:
        patterns = PATTERNS if n > 2 else PATTERNS[:1]  # two members: both patterns are one late member
        for mib in SIZES_MIB if rank < n else ():
            for pattern in patterns:
                for delay in DELAYS_US:
                    mine = torch.tensor(_time(torch, dist, n, mib, pattern, delay, groups[n], per_us),
                                        dtype=torch.float64, device=dev)
                    every = [torch.empty_like(mine) for _ in range(n)]
                    dist.all_gather(every, mine, group=groups[n])
                    if rank == 0:
                        results.append({"group_size": n, "mib": mib, "bytes": int(mib * 2**20) // 2 // n * n * 2,
                                        "pattern": pattern, "delay_us": delay,
                                        "calls": [t.cpu().tolist() for t in every]})
        dist.barrier()
        torch.cuda.empty_cache()
    finish(out_dir, "a2a_stagger", torch, dist, dev, warmup=WARMUP, repeats=REPEATS, sleep_cycles_per_us=per_us,
             results=results)


def main(argv: list[str] | None = None) -> int:
    return probe_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
