"""Why do large flash-attention kernels run longer inside a training step than in the microbenchmark?

Round 45's kernel-timed microbenchmarks (measure/kernels.py, --timing kernel) ran the training steps' flash-attention
shapes with the steps' kernels: the small ones (seq 2048 at TP 2, 17-86 GFLOP) within 3 % of the steps' times, the
large ones (seq 8192 on one GPU, GPT-3 175B's 96 heads: 0.1-2.7 TFLOP) 14-23 % shorter (H200; traces/README.md).
The microbenchmark leaves the GPU idle 1 ms before each call; a step runs its attention between the layer's GEMMs,
the GPU held near its power cap. This probe times flash attention forward + backward (as measure.kernels runs it:
the flash backend forced, KV groups unexpanded, [s, b, n, d] tensors) under conditions that tell the two apart, with
the SM clock, power and clock-event reasons sampled beside each (measure.telemetry, 100 Hz):

- `gapped`: a 1 ms GPU sleep before each call (the microbenchmark's condition);
- `back-to-back`: calls one after the other;
- `after-gemms`: a burst of large GEMMs (BURST_GEMMS of 8192^3, about 6 ms) before each call, no idle between
  (the layer's GEMMs before its attention in a step);
- `gapped-late`: `gapped` again at the end, to see whether the GPU drifted over the probe.

    python -m measure.probes.flash_conditions --out DIR       (one GPU; writes DIR/flash-conditions.json)
"""

from __future__ import annotations

import json
from pathlib import Path

from measure.kernels import flash_forward_backward
from measure.probes.conditions import (
    SLEEP_CYCLES,
    probe_cli,
    timed_condition,
    write_result,
)

# (label, seq, batch, heads, kv groups, head dim): the steps' flash shapes of round 45's comparison, the three
# furthest from the microbenchmark and one of the small ones that matched it.
SHAPES = (("llama3-70b/tp1/seq8192", 8192, 1, 64, 8, 128), ("llama3-8b/tp1/seq8192", 8192, 1, 32, 8, 128),
          ("gpt3-175b/tp1/seq2048", 2048, 1, 96, 96, 128), ("llama3-8b/tp2/seq2048", 2048, 1, 16, 4, 128))
CONDITIONS = ("gapped", "back-to-back", "after-gemms", "gapped-late")
WINDOW_S = 0.4  # each condition runs about this long (at least MIN_CALLS calls)
MIN_CALLS = 20
BURST_GEMMS = 4


def run(out: Path) -> None:
    import torch

    from measure.telemetry import open_backend

    dev = torch.device("cuda", 0)
    backend = open_backend("auto", None)
    gpu = backend.gpus[0]  # type: ignore[attr-defined]
    ga, gb = (torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev) for _ in range(2))

    def before(condition: str) -> None:
        if condition.startswith("gapped"):
            torch.cuda._sleep(SLEEP_CYCLES)
        elif condition == "after-gemms":
            for _ in range(BURST_GEMMS):
                torch.mm(ga, gb)

    points = []
    for label, seq, batch, heads, kv, hd in SHAPES:
        call = flash_forward_backward(torch, seq, batch, heads, kv, hd, dev)
        for condition in CONDITIONS:
            point = timed_condition(torch, backend, gpu, call, lambda c=condition: before(c), WINDOW_S, MIN_CALLS)
            points.append({"shape": label, "seq": seq, "batch": batch, "heads": heads, "kv_groups": kv, "head_dim": hd,
                           "condition": condition, **point})
            print(json.dumps(points[-1]), flush=True)
        del call
    backend.close()
    write_result(out, "flash-conditions.json", torch, dev, window_s=WINDOW_S, sleep_cycles=SLEEP_CYCLES,
                 burst_gemms=BURST_GEMMS, points=points)


def main(argv: list[str] | None = None) -> int:
    return probe_cli(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
