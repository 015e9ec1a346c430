"""Why does an isolated GEMM run longer than the same kernel inside a training step?

Round 45's kernel-timed microbenchmarks (measure/kernels.py, --timing kernel) ran the GEMMs of the training steps'
shapes with the very kernels the steps ran (same name, same operand layout) a median 8 % longer than the steps did,
up to 30 % (H200; traces/README.md, round 45). The microbenchmark times ten calls of one GEMM back to back on inputs
drawn from N(0, 1); a step interleaves its GEMMs with memory-bound kernels on trained values. This probe times a few
of those GEMMs under conditions that tell the candidates apart, with the GPU's SM clock, power and clock-event
reasons sampled beside each (measure.telemetry, 100 Hz):

- `randn`: the microbenchmark's own inputs, N(0, 1), calls back to back;
- `weights`: N(0, 0.02) weights and N(0, 1) activations (the initialised model's scale);
- `zeros`: all-zero inputs (the fewest toggling bits a GEMM can have);
- `gapped`: N(0, 1) inputs with a 1 ms GPU sleep before each call (the GPU idles between GEMMs, as it does between
  a step's GEMMs while memory-bound kernels run);
- `randn-late`: N(0, 1) again at the end, to see whether the GPU drifted over the probe.

    python -m measure.probes.gemm_conditions --out DIR       (one GPU; writes DIR/gemm-conditions.json)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from measure.kernels import gemm_operands
from measure.probes.conditions import SLEEP_CYCLES, probe_cli, timed_condition, write_result

# (m, n, k, layout): among round 45's shapes furthest from the training steps' time (1.19-1.30x) and one
# the microbenchmark timed shorter (0.87x); layout as measure.kernels.PASS_LAYOUTS.
SHAPES = ((8192, 4096, 25216, "nn"), (8192, 8192, 4096, "tn"), (2048, 8192, 2560, "nn"), (2048, 4096, 2048, "tn"),
          (8192, 8192, 6144, "nt"))
CONDITIONS = ("randn", "weights", "zeros", "gapped", "randn-late")
WINDOW_S = 0.3  # each condition runs about this long (at least MIN_CALLS calls), long enough for ~30 samples
MIN_CALLS = 40


def _operands(torch: Any, m: int, n: int, k: int, layout: str, condition: str, dev: Any) -> tuple[Any, Any]:
    a, b = gemm_operands(torch, m, n, k, layout, dev, torch.zeros if condition == "zeros" else torch.randn)
    return a, b * (0.02 if condition == "weights" else 1.0)


def run(out: Path) -> None:
    import torch

    from measure.telemetry import open_backend

    dev = torch.device("cuda", 0)
    backend = open_backend("auto", None)
    gpu = backend.gpus[0]  # type: ignore[attr-defined]
    points = []
    for m, n, k, layout in SHAPES:
        for condition in CONDITIONS:
            a, b = _operands(torch, m, n, k, layout, "randn" if condition.startswith("randn") else condition, dev)
            gapped = condition == "gapped"
            point = timed_condition(torch, backend, gpu, lambda a=a, b=b: torch.mm(a, b),
                                    lambda gapped=gapped: torch.cuda._sleep(SLEEP_CYCLES) if gapped else None,
                                    WINDOW_S, MIN_CALLS, warm=5)
            points.append({"m": m, "n": n, "k": k, "layout": layout, "condition": condition, **point})
            print(json.dumps(points[-1]), flush=True)
            del a, b
    backend.close()
    write_result(out, "gemm-conditions.json", torch, dev, window_s=WINDOW_S, sleep_cycles=SLEEP_CYCLES, points=points)


def main(argv: list[str] | None = None) -> int:
    return probe_cli(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
