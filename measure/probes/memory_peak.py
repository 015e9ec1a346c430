"""What torch holds at a training step's allocated peak, by who allocated it.

    PYTHONPATH=.:/tmp/site python3 -m measure.probes.memory_peak --out /tmp/mp.json

One GPU, one process per configuration, megatron-core as `calib measure` builds it (measure.mcore).
After warm-up steps (Adam's states exist from the first optimizer step on), one step runs under
torch's allocator history (torch.cuda.memory._record_memory_history); the probe replays its
allocation and free events, finds the moment the allocated bytes peak, and groups the blocks live
then by the innermost frames of the Python stack that allocated them. It also records the peak of
each phase (zero_grad, forward-backward, optimizer step). Why: calib.workload.memory's estimate is
2.5 GiB under the measured peak of GPT-3 6.7B with full recomputation at micro-batch 4 (8 % at four
and eight layers, traces/README.md round 14; docs/project.md "Memory verdict"), and which tensors
make up the difference decides how the estimate should count them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# (label, model, recompute, micro-batch, global batch)
CONFIGS: list[tuple[str, str, str, int, int]] = [
    ("gpt6.7b-L4-rcfull-mbs4", "gpt3-6.7b@L4", "full", 4, 8),
    ("gpt6.7b-L8-rcfull-mbs4", "gpt3-6.7b@L8", "full", 4, 8),
    ("gpt6.7b-L4-rcnone-mbs4", "gpt3-6.7b@L4", "none", 4, 8),
    ("gpt6.7b-L4-rcsel-mbs4", "gpt3-6.7b@L4", "selective", 4, 8),
    # Where the loss, not a layer's backward, should peak: the largest vocabularies per layer.
    ("gpt1.3b-L8-mbs4", "gpt3-1.3b@L8", "none", 4, 16),
    ("llama8b-L2-mbs2", "llama3-8b@L2,S2048", "none", 2, 8),
]
GIB = 2**30
MAX_ENTRIES = 4_000_000
SKIP_FILES = ("torch/", "contextlib", "functools", "<frozen", "typing")


def _where(frames: list[dict], depth: int = 4) -> str:
    """The innermost frames outside torch's own files: who asked for the block."""
    keep = [f for f in frames if not any(s in f.get("filename", "") for s in SKIP_FILES)]
    return " < ".join(f"{Path(f['filename']).name}:{f['name']}" for f in keep[:depth]) or "torch internals"


def _groups(blocks: list[tuple[int, str]], most: int = 60) -> list[dict]:
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, where in blocks:
        groups[where][0] += size
        groups[where][1] += 1
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return [{"where": w, "bytes": b, "blocks": n} for w, (b, n) in top[:most]]


def _live_blocks(snapshot: dict) -> list[dict]:
    """The allocated blocks of a snapshot, grouped by who allocated them (history on since the start)."""
    out = []
    for seg in snapshot.get("segments", []):
        for blk in seg.get("blocks", []):
            if blk.get("state") == "active_allocated":
                out.append((int(blk.get("requested_size", blk.get("size", 0))), _where(blk.get("frames", []))))
    return _groups(out)


def _peak_blocks(snapshot: dict, offset: int) -> dict:
    """Replay the device trace's alloc/free events from `offset` on: the peak of what they allocated
    and the blocks live there."""
    events = [e for dev in snapshot.get("device_traces", []) for e in dev][offset:]
    live: dict[int, tuple[int, str]] = {}
    cur = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for e in events:
        action, addr, size = e.get("action"), e.get("addr"), int(e.get("size", 0))
        if action == "alloc":
            live[addr] = (size, _where(e.get("frames", [])))
            cur += size
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif action == "free_requested" and addr in live:
            cur -= live.pop(addr)[0]
    return {"events": len(events), "traced_peak_bytes": peak, "groups": _groups(list(at_peak.values()))}


def child(label: str, model: str, recompute: str, mbs: int, gbs: int, out: Path) -> None:
    import torch

    from calib.workload.parallel import ParallelConfig
    from measure.env import apply_safe_env
    from measure.mcore import build_parts
    from measure.request import TrainRequest

    apply_safe_env()
    torch.cuda.set_device(0)
    import torch.distributed as dist

    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    par = ParallelConfig(tp=1, pp=1, dp=1, ep=1, micro_batch=mbs, global_batch=gbs, recompute=recompute)
    req = TrainRequest(model=model, par=par)
    # History from the start, so that the blocks held between steps (model state) have their stacks too.
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES)
    training = build_parts(req, req.model_spec())
    parts = training.parts
    for _ in range(3):
        parts.step()
    torch.cuda.synchronize()
    phases = {}
    base = torch.cuda.memory_allocated()
    for name, fn in (("zero", parts.zero), ("forward_backward", parts.forward_backward),
                     ("optimizer_step", parts.optimizer_step)):
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        phases[name] = {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                        "allocated_after_bytes": int(torch.cuda.memory_allocated())}
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    snap0 = torch.cuda.memory._snapshot()
    held = _live_blocks(snap0)
    offset = sum(len(d) for d in snap0.get("device_traces", []))
    if offset >= MAX_ENTRIES:
        raise SystemExit("allocator history wrapped before the traced step: raise MAX_ENTRIES")
    del snap0
    parts.step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = _peak_blocks(snap, offset)
    result = {"label": label, "model": model, "recompute": recompute, "micro_batch": mbs, "global_batch": gbs,
              "allocated_before_step_bytes": int(base), "allocated_at_trace_start_bytes": int(start),
              "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()), "phases": phases,
              "params_on_rank": training.info.get("params_on_rank"), "torch": torch.__version__, "held_between_steps": held,
              **peak}
    out.write_text(json.dumps(result))
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated labels")
    ap.add_argument("--child", default="")
    ap.add_argument("--config", default="")
    a = ap.parse_args()
    if a.child:
        label, model, rc, mbs, gbs = json.loads(a.config)
        child(label, model, rc, int(mbs), int(gbs), Path(a.child))
        return
    results = {}
    for cfg in CONFIGS:
        if a.only and cfg[0] not in a.only.split(","):
            continue
        path = Path(a.out).with_suffix(f".{cfg[0]}.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29612", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        proc = subprocess.run([sys.executable, "-m", "measure.probes.memory_peak", "--out", a.out, "--child",
                               str(path), "--config", json.dumps(cfg)], env=env, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0 or not path.is_file():
            results[cfg[0]] = {"error": (proc.stderr or "").strip().splitlines()[-3:]}
            print(cfg[0], "failed:", results[cfg[0]]["error"], flush=True)
            continue
        r = results[cfg[0]] = json.loads(path.read_text())
        print(f"{cfg[0]}: peak {r['peak_allocated_bytes'] / GIB:.2f} GiB (traced {r['traced_peak_bytes'] / GIB:.2f}, "
              f"before the step {r['allocated_before_step_bytes'] / GIB:.2f}); phases "
              + ", ".join(f"{k} {v['peak_allocated_bytes'] / GIB:.2f}" for k, v in r["phases"].items()), flush=True)
        print("  held between steps:")
        for g in r["held_between_steps"][:12]:
            print(f"  {g['bytes'] / GIB:7.3f} GiB {g['blocks']:5d}  {g['where']}", flush=True)
        print("  allocated in the step and live at its peak:")
        for g in r["groups"][:25]:
            print(f"  {g['bytes'] / GIB:7.3f} GiB {g['blocks']:5d}  {g['where']}", flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
