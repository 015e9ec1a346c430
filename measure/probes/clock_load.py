"""What sets the SM clock the 700 W cap leaves a GPU: the share of time it runs GEMMs, or the GEMM FLOPs it does
per second?

calib's clock model (calib.models.clock) predicts a step's SM clock from one number of the step. Over the committed
training runs the GEMM FLOP rate (FLOPs per second of the step over the peak) predicts held-out configurations'
clocks better than the share of the step in GEMM and attention kernels (docs/host.md, "The clock model reads the
GEMM FLOP rate"). Training steps mix many things at once; this probe takes them apart. Each load repeats a period of
busy work (GEMMs of three efficiencies, flash attention forward + backward, a memory-bound add, 8192^3 GEMMs each
followed by 1-8 adds) followed by GPU idle (torch.cuda._sleep), at four duty cycles, for SETTLE_S then WINDOW_S; over the window
it reads the GPU's busy share (CUDA events around each period's work), its FLOP rate, the median SM clock and the
mean power (the energy counter) from calib's telemetry sampler at 100 Hz.

    python -m measure.probes.clock_load --out DIR       (one NVIDIA GPU; writes DIR/clock-load.json)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure.kernels import flash_forward_backward, gemm_operands
from measure.probes.conditions import probe_cli, write_result

# Three efficiencies, each long enough (>= 0.1 ms) that the host keeps ahead of the GPU at full duty.
GEMMS = ((8192, 8192, 8192, "nn"), (2048, 8192, 2560, "nn"), (16384, 256, 16384, "nn"))
FLASH = ("llama3-8b/tp1/seq8192", 8192, 1, 32, 8, 128)
ADD_ELEMENTS = 1 << 27  # bf16 tensors of 256 MiB: an add moves 768 MiB, memory-bound
MIXES = (1, 2, 4, 8)  # adds after each 8192^3 GEMM (about 1.9 ms): memory-bound work beside the GEMMs, 8-60 % of it
DUTIES = (1.0, 0.7, 0.45, 0.25)
PERIOD_S = 0.01  # busy work plus idle per period
SETTLE_S = 1.5  # the power limiter settles within this (its own window is shorter)
WINDOW_S = 2.0
SLEEP_CYCLES_PER_S = 1.98e9  # torch.cuda._sleep counts SM cycles; at a lower clock the idle lasts longer (measured)


def _flash_flops(seq: int, batch: int, heads: int, hd: int) -> float:
    """Causal attention: forward 2 matmuls of b * heads * s^2 * d multiply-adds, halved by the mask; the backward 2.5
    times the forward (five matmuls to two)."""
    fwd = 2 * 2 * batch * heads * seq * seq * hd / 2
    return 3.5 * fwd


def _loads(torch: Any, dev: Any) -> list[tuple[str, Callable[[], object], float, float]]:
    """(label, call, GEMM FLOPs per call, attention FLOPs per call)."""
    out: list[tuple[str, Callable[[], object], float, float]] = []
    for m, n, k, layout in GEMMS:
        a, b = gemm_operands(torch, m, n, k, layout, dev)
        out.append((f"gemm/{m}x{n}x{k}", lambda a=a, b=b: torch.mm(a, b), 2.0 * m * n * k, 0.0))
    label, seq, batch, heads, kv, hd = FLASH
    out.append((f"flash/{label}", flash_forward_backward(torch, seq, batch, heads, kv, hd, dev), 0.0,
                _flash_flops(seq, batch, heads, hd)))
    x, y = (torch.randn(ADD_ELEMENTS, dtype=torch.bfloat16, device=dev) for _ in range(2))
    out.append(("add/256MiB", lambda: torch.add(x, y), 0.0, 0.0))
    a, b = gemm_operands(torch, 8192, 8192, 8192, "nn", dev)
    for adds in MIXES:
        def mixed(adds: int = adds) -> None:
            torch.mm(a, b)
            for _ in range(adds):
                torch.add(x, y)

        out.append((f"gemm8192+{adds}add", mixed, 2.0 * 8192 ** 3, 0.0))
    return out


def _call_time_s(torch: Any, call: Callable[[], object], n: int = 5) -> float:
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / n


def _run_load(torch: Any, call: Callable[[], object], calls: int, sleep_cycles: int, seconds: float,
              timed: bool) -> tuple[float, float, int]:
    """Periods of `calls` calls then `sleep_cycles` of idle for about `seconds` (the host is held to the GPU's pace
    once the launch queue fills); (busy s, wall s, periods) from CUDA events where `timed`."""
    events = []
    t_end = time.monotonic() + seconds
    periods = 0
    first = torch.cuda.Event(enable_timing=True)
    last = torch.cuda.Event(enable_timing=True)
    first.record()
    while time.monotonic() < t_end:
        if timed:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
        for _ in range(calls):
            call()
        if timed:
            e.record()
            events.append((s, e))
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        periods += 1
    last.record()
    torch.cuda.synchronize()
    busy = sum(s.elapsed_time(e) for s, e in events) * 1e-3
    return busy, first.elapsed_time(last) * 1e-3, periods


def run(out: Path) -> None:
    import torch

    from measure.telemetry import Sampler, open_backend

    dev = torch.device("cuda", 0)
    backend = open_backend("auto", None)
    gpu = backend.gpus[0]  # type: ignore[attr-defined]
    t0 = time.monotonic()
    sampler = Sampler(backend, [gpu], 100.0, t0).start()
    points = []
    for label, call, gemm_flops, attn_flops in _loads(torch, dev):
        call_s = _call_time_s(torch, call)
        calls = max(1, round(PERIOD_S / call_s))
        for duty in DUTIES:
            idle_s = calls * call_s * (1 - duty) / duty
            cycles = int(idle_s * SLEEP_CYCLES_PER_S)
            _run_load(torch, call, calls, cycles, SETTLE_S, timed=False)
            lo = time.monotonic() - t0
            busy, wall, periods = _run_load(torch, call, calls, cycles, WINDOW_S, timed=True)
            hi = time.monotonic() - t0
            tel = sampler.frame()
            w = tel[(tel["t_s"] >= lo) & (tel["t_s"] <= hi)]
            energy = w["energy_j"].dropna()
            power = (float((energy.iloc[-1] - energy.iloc[0]) / (w.loc[energy.index[-1], "t_s"]
                                                                 - w.loc[energy.index[0], "t_s"]))
                     if len(energy) > 1 else None)
            n = periods * calls
            point = {"load": label, "duty_target": duty, "calls_per_period": calls, "call_s": call_s,
                     "sleep_cycles": cycles, "periods": periods, "busy_s": busy, "wall_s": wall,
                     "busy_share": busy / wall, "gemm_flop_rate": gemm_flops * n / wall,
                     "attention_flop_rate": attn_flops * n / wall, "samples": len(w),
                     "sm_clock_hz": float(w["sm_clock_hz"].median()) if len(w) else None,
                     "power_w": power,
                     "power_instant_w": float(w["power_instant_w"].median()) if len(w) else None,
                     "clock_event_reasons": sorted({int(r) for r in w["clock_event_reasons"].dropna()})}
            points.append(point)
            print(f"{label:24s} duty {duty:4.2f}: busy {point['busy_share']:.3f}  GEMM {point['gemm_flop_rate'] / 1e12:6.1f}"
                  f"  attn {point['attention_flop_rate'] / 1e12:6.1f} TFLOP/s  "
                  f"{(point['sm_clock_hz'] or float('nan')) / 1e9:.3f} GHz  {power or float('nan'):5.0f} W", flush=True)
    sampler.stop()
    backend.close()
    write_result(out, "clock-load.json", torch, dev, duties=list(DUTIES), period_s=PERIOD_S, settle_s=SETTLE_S,
                 window_s=WINDOW_S, points=points)


def main(argv: list[str] | None = None) -> int:
    return probe_cli(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
