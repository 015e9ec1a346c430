"""What the probes share: a probed configuration built as this process's rank, a probe run as ranks, and
the command line of a probe that runs each of its configurations so."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from measure.env import apply_safe_env, child_env


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


def probe_main(module: str, description: str, configs: Sequence[Any], run_one: Callable[[Any, argparse.Namespace], dict | None],
               result_name: Callable[[Any, dict], str], first_port: int, argv: list[str] | None = None) -> int:
    """`python -m module --out DIR [--only NAME,...] [--warmup N] [--steps N] [--timeout S]`: each wanted
    configuration of `configs` (objects with `name` and `par()`) run as its ranks on this host, one after
    another, each rank's `run_one(config, args)` written to DIR/`result_name(config, result)` (a rank whose
    run_one returns None writes nothing)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        apply_safe_env()
        config = next(c for c in configs if c.name == args.one)
        result = run_one(config, args)
        if result is not None:
            (out / result_name(config, result)).write_text(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)
    wanted = [c for c in configs if not args.only or c.name in args.only.split(",")]
    for port, config in enumerate(wanted, start=first_port):
        start = time.monotonic()
        rcs = launch_ranks(module, ["--out", str(out), "--one", config.name, "--warmup", str(args.warmup), "--steps",
                                    str(args.steps)], config.par().gpus, port, out / f"{config.name}.log", args.timeout)
        print(f"{config.name}: rc {rcs} in {time.monotonic() - start:.0f} s", flush=True)
    return 0
