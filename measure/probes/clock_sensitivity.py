"""How does a GEMM's and a flash-attention call's time follow the SM clock the power cap leaves it?

A training step's kernels run at the clock their run holds under the 700 W cap (the H200 runs' profiled steps:
1.56-1.98 GHz), the kernel-timed microbenchmark's at 1.98 GHz after 1 ms of idle (traces/README.md, round 45 and the
fifty-third session). A kernel model fitted per clock needs each class's sensitivity: time ~ clock^-beta, beta 1 for
a kernel bound by the SMs' issue rate, 0 for one bound by HBM. This probe moves the clock by the length of a burst
of large GEMMs run just before each timed call (0-16 of 8192^3 at bf16, about 1.5 ms each), after 2 ms of GPU idle,
and reads the SM clock during each call: a thread polls NVML's current SM clock (`nvmlDeviceGetClockInfo`) as fast
as it answers, and a call's clock is the median of the polls inside its window (its CUDA-event duration ending at
the host's return from the synchronization after it).

    python -m measure.probes.clock_sensitivity --out DIR       (one NVIDIA GPU; writes DIR/clock-sensitivity.json)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from measure.kernels import flash_forward_backward, gemm_operands
from measure.probes.conditions import probe_cli, write_result

# GEMMs (m, n, k, layout as measure.kernels.PASS_LAYOUTS) of round 45's shapes, and flash forward + backward
# (label, seq, batch, heads, kv groups, head dim) as measure/probes/flash_conditions.py runs them.
GEMMS = ((8192, 4096, 25216, "nn"), (8192, 8192, 4096, "tn"), (2048, 8192, 2560, "nn"))
FLASH = (("llama3-8b/tp1/seq8192", 8192, 1, 32, 8, 128), ("gpt3-175b/tp1/seq2048", 2048, 1, 96, 96, 128))
BURSTS = (0, 1, 2, 4, 8, 16)
REPEATS = 12
IDLE_CYCLES = 4_000_000  # about 2 ms at the H200's clock


class ClockPoller:
    """Polls NVML's current SM clock of one GPU on a thread: (monotonic s, Hz) pairs."""

    def __init__(self, index: int = 0) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nv, h = self._nvml, self._handle
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), 1e6 * nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))

    def __enter__(self) -> ClockPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()

    def clock_in(self, lo: float, hi: float) -> tuple[float | None, int]:
        inside = sorted(hz for t, hz in self.samples[-20000:] if lo <= t <= hi)
        return (inside[len(inside) // 2] if inside else None), len(inside)


def _calls(torch: Any, dev: Any) -> list[tuple[str, Any]]:
    out = []
    for m, n, k, layout in GEMMS:
        a, b = gemm_operands(torch, m, n, k, layout, dev)
        out.append((f"gemm/{m}x{n}x{k}/{layout}", lambda a=a, b=b: torch.mm(a, b)))
    for label, seq, batch, heads, kv, hd in FLASH:
        out.append((f"flash/{label}", flash_forward_backward(torch, seq, batch, heads, kv, hd, dev)))
    return out


def run(out: Path) -> None:
    import torch

    dev = torch.device("cuda", 0)
    ga, gb = (torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev) for _ in range(2))
    calls = _calls(torch, dev)
    for _, call in calls:  # warm-up: kernels chosen, workspaces allocated
        call()
    torch.cuda.synchronize()
    points = []
    with ClockPoller() as clock:
        for label, call in calls:
            for burst in BURSTS:
                for rep in range(REPEATS):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda._sleep(IDLE_CYCLES)
                    for _ in range(burst):
                        torch.mm(ga, gb)
                    start.record()
                    call()
                    end.record()
                    end.synchronize()
                    t_end = time.monotonic()
                    dur = start.elapsed_time(end) * 1e-3
                    hz, n = clock.clock_in(t_end - dur, t_end)
                    points.append({"call": label, "burst": burst, "repeat": rep, "time_s": dur, "sm_clock_hz": hz,
                                   "polls": n})
                med = sorted(p["time_s"] for p in points[-REPEATS:])[REPEATS // 2]
                clk = [p["sm_clock_hz"] for p in points[-REPEATS:] if p["sm_clock_hz"]]
                print(f"{label:28s} burst {burst:2d}: {med * 1e3:8.3f} ms at "
                      f"{(sorted(clk)[len(clk) // 2] / 1e9 if clk else float('nan')):.3f} GHz", flush=True)
        polls_per_s = len(clock.samples) / max(clock.samples[-1][0] - clock.samples[0][0], 1e-9)
    write_result(out, "clock-sensitivity.json", torch, dev, bursts=list(BURSTS), repeats=REPEATS,
                 idle_cycles=IDLE_CYCLES, polls_per_s=polls_per_s, points=points)


def main(argv: list[str] | None = None) -> int:
    return probe_cli(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
