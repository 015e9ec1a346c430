"""Is a pipeline stage's send slower because megatron-core batches it with a receive of the other direction?

    torchrun --nproc-per-node 2 -m measure.probes.p2p_batched --out DIR

The H200 training steps' 2-GPU sends whose sender arrived last take about 1.4x the collectives harness's one-way
send at their size (traces/README.md, round 44). megatron-core sends and receives through
`torch.distributed.batch_isend_irecv`, one NCCL kernel per batch; in steady 1F1B a stage sends one tensor and
receives another of the same size from the same peer. Per call the two ranks leave a one-element all-reduce together
on the GPU, rank 0 sleeps its delay on the GPU, then:

- `one_way`: rank 0 sends, rank 1 receives (one op each, batched, as the harness's send but through a batch);
- `both_ways`: each rank sends its tensor to the other and receives the other's, in one batch.

Per size, mode and delay (0: together; 200 us: rank 0, a sender, late) it keeps every call's p2p kernel start and
duration on both ranks in DIR/p2p_batched.json; benchmarks/p2p_batched.py reads it with the training steps' split.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from measure.probes.nccl_probe import finish, probe_main

SIZES_MIB = (4.0, 16.0, 32.0, 64.0, 128.0)
MODES = ("one_way", "both_ways")
DELAYS_US = (0.0, 200.0)
WARMUP = 3
REPEATS = 16


def _ops(dist: Any, mode: str, rank: int, send: Any, recv: Any) -> list[Any]:
    peer = 1 - rank
    if mode == "one_way":
        return [dist.P2POp(dist.isend, send, peer)] if rank == 0 else [dist.P2POp(dist.irecv, recv, peer)]
    if mode == "both_ways":
        return [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")


def _time(torch: Any, dist: Any, mib: float, mode: str, delay_us: float, per_us: float) -> list[tuple[float, float, float]]:
    """This rank's (trace base us, start us, duration us) of REPEATS batched p2p calls of `mib` MiB each way."""
    from measure.collectives import released_calls

    rank, dev = dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    count = int(mib * 2**20) // 2
    send = torch.randn(count, dtype=torch.bfloat16, device=dev)
    recv = torch.empty(count, dtype=torch.bfloat16, device=dev)

    def call() -> None:
        for w in dist.batch_isend_irecv(_ops(dist, mode, rank, send, recv)):
            w.wait()

    return released_calls(torch, call, WARMUP, REPEATS, dist, dist.group.WORLD,
                          int(delay_us * per_us) if rank == 0 else 0, per_us)


def run(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from measure.collectives import cycles_per_us

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if dist.get_world_size() != 2:
        raise SystemExit("p2p_batched runs on exactly 2 ranks")
    rank, dev = dist.get_rank(), torch.device("cuda", local)
    per_us = cycles_per_us(torch)
    results: list[dict[str, Any]] = []
    for mib in SIZES_MIB:
        for mode in MODES:
            for delay in DELAYS_US:
                mine = torch.tensor(_time(torch, dist, mib, mode, delay, per_us), dtype=torch.float64, device=dev)
                every = [torch.empty_like(mine) for _ in range(2)]
                dist.all_gather(every, mine)
                if rank == 0:
                    results.append({"mib": mib, "bytes": int(mib * 2**20) // 2 * 2, "mode": mode, "delay_us": delay,
                                    "calls": [t.cpu().tolist() for t in every]})
    finish(out_dir, "p2p_batched", torch, dist, dev, warmup=WARMUP, repeats=REPEATS, sleep_cycles_per_us=per_us,
             results=results)


def main(argv: list[str] | None = None) -> int:
    return probe_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
