"""Why an MoE step's all-to-all and the isolated one take different times at one size.

    torchrun --nproc-per-node 4 -m measure.probes.a2a_context --out DIR

The 4-GPU all-to-alls of the committed Mixtral EP 4 steps (32.8-77.3 MiB) took 85-174 us, the collectives
harness's 101-107 us at 32 MiB and 177-181 us at 64 MiB on three leases (traces/README.md, round 41); the 2-GPU
ones of 8.4-9.5 MiB took 26-28 us in training against 22-28 us alone (round 40). The harness times `repeats`
back-to-back calls after a barrier, each by its own NCCL kernel and the fastest member's (measure/collectives.py);
a training call's transfer is its kernel's end less the last member's start, averaged over the members
(calib.convert.run). This probe times `all_to_all_single` in the contexts that separate the explanations:

- `harness`: the harness's loop (warm-up, NCCL barrier, back-to-back calls under the profiler);
- `isolated`: each call alone on an idle GPU, the members released together by a CPU (gloo) barrier;
- `after_write`: as `isolated`, the input written by a copy kernel just before (in L2, as a permute kernel leaves
  an MoE step's tokens);
- `after_gemm`: as `isolated`, a 8192^3 bf16 GEMM just before on every member (the GPU busy and clocked up,
  members arriving as a step's do);
- `uneven`: as `isolated`, with the splits of a routing (each member's row of a token matrix drawn around the
  even split, up to 15 % off), the input size unchanged.

Per group size (2: ranks 0-1; 4: all), size and context it keeps every call's NCCL kernel start and duration on
every member (Kineto's base and start times: one clock for the host's ranks), in DIR/a2a_context.json;
benchmarks/a2a_context.py reads it with both conventions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from measure.probes.nccl_probe import finish, probe_main

SIZES_MIB = (8.0, 9.5, 16.0, 32.0, 64.0)
CONTEXTS = ("harness", "isolated", "after_write", "after_gemm", "uneven")
WARMUP = 5
REPEATS = 20
HIDDEN = 4096  # elements per token row of the uneven splits (Mixtral's hidden size)
UNEVEN = 0.15


def _splits(n: int, rows: int, seed: int) -> list[list[int]]:
    """A token matrix m[src][dst] with every row summing to `rows`, each entry within UNEVEN of rows / n."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = [1.0 + rng.uniform(-UNEVEN, UNEVEN) for _ in range(n)]
        row = [int(rows * x / sum(w)) for x in w]
        row[-1] += rows - sum(row)
        out.append(row)
    return out


def _time_context(torch: Any, dist: Any, ctx: str, n: int, mib: float, group: Any, cpu_group: Any,
                  gemm: tuple[Any, Any]) -> list[tuple[float, float, float]]:
    """This member's (trace base us, start us, duration us) of REPEATS all-to-alls of `mib` MiB in context `ctx`."""
    from measure.collectives import nccl_kernels

    rank, dev = dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    rows = int(mib * 2**20) // (2 * HIDDEN) // n * n
    count = rows * HIDDEN
    inp = torch.randn(count, dtype=torch.bfloat16, device=dev)
    src = torch.randn(count, dtype=torch.bfloat16, device=dev)
    ins: list[int] | None = None
    outs: list[int] | None = None
    if ctx == "uneven":
        m = _splits(n, rows, seed=int(mib * 10))
        ins, outs = [r * HIDDEN for r in m[rank]], [m[j][rank] * HIDDEN for j in range(n)]
    outp = torch.empty(sum(outs) if outs else count, dtype=torch.bfloat16, device=dev)

    def op() -> None:
        dist.all_to_all_single(outp, inp, outs, ins, group=group)

    def before() -> None:
        if ctx == "after_write":
            inp.copy_(src)
        elif ctx == "after_gemm":
            torch.mm(*gemm)

    def back_to_back() -> None:
        for _ in range(REPEATS):
            op()

    def one_by_one() -> None:
        for _ in range(REPEATS):
            torch.cuda.synchronize()
            dist.barrier(group=cpu_group)
            before()
            op()

    for _ in range(WARMUP):
        before()
        op()
    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    kernels = nccl_kernels(torch, back_to_back if ctx == "harness" else one_by_one)
    if len(kernels) != REPEATS:
        raise RuntimeError(f"{ctx}, group of {n}, {mib} MiB: {len(kernels)} NCCL kernels for {REPEATS} calls")
    return kernels


def run(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    local, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, dev = dist.get_rank(), torch.device("cuda", local)
    sizes = [n for n in (2, 4) if n <= world]
    groups = {n: dist.new_group(list(range(n))) for n in sizes}
    cpu = {n: dist.new_group(list(range(n)), backend="gloo") for n in sizes}
    gemm = (torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev),
            torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev))
    results: list[dict[str, Any]] = []
    for n in sizes:
        for mib in SIZES_MIB if rank < n else ():
            for ctx in CONTEXTS:
                mine = torch.tensor(_time_context(torch, dist, ctx, n, mib, groups[n], cpu[n], gemm),
                                    dtype=torch.float64, device=dev)
                every = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(every, mine, group=groups[n])
                if rank == 0:
                    rows = int(mib * 2**20) // (2 * HIDDEN) // n * n
                    results.append({"group_size": n, "mib": mib, "bytes": rows * HIDDEN * 2, "context": ctx,
                                    "calls": [t.cpu().tolist() for t in every]})
        dist.barrier()
        torch.cuda.empty_cache()
    finish(out_dir, "a2a_context", torch, dist, dev, warmup=WARMUP, repeats=REPEATS, results=results)


def main(argv: list[str] | None = None) -> int:
    return probe_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
