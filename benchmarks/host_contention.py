"""Does a host get slower per process as more processes share it? (evidence for docs/host.md, "pace")

Starts N processes at once (N = 1, 2, 4, 8 by default) and has each time, after a common start:
- `python`: a pure-Python loop (the interpreter work eager PyTorch does per op), microseconds per
  1,000 iterations;
- `launch`: tiny CUDA kernels (torch.add on 1,024 floats) launched back to back without waiting,
  host microseconds per launch, each process on GPU (rank % GPU count), when CUDA is there.
Prints one line per N and test with the median over processes, and the host's CPU model and count.

    python benchmarks/host_contention.py [--n 1,2,4,8] [--seconds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without `pip install -e .`
from measure.env import host_cpu  # noqa: E402 - after the path above


def _python_us(seconds: float) -> float:
    """Microseconds per 1,000 iterations of a small pure-Python loop, over `seconds`."""
    loops = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x = 0
        for i in range(1000):
            x += i & 7
        loops += 1
    return (time.perf_counter() - t0) / loops * 1e6


def _launch_us(rank: int, seconds: float) -> float | None:
    """Host microseconds per launch of a tiny kernel (the queue never fills: each runs ~2 us)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_device(rank % torch.cuda.device_count())
    a = torch.ones(1024, device="cuda")
    for _ in range(200):
        a.add_(1.0)
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            a.add_(1.0)
        n += 100
        if n % 5000 == 0:
            torch.cuda.synchronize()  # keep the queue short: host time only
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def _worker(rank: int, test: str, seconds: float, barrier: mp.Barrier, out: mp.Queue) -> None:
    if test == "launch":
        _launch_us(rank, 0.2)  # CUDA context and warm-up before the common start
    barrier.wait()
    out.put(_python_us(seconds) if test == "python" else _launch_us(rank, seconds))


def run(n: int, test: str, seconds: float) -> float | None:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, test, seconds, barrier, out)) for r in range(n)]
    for p in procs:
        p.start()
    values = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cpu = host_cpu()
    result = {"cpu": cpu["model"], "cpus": cpu["logical_cpus"], "rows": []}
    print(f"host: {result['cpu']}, {result['cpus']} logical CPUs")
    for test in ("python", "launch"):
        for n in (int(x) for x in args.n.split(",")):
            v = run(n, test, args.seconds)
            result["rows"].append({"test": test, "processes": n, "us": v})
            unit = "us per 1,000 loop iterations" if test == "python" else "host us per kernel launch"
            print(f"{test:7s} {n:2d} processes: " + ("n/a (no CUDA)" if v is None else f"{v:8.2f} {unit}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
