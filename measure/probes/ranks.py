"""What the probes share: a probed configuration built as this process's rank, and a probe run as ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from measure.env import child_env


def build_rank(model: str, par: Any) -> Any:
    """megatron-core's training of `model` split by `par` (a ParallelConfig), built as this process's rank
    (RANK / LOCAL_RANK from the environment, as launch_ranks sets them), after a NCCL process group."""
    import torch
    import torch.distributed as dist

    from measure.mcore import build_parts
    from measure.request import TrainRequest

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    req = TrainRequest(model=model, par=par)
    return build_parts(req, req.check(dist.get_world_size()))


def launch_ranks(module: str, argv: list[str], world: int, port: int, log: Path, timeout_s: float) -> list[object]:
    """`python -m module *argv` as `world` ranks of one host (MASTER_*, RANK, WORLD_SIZE, LOCAL_RANK), their
    output in `log`; each rank's return code, "timeout" for one killed after `timeout_s` seconds."""
    start = time.monotonic()
    with open(log, "w") as out:
        procs = [subprocess.Popen([sys.executable, "-m", module, *argv], stdout=out, stderr=subprocess.STDOUT,
                                  env=child_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                                 "WORLD_SIZE": str(world), "LOCAL_RANK": str(r)}))
                 for r in range(world)]
        rcs: list[object] = []
        for proc in procs:
            try:
                rcs.append(proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - start))))
            except subprocess.TimeoutExpired:
                rcs.append("timeout")
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return rcs
