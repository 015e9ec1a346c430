"""Where the device memory outside torch's caching allocator comes from, stage by stage.

    PYTHONPATH=.:/tmp/site python3 -m measure.probes.outside_memory --out /tmp/om.json

One GPU, one process, megatron-core as `calib measure` builds it (measure.mcore). After each stage of
a run's start (CUDA context, the NCCL process group bound to the device, megatron's parallel groups,
the model and optimizer, the first steps) it records the device's used memory (cudaMemGetInfo) and
the allocator's reserve; their difference is what `calib measure` records per rank as
`outside_allocator_bytes`. Each stage runs in a fresh process with one environment variant, so a
variant (e.g. lazy CUDA module loading off) shows what it changes. Why: round 13 recorded 8.89 GiB
outside the allocator on every one-GPU H200 run, dense or MoE, at any size (traces/README.md), and
whether that is a constant per process or grows with the run decides how a projection counts it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "eager-modules": {"CUDA_MODULE_LOADING": "EAGER"},
    "no-nccl-eager-init": {"CALIB_PROBE_NO_DEVICE_ID": "1"},
}


def _probe(at: str, rows: list[dict]) -> None:
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    rows.append({"at": at, "used_bytes": int(total - free), "reserved_bytes": int(torch.cuda.memory_reserved()),
                 "outside_bytes": int(total - free - torch.cuda.memory_reserved())})


def child(model: str, out: Path) -> None:
    """One process: the stages in order, a probe after each (runs under the variant's environment)."""
    import torch
    import torch.distributed as dist

    from calib.workload.parallel import ParallelConfig
    from measure.env import apply_safe_env
    from measure.request import TrainRequest

    apply_safe_env()
    rows: list[dict] = []
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    _probe("cuda context", rows)
    if os.environ.get("CALIB_PROBE_NO_DEVICE_ID"):
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    _probe("nccl process group", rows)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    _probe("first all-reduce", rows)
    from measure.mcore import build_parts

    par = ParallelConfig(tp=1, pp=1, dp=1, ep=1, micro_batch=1, global_batch=2)
    req = TrainRequest(model=model, par=par)
    training = build_parts(req, req.model_spec())
    _probe("megatron groups, model and optimizer", rows)
    training.parts.step()
    _probe("first step", rows)
    training.parts.step()
    _probe("second step", rows)
    import torch.nn.functional as F

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(a.view(1, 1, 4096, 4096)[..., :128], a.view(1, 1, 4096, 4096)[..., :128],
                                   a.view(1, 1, 4096, 4096)[..., :128], is_causal=True)
    _probe("after an SDPA call", rows)
    out.write_text(json.dumps({"model": model, "env": {k: os.environ.get(k, "") for k in ("CUDA_MODULE_LOADING",
                   "CALIB_PROBE_NO_DEVICE_ID")}, "torch": torch.__version__, "probes": rows}))
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3-8b@L2,S2048")
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    if a.child:
        child(a.model, Path(a.child))
        return
    results = {}
    for name, extra in VARIANTS.items():
        path = Path(a.out).with_suffix(f".{name}.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1",
                   LOCAL_RANK="0", **extra)
        proc = subprocess.run([sys.executable, "-m", "measure.probes.outside_memory", "--out", a.out, "--model",
                               a.model, "--child", str(path)], env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0 or not path.is_file():
            results[name] = {"error": (proc.stderr or "").strip().splitlines()[-1:]}
            continue
        results[name] = json.loads(path.read_text())
        for p in results[name]["probes"]:
            print(f"{name:20s} {p['at']:40s} used {p['used_bytes'] / 2**30:7.2f} GiB  "
                  f"reserved {p['reserved_bytes'] / 2**30:7.2f}  outside {p['outside_bytes'] / 2**30:6.2f}", flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
