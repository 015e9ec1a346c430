"""The trainer's own pace, timed in its main thread just after each measured step.

A host-paced step is the time its two launching threads (the main thread, and torch's autograd thread for
the backward) spend on their CPUs, and on the H200 hosts each CPU's pace moves on its own: a process on
another CPU, as the host-pace sampler is, does not follow the steps, while tiny launches timed in the
trainer after each step follow its blocks' median steps at r +0.63 to +0.87 (docs/host.md, "The trainer's
threads, step by step"). So every measured step is followed, outside its timing, by two timings in the
main thread: LAUNCHES in-place adds on a small tensor, launched without waiting (seconds per launch: the
launch path the step takes, dispatcher and driver), and the sampler's fixed Python work (seconds per
sample, comparable with host_pace.parquet). About 2 ms a step; the next step starts after a device sync and,
with more than one rank, a barrier, so that no rank starts its step late by its own timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from measure.telemetry.host_pace import PACE_ITERATIONS, python_work_us

LAUNCHES = 200  # tiny launches per timing: about 1.5 ms at 7-10 us each
LAUNCH_FLOATS = 256  # the tensor each launch adds to: 1 KiB, so the launch, not the kernel, is timed


def launch_s(x: Any, n: int = LAUNCHES) -> float:
    """Seconds per launch of `n` in-place adds on `x` (a small CUDA tensor), none waited for; the device
    is drained before (so the queue is empty) and after (so the next step starts on an idle GPU)."""
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter_ns()
    for _ in range(n):
        x.add_(1.0)
    took = time.perf_counter_ns() - t
    torch.cuda.synchronize()
    return took / 1e9 / n


def timer(cuda: bool) -> Callable[[], dict[str, float]]:
    """A function timing the own pace once, as the steps table's optional columns (calib.bundle.schema,
    STEP_OPTIONAL_COLUMNS); launches only on CUDA (NaN on the CPU path, where there is nothing to launch)."""
    x = None
    if cuda:
        import torch

        x = torch.zeros(LAUNCH_FLOATS, device="cuda")

    def once() -> dict[str, float]:
        launch = launch_s(x) if x is not None else float("nan")
        return {"own_launch_s": launch, "own_work_s": python_work_us(PACE_ITERATIONS, tries=1) / 1e6}

    return once
