"""Which reduction shapes make one `aten::sum` kernel 2-6x slower than another of the same bytes?
(issue 5, twelfth session; needs a CUDA GPU and torch)

In the profiled H200 steps three populations of `aten::sum` share one kernel name
(reduce_kernel<512, 1>), dtype and layout: the MoE expert-scaling backward sum over rows of 7,168
(TP 2: a ~9 us floor from 0.7 to 9 MB) or 14,336 elements (no TP: ~2.3 TB/s), and the GQA backward
sum over the query group (~350 GB/s). The converted records keep only the bytes. This times
`sum` over the last dimension of [rows, length] for both lengths, contiguous and as a transposed view,
and over the group dimension of GQA-shaped gradients, naming the kernel each ran, so the converter
can be told which shape facts to record.

    python benchmarks/reduce_shapes.py [--iters N]      prints one line per case
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable


def _cases(torch: object) -> list[tuple[str, Callable[[], object]]]:
    t = torch  # type: ignore[assignment]
    dev, bf16 = "cuda", t.bfloat16
    out: list[tuple[str, Callable[[], object]]] = []
    for length in (7168, 14336):
        for rows in (64, 256, 512, 1024, 2048, 4096):
            x = t.randn(rows, length, device=dev, dtype=bf16)
            out.append((f"rows {rows} x {length} contiguous, sum(-1)", lambda x=x: x.sum(-1)))
            xt = t.randn(length, rows, device=dev, dtype=bf16).t()
            out.append((f"rows {rows} x {length} transposed view, sum(-1)", lambda xt=xt: xt.sum(-1)))
            y = t.randn(rows, length, device=dev, dtype=bf16)
            out.append((f"rows {rows} x {length} (x * y).sum(-1)", lambda x=x, y=y: (x * y).sum(-1)))
    for seq, kv, group in ((2048, 4, 4), (2048, 8, 4), (4096, 8, 4)):
        g = t.randn(seq, 1, kv, group, 128, device=dev, dtype=bf16)
        out.append((f"GQA [{seq},1,{kv},{group},128] sum(3)", lambda g=g: g.sum(3)))
        p = t.randn(1, kv, group, seq, 128, device=dev, dtype=bf16).permute(3, 0, 1, 2, 4)
        out.append((f"GQA [{seq},1,{kv},{group},128] from [b,kv,g,s,d] sum(3)", lambda p=p: p.sum(3)))
    return out


def _short(kernel: str) -> str:
    """reduce_kernel<512, 1> for a reduction (its block shape), else the name's first 40 characters."""
    m = re.search(r"reduce_kernel<(\d+), (\d+)", kernel)
    return f"reduce_kernel<{m[1]}, {m[2]}>" if m else kernel.split("(")[0][:40]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for name, fn in _cases(torch):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.count >= args.iters]
        for k in kernels:
            us = k.device_time if hasattr(k, "device_time") else k.cuda_time  # average per call
            print(f"{name:55s} {_short(k.key):40s} {us:8.2f} us  x{k.count // args.iters}")


if __name__ == "__main__":
    main()
