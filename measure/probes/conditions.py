"""What the one-GPU kernel-timing probes share (gemm_conditions, flash_conditions, clock_sensitivity): a call timed
under a condition with the GPU's clock, power and clock-event reasons sampled beside it, and the probe's command
line (`--out DIR`, one JSON file there). Their calls are built as the kernel microbenchmark builds them
(measure.kernels.gemm_operands, flash_forward_backward)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SLEEP_CYCLES = 2_000_000  # about 1 ms at the H200's clock


def timed_condition(torch: Any, backend: Any, gpu: int, call: Callable[[], object], before: Callable[[], None],
                    window_s: float, min_calls: int, warm: int = 3) -> dict:
    """Time `call` about window_s (at least min_calls calls, sized by `warm` warm-up calls), `before()` run ahead of
    each timed call and outside its CUDA events, telemetry sampled at 100 Hz (measure.telemetry) over the calls:
    calls, median_s, min_s, max_s, samples, sm_clock_hz and power_w (medians), clock_event_reasons (the set seen)."""
    from measure.telemetry import Sampler

    warm_start, warm_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    warm_start.record()
    for _ in range(warm):
        call()
    warm_end.record()
    torch.cuda.synchronize()
    calls = max(min_calls, int(window_s / (warm_start.elapsed_time(warm_end) * 1e-3 / warm)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    sampler = Sampler(backend, [gpu], 100.0, time.monotonic()).start()
    for start, end in events:
        before()
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    sampler.stop()
    tel = sampler.frame()
    times = sorted(s.elapsed_time(e) * 1e-3 for s, e in events)
    return {
        "calls": calls, "median_s": times[len(times) // 2], "min_s": times[0], "max_s": times[-1], "samples": len(tel),
        "sm_clock_hz": float(tel["sm_clock_hz"].median()) if len(tel) else None,
        "power_w": float(tel["power_instant_w"].median()) if len(tel) and "power_instant_w" in tel else None,
        "clock_event_reasons": sorted({int(x) for x in tel.get("clock_event_reasons", []) if x == x}),
    }


def write_result(out: Path, name: str, torch: Any, dev: Any, **fields: object) -> None:
    """DIR/name: the device, torch version and the probe's fields."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                                        **fields}, indent=1))


def probe_cli(doc: str, run: Callable[[Path], None], argv: list[str] | None = None) -> int:
    """`python -m measure.probes.<probe> --out DIR`: run(DIR)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    run(p.parse_args(argv).out)
    return 0
