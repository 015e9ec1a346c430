"""Where the GPU idles in a profiled step: one-GPU runs' converted ETs (docs/host.md, "Where the one-GPU
MoE steps idle").

    python benchmarks/gpu_idle.py [BUNDLE ...] [--calibration CAL] [--json OUT]
                                  (default: the one-GPU Mixtral runs of traces/h200)
    python benchmarks/gpu_idle.py traces/h200/*-idle35* --calibration calib/data/calibration-h200.yaml   (round 35)

A converted ET keeps every kernel's start and duration (calib.convert). Per run: the profiled step's GPU
time (the union of its kernels), the idle between them (gaps over 2 us), and that idle split by what starts
after it: the routing (a routing's device-to-host copies and the nodes up to the expert loop), the expert
loop (its first GEMM after a routing's wait and the GEMMs and elementwise ops that follow it), the
optimizer (from the first scalar read on), and the rest. Beside it, the unprofiled measured step (median)
and its difference from the profiled GPU time: what the GPU idles in a step the profiler did not slow, and the
trainer's own launch pace (measure/own_pace.py). `--calibration` adds what that calibration predicts for each
run, generated from its spec at its own pace (calib validate's held-out step, for runs it was not fitted on) and
replayed. `--json` writes the rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
LOOP_OPS = {"aten::mm", "aten::silu", "aten::add", "aten::mul", "aten::gelu"}
MIN_GAP_NS = 2000


def phases(nodes: list) -> list[str]:
    """Per node (id order): routing, expert loop, optimizer or other."""
    from calib.chakra.model import NodeType
    from calib.workload.host import SCALAR_READ_OPS, routing_copy_groups

    index = {n.id: i for i, n in enumerate(nodes)}
    out = ["other"] * len(nodes)
    for group in routing_copy_groups(nodes):
        i = index[group[0]]
        while i < len(nodes) and not (nodes[i].type == NodeType.COMP_NODE and nodes[i].attr("op_class") == "gemm"):
            out[i] = "routing"
            i += 1
        while i < len(nodes) and nodes[i].type == NodeType.COMP_NODE and nodes[i].attr("aten_op") in LOOP_OPS:
            out[i] = "expert loop"
            i += 1
    first_read = next((i for i, n in enumerate(nodes) if n.attr("aten_op") in SCALAR_READ_OPS), None)
    if first_read is not None:
        for i in range(first_read, len(nodes)):
            out[i] = "optimizer"
    return out


def predicted(bundle: object, calibration: object) -> dict:
    """The calibration's generated and replayed steps of the run, milliseconds."""
    from calib.validate import _replay_one
    from calib.validation.engine import predict
    from calib.validation.measured import measured_step

    replay = _replay_one(bundle, calibration, measured_step(bundle), {})
    return {"generated_ms": predict(bundle, calibration).step_s * 1e3, "replayed_ms": replay.predicted_step_s * 1e3}


def idle(bundle: object) -> dict:
    from calib.validation.measured import measured_own_launch_s, measured_step
    from calib.validation.replay import read_run_traces, replay_workload

    trace = replay_workload(read_run_traces(bundle)).classes[0].trace
    nodes = sorted((n for n in trace.nodes if not n.is_cpu_op), key=lambda n: n.id)
    where = phases(nodes)
    spans = sorted((n.start_time_micros * 1000, n.start_time_micros * 1000 + n.duration_ns, w)
                   for n, w in zip(nodes, where, strict=True))
    busy = 0
    gaps: dict[str, float] = {"routing": 0.0, "expert loop": 0.0, "optimizer": 0.0, "other": 0.0}
    end = spans[0][0]
    for a, b, w in spans:
        if a - end > MIN_GAP_NS:
            gaps[w] += (a - end) / 1e6
        busy += max(0, b - max(a, end))
        end = max(end, b)
    step = measured_step(bundle).time_s * 1e3
    own = measured_own_launch_s(bundle)
    return {"run": bundle.id, "model": bundle.manifest.spec.model, "own_launch_us": None if own is None else own * 1e6,
            "measured_ms": step, "profiled_ms": (end - spans[0][0]) / 1e6, "gpu_ms": busy / 1e6,
            "unprofiled_idle_ms": step - busy / 1e6, **{f"idle {k} ms": v for k, v in gaps.items()}}


def main(argv: list[str]) -> int:
    from calib.bundle.io import load_bundles

    pd.set_option("display.width", 240)
    options = {k: argv[argv.index(k) + 1] for k in ("--json", "--calibration") if k in argv}
    args = [a for i, a in enumerate(argv) if a not in options and a not in options.values()]
    paths = [Path(a) for a in args] or sorted(p for p in (ROOT / "traces" / "h200").glob("mixtral-1gpu*") if p.is_dir())
    out = Path(options["--json"]) if "--json" in options else None
    cal = None
    if "--calibration" in options:
        from calib.calibration import Calibration

        cal = Calibration.load(options["--calibration"])
    rows = [{**idle(b), **(predicted(b, cal) if cal is not None else {})}
            for b in load_bundles(paths) if b.manifest.kind == "training"]
    print(pd.DataFrame(rows).set_index("run").round(1).to_string())
    if out is not None:
        out.write_text(json.dumps({"what": "benchmarks/gpu_idle.py per run: measured (unprofiled) step, the profiled "
                                           "step's GPU time and idle by phase, milliseconds; with a calibration, its "
                                           "generated and replayed steps", "calibration": options.get("--calibration"),
                                  "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
