"""Host launch pacing per thread in a profiled pipeline-parallel step (evidence for docs/host.md).

megatron-core's pipeline schedule synchronises the device after every batch of send/recv, so each
segment between two long cudaDeviceSynchronize calls is one micro-batch's host work: the forward
launched from the Python thread, then the backward launched from the autograd engine's thread. The
script prints, per segment, how many kernels each thread launched and the host time per launch.
Profiled host time is inflated several-fold, so the ratio between the threads is what it shows,
not the unprofiled cost.

    python benchmarks/launch_threads.py tests/data/h200-pp2-raw/device.1.json.xz
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from calib.convert.kineto import RuntimeCall, read_kineto

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemsetAsync", "cudaMemcpyAsync")
LONG_SYNC_NS = 1_000_000  # a device sync that waited at least this long ends a micro-batch


def segments(calls: list[RuntimeCall]) -> list[tuple[int, int]]:
    syncs = [c for c in calls if c.name == "cudaDeviceSynchronize" and c.dur_ns >= LONG_SYNC_NS]
    return [(a.ts_ns + a.dur_ns, b.ts_ns) for a, b in zip(syncs, syncs[1:], strict=False)]


def main(path: str) -> None:
    kt = read_kineto(Path(path))
    calls = sorted(kt.calls, key=lambda c: c.ts_ns)
    syncing = Counter(c.tid for c in calls if c.name == "cudaDeviceSynchronize")
    if not syncing:
        raise SystemExit(f"{path}: no cudaDeviceSynchronize (not a pipeline-parallel step)")
    main_tid = syncing.most_common(1)[0][0]
    launches = [c for c in calls if c.name in LAUNCH_CALLS]
    print(f"{'segment':>7} {'fwd launches':>12} {'us/launch':>9} {'bwd launches':>12} {'us/launch':>9}")
    for i, (start, end) in enumerate(segments(calls)):
        seg = [c for c in launches if start <= c.ts_ns < end]
        other = [c for c in seg if c.tid != main_tid]
        if not other:
            continue
        fwd = [c for c in seg if c.tid == main_tid and c.ts_ns < other[0].ts_ns]
        if not fwd:
            continue
        fwd_us = (other[0].ts_ns - start) / 1e3 / len(fwd)
        bwd_us = (other[-1].ts_ns - other[0].ts_ns) / 1e3 / max(len(other) - 1, 1)
        print(f"{i:>7} {len(fwd):>12} {fwd_us:>9.0f} {len(other):>12} {bwd_us:>9.0f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/h200-pp2-raw/device.1.json.xz")
