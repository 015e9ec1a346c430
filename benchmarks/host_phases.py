"""Host time per launch by phase, from measure.probes.host_phases' results (docs/host.md, fifteenth session).

    python benchmarks/host_phases.py [RESULT_DIR ...]   (default: traces/*/_probes/host-phases-*)
    python benchmarks/host_phases.py RESULT_DIR --summary-out RESULT_DIR/summary.json.xz

Per probed configuration (one or two GPUs; rank 0's host): the median over the timed steps of the host's time in all
micro-batches' forwards and backwards (megatron-core's schedule functions, host timestamps, no device
syncs), the launches the profiled step made inside them, and their ratio; the optimizer's host time
and where the host finished the step against the measured (synchronised) step. `--modules` adds the
exclusive host time and launches of each instrumented module and stage. `--gpu` adds, for runs with GPU-stamped
steps (the probe's events at every span boundary, from the fortieth session), what the GPU idled in each phase
of an unprofiled step: the span's GPU interval less the GPU time of the kernels launched in it (the profiled
step's), medians over the steps.
"""

from __future__ import annotations

import json
import lzma
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
# A round committed as its summary (written by --summary-out): xz, as the tree travels with every device call under
# 64 MiB (tests/test_tree_size.py); the fiftieth session compressed the committed ones, 235 -> 39 kB.
SUMMARY = "summary.json.xz"


def load(path: Path) -> dict:
    from calib.compressed import decompress

    return json.loads(decompress(path.read_bytes(), str(path)))


def load_round(d: Path) -> tuple[list[dict], dict | None]:
    """A probe round's results, and where none are committed its summary's runs (`summary`; None without one)."""
    runs = [load(f) for f in sorted(d.glob("*.json*")) if not f.name.startswith("summary.json")]
    if not runs and (d / SUMMARY).is_file():  # a round committed as its summary only
        return [], load(d / SUMMARY)["runs"]
    return runs, None


def _by_step(spans: list) -> dict[int, list[tuple[str, int, int]]]:
    out: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for label, step, start, end in spans:
        out[step].append((label, start, end))
    return out


def summed_under(profiled: list[dict], label: str, key: str) -> float:
    """`key` ("launches", "gpu_us") summed over the profiled step's ranges inside every outermost range named
    `label`, the ranges nested in it included (a range inside one of the same label, as a chained optimizer's
    own stages are, counts once)."""
    total = 0.0
    end = -1.0
    for top in sorted((p for p in profiled if p["label"] == label), key=lambda p: (p["start_us"], -p["dur_us"])):
        lo, hi = top["start_us"], top["start_us"] + top["dur_us"]
        if lo < end:
            continue
        end = hi
        total += sum(p[key] for p in profiled if lo <= p["start_us"] <= hi)
    return total


def launches_under(profiled: list[dict], label: str) -> int:
    """Launches of the profiled step inside every range named `label`, nested ranges included."""
    return int(summed_under(profiled, label, "launches"))


def phases(run: dict) -> dict:
    """One configuration's forward / backward host time and launches per step, and its optimizer."""
    fwd, bwd, opt, end = [], [], [], []
    for rows in _by_step(run["spans"]).values():
        start = min(a for label, a, _ in rows if label == "step")
        fwd.append(sum(b - a for label, a, b in rows if label == "forward") / 1e6)
        bwd.append(sum(b - a for label, a, b in rows if label == "backward") / 1e6)
        opt.append(max(b - a for label, a, b in rows if label == "optimizer") / 1e6)
        end.append((max(b for label, _, b in rows if label == "step") - start) / 1e6)
    f_n = launches_under(run["profiled_spans"], "forward")
    b_n = launches_under(run["profiled_spans"], "backward")
    f_ms, b_ms = float(pd.Series(fwd).median()), float(pd.Series(bwd).median())
    return {
        "run": run["name"], "microbatches": run["microbatches"],
        "step_ms": float(pd.Series(run["plain_step_s"]).median()) * 1e3,
        "forward_ms": f_ms, "forward_launches": f_n, "forward_us_per_launch": f_ms * 1e3 / f_n,
        "backward_ms": b_ms, "backward_launches": b_n, "backward_us_per_launch": b_ms * 1e3 / b_n,
        "optimizer_ms": float(pd.Series(opt).median()), "host_done_ms": float(pd.Series(end).median()),
        # the first probe round did not record the GPU's kernels
        "gpu_busy_ms": sum(d for _, d in run["device_busy"]) / 1e3 if "device_busy" in run else float("nan"),
    }


def modules(run: dict) -> pd.DataFrame:
    """Exclusive host ms per step (median) and profiled launches per step of each instrumented span."""
    per: dict[str, list[float]] = defaultdict(list)
    for rows in _by_step(run["spans"]).values():
        own: dict[str, float] = defaultdict(float)
        stack: list[tuple[str, int]] = []
        for label, a, b in sorted(rows, key=lambda r: (r[1], r[1] - r[2])):
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack:
                own[stack[-1][0]] -= b - a
            own[label] += b - a
            stack.append((label, b))
        for label, ns in own.items():
            per[label].append(ns / 1e6)
    launches: dict[str, int] = defaultdict(int)
    for p in run["profiled_spans"]:
        launches[p["label"]] += p["launches"]
    out = pd.DataFrame({"host_ms": {k: float(pd.Series(v).median()) for k, v in per.items()}})
    out["launches"] = [launches.get(k, 0) for k in out.index]
    out["us_per_launch"] = out.host_ms * 1e3 / out.launches.where(out.launches > 0)
    return out.sort_values("host_ms", ascending=False)


GPU_PHASES = ("step", "zero_grads", "forward", "backward", "finalize_grads", "optimizer", "self_attention", "moe",
              "moe.route", "moe.preprocess", "moe.dispatch", "moe.routed_experts_compute", "moe.combine",
              "moe.postprocess", "optimizer.get_grad_norm", "optimizer.step_with_ready_grads")


def gpu_under(profiled: list[dict], label: str) -> float:
    """GPU ms of the profiled step's kernels launched inside every range named `label` (`summed_under`)."""
    return summed_under(profiled, label, "gpu_us") / 1e3


def gpu_idle(run: dict) -> pd.DataFrame:
    """Per phase of a GPU-stamped run: its GPU interval per step (ms, median over the steps: the sum over the phase's
    outermost spans of GPU end - GPU start), the GPU time of its kernels (the profiled step's), and their
    difference, the idle; the step's row has the whole device's kernel time."""
    per: dict[str, list[float]] = defaultdict(list)
    steps: dict[int, list[list]] = defaultdict(list)
    for r in run["gpu_spans"]:
        steps[r[1]].append(r)
    for rows in steps.values():
        spent: dict[str, float] = defaultdict(float)
        outer: dict[str, float] = {}  # per label, the host end of its last outermost span
        for label, _, host_a, host_b, a, b in sorted(rows, key=lambda r: (r[2], -r[3])):
            if host_a < outer.get(label, -1):  # inside a span of the same label (a chained optimizer's own stages)
                continue
            outer[label] = host_b
            spent[label] += (b - a) / 1e3
        for label in GPU_PHASES:
            if label in spent:
                per[label].append(spent[label])
    busy = {label: gpu_under(run["profiled_spans"], label) for label in per}
    busy["step"] = sum(d for _, d in run["device_busy"]) / 1e3
    out = pd.DataFrame({"gpu_interval_ms": {k: float(pd.Series(v).median()) for k, v in per.items()},
                        "kernels_ms": busy})
    out["idle_ms"] = out.gpu_interval_ms - out.kernels_ms
    return out.loc[[p for p in GPU_PHASES if p in out.index]]


def summary(runs: list[dict]) -> dict:
    """What the reader prints, per run, as JSON: where a round's full results are not committed (host-phases-12 on,
    and rounds 1-10 since the forty-second session). Every run keeps its phases and modules tables; a GPU-stamped
    run also its `--gpu` table."""
    out = {}
    for r in runs:
        kept: dict = {"phases": phases(r), "modules": modules(r).to_dict(orient="index")}
        if r.get("gpu_spans"):
            kept["gpu_stamped_step_ms"] = float(pd.Series(r["gpu_stamped_step_s"]).median()) * 1e3
            kept["gpu_idle"] = gpu_idle(r).to_dict(orient="index")
        out[r["name"]] = kept
    return {"what": "benchmarks/host_phases.py per run (ms): the phases table, the modules table (--modules) and, for "
                    "GPU-stamped runs, the idle per phase (--gpu)", "runs": out}


def _print_gpu(name: str, stamped_ms: float, plain_ms: float, table: pd.DataFrame) -> None:
    print(f"\n{name}: GPU-stamped step {stamped_ms:.1f} ms (plain {plain_ms:.1f})\n{table.round(2).to_string()}")


def main(argv: list[str]) -> int:
    show_modules = "--modules" in argv
    show_gpu = "--gpu" in argv
    out = Path(argv[argv.index("--summary-out") + 1]) if "--summary-out" in argv else None
    args = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--summary-out")]
    dirs = [Path(a) for a in args] or sorted((ROOT / "traces").glob("*/_probes/host-phases-*"))
    pd.set_option("display.width", 200)
    for d in dirs:
        runs, kept = load_round(d)
        print(f"\n{d.parent.parent.name}/{d.name}")
        if kept is not None:
            print(pd.DataFrame([v["phases"] for v in kept.values()]).set_index("run").round(1).to_string())
            if show_modules:
                for name, v in ((n, v) for n, v in kept.items() if "modules" in v):  # rounds 12-14 kept none
                    print(f"\n{name}\n{pd.DataFrame.from_dict(v['modules'], orient='index').round(1).to_string()}")
            if show_gpu:
                for name, v in ((n, v) for n, v in kept.items() if "gpu_idle" in v):
                    _print_gpu(name, v["gpu_stamped_step_ms"], v["phases"]["step_ms"],
                               pd.DataFrame.from_dict(v["gpu_idle"], orient="index"))
            continue
        print(pd.DataFrame([phases(r) for r in runs]).set_index("run").round(1).to_string())
        if show_modules:
            for r in runs:
                print(f"\n{r['name']}\n{modules(r).round(1).to_string()}")
        if show_gpu:
            for r in (r for r in runs if r.get("gpu_spans")):
                _print_gpu(r["name"], float(pd.Series(r["gpu_stamped_step_s"]).median()) * 1e3,
                           float(pd.Series(r["plain_step_s"]).median()) * 1e3, gpu_idle(r))
        if out is not None:
            out.write_bytes(lzma.compress(json.dumps(summary(runs), indent=1).encode(), preset=9 | lzma.PRESET_EXTREME))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
