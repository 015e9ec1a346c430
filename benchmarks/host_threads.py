"""Where a host-paced step's time goes, thread by thread, from measure.probes.host_pace --threads (docs/host.md,
thirty-seventh session).

    python benchmarks/host_threads.py [PROBE_DIR ...] [--thin]   (default: traces/*/_probes/host-threads-*)

The committed probes are kept as their per-step blocks, `blocks.json.xz`, which `--thin` writes into each probe
directory from the raw results (`host-pace.json.xz`, in the repository's history); the raw results are read
instead wherever they are present.

Per probe and configuration, over its blocks of steps:
- how much of a step the trainer's two launching threads (the main thread, which runs the forward and the
  optimizer, and torch's autograd thread, which runs the backward) spent on a CPU, and how well that follows
  the step (r per block); how long any of its threads waited for a CPU; its time in the garbage collector;
- whether the two threads slow together step by step (r per block of their CPU times): they run on two CPUs,
  so a pace shared by the machine moves both, and a pace of one CPU moves one;
- how well the second process's three kinds of fixed work (the small Python loop, a walk over a large heap,
  a gather over 256 MiB) follow the steps while they ran (r per block), and, block against block, how well
  the block's median step follows the median of the sidecar and of the trainer's own samples after each step
  (Python work, launches of tiny CUDA ops).
"""

from __future__ import annotations

import json
import lzma
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIDECAR_WORKS = ("sidecar", "sidecar_heap_us", "sidecar_gather_us")
THIN = "blocks.json.xz"
STEP_ARRAYS = ("step_ms", "main_ms", "autograd_ms", "wait_ms", "gc_ms", "after_python_ms", "after_launch_us")


def load(path: Path) -> dict:
    from calib.compressed import decompress

    return json.loads(decompress(path.read_bytes(), str(path)))


@dataclass(frozen=True)
class Block:
    """One block of a probe's process, step by step (ms), with what its threads and the sidecar did."""

    machine: str
    name: str
    policy: str
    step_ms: np.ndarray
    main_ms: np.ndarray  # the main thread's time on a CPU during each step
    autograd_ms: np.ndarray
    wait_ms: np.ndarray  # every thread's time waiting for a CPU during each step
    gc_ms: np.ndarray
    sidecar_ms: dict[str, np.ndarray]  # each sidecar work's mean over the samples taken during each step
    after_python_ms: np.ndarray  # the trainer's own Python work just after each step
    after_launch_us: np.ndarray  # microseconds per tiny CUDA op, launched just after each step

    @property
    def gpu(self) -> str:
        return self.machine.split("/")[0]

    @property
    def cpu_ms(self) -> np.ndarray:
        return self.main_ms + self.autograd_ms


def r(x: np.ndarray, y: np.ndarray) -> float:
    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.sum() < 3 or np.std(x[ok]) == 0 or np.std(y[ok]) == 0:
        return float("nan")
    return float(np.corrcoef(x[ok], y[ok])[0, 1])


def blocks(result: dict, machine: str) -> list[Block]:
    """The blocks of one process's result, as the probe wrote them with --threads."""
    samples = {work: np.array([v[1] if work == "sidecar" else v for v in result.get(work, [])], dtype=float)
               for work in SIDECAR_WORKS}
    at = np.array([v[0] for v in result.get("sidecar", [])], dtype=float)
    out = []
    for b in result["blocks"]:
        main, names = b["main_tid"], b["thread_names"]
        autograd = {int(t) for t, n in names.items() if n.startswith("pt_autograd")}
        rows = [(sum(x[1] for x in th if x[0] == main), sum(x[1] for x in th if x[0] in autograd),
                 sum(x[2] for x in th)) for th in b["step_threads"]]
        m, a, w = (np.array(c, dtype=float) / 1e6 for c in zip(*rows, strict=True))
        step = np.array(b["step_s"]) * 1e3
        inside = [(at >= t0) & (at < t0 + s * 1e6) for t0, s in zip(b["step_start_ns"], step, strict=True)]
        side = {}
        for work, values in samples.items():
            if len(values) != len(at):  # a probe run before this work was sampled
                side[work] = np.full(len(step), np.nan)
                continue
            good = values > 0  # a sample line the kill cut short reads -1
            side[work] = np.array([values[k & good].mean() / 1e3 if (k & good).any() else np.nan for k in inside])
        out.append(Block(machine, result["name"], b["policy"], step, m, a, w,
                         np.array(b.get("step_gc_ns", [np.nan] * len(step)), dtype=float) / 1e6, side,
                         np.array(b["pace_after_step_us"], dtype=float) / 1e3,
                         np.array(b["launch_after_step_us"], dtype=float)))
    return out


def _to_list(values: np.ndarray) -> list[float | None]:
    # strict JSON has no NaN; null stands for it (a probe run before GC time or a sidecar work was kept)
    return [None if np.isnan(v) else v for v in values.tolist()]


def _from_list(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def thin_blocks(bs: list[Block]) -> dict:
    """The blocks as JSON, every value as computed: Python floats round-trip through JSON exactly."""
    return {"blocks": [{"machine": b.machine, "name": b.name, "policy": b.policy,
                        **{f: _to_list(getattr(b, f)) for f in STEP_ARRAYS},
                        "sidecar_ms": {w: _to_list(v) for w, v in b.sidecar_ms.items()}} for b in bs]}


def thick_blocks(kept: dict) -> list[Block]:
    return [Block(b["machine"], b["name"], b["policy"], **{f: _from_list(b[f]) for f in STEP_ARRAYS},
                  sidecar_ms={w: _from_list(v) for w, v in b["sidecar_ms"].items()}) for b in kept["blocks"]]


def write_thin(probe_dir: Path) -> Path:
    out = probe_dir / THIN
    text = json.dumps(thin_blocks(probe_blocks(probe_dir)), separators=(",", ":"), allow_nan=False)
    out.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    return out


def probe_blocks(probe_dir: Path) -> list[Block]:
    raw = sorted(f for f in probe_dir.glob("*.json.xz") if f.name != THIN)
    if not raw and (probe_dir / THIN).is_file():  # a probe committed as its blocks only
        return thick_blocks(load(probe_dir / THIN))
    machine = f"{probe_dir.parent.parent.name}/{probe_dir.name}"
    return [blk for f in raw for res in load(f)["results"] for blk in blocks(res, machine)]


def _med(values: list[float]) -> str:
    good = [v for v in values if not np.isnan(v)]
    return f"{statistics.median(good):+.2f}" if good else "   -"


def thread_table(bs: list[Block]) -> list[str]:
    """Per machine and configuration: the step, the launching threads' CPU time and how it follows the step,
    waits, GC, whether the threads slow together, and how each sidecar work follows the step (median r per block)."""
    lines = [f"{'probe':22s} {'configuration':13s} {'place':5s} {'blocks':>6s} {'step ms':>13s} {'CPU ms':>7s} {'r(CPU)':>6s} "
             f"{'wait %':>6s} {'GC ms':>5s} {'r(main,autograd)':>16s} {'r(loop)':>7s} {'r(heap)':>7s} {'r(gather)':>9s}"]
    for key in sorted({(b.machine, b.name, b.policy) for b in bs}):
        group = [b for b in bs if (b.machine, b.name, b.policy) == key]
        steps = [float(np.median(b.step_ms)) for b in group]
        wait = 100 * sum(b.wait_ms.sum() for b in group) / sum(b.step_ms.sum() for b in group)
        lines.append(
            f"{key[0]:22s} {key[1]:13s} {key[2]:5s} {len(group):6d} {min(steps):5.1f}-{max(steps):6.1f} "
            f"{statistics.median(float(np.median(b.cpu_ms)) for b in group):7.1f} "
            f"{_med([r(b.step_ms, b.cpu_ms) for b in group]):>6s} {wait:6.2f} "
            f"{statistics.median(float(np.mean(b.gc_ms)) for b in group):5.2f} "
            f"{_med([r(b.main_ms, b.autograd_ms) for b in group]):>16s} "
            + " ".join(f"{_med([r(b.step_ms, b.sidecar_ms[w]) for b in group]):>{n}s}"
                       for w, n in zip(SIDECAR_WORKS, (7, 7, 9), strict=True)))
    return lines


def block_table(bs: list[Block]) -> list[str]:
    """Block against block, per GPU (its probes pooled: each call a fresh machine) and configuration: r of
    the block's median step with the median of each pace seen beside it (the sidecar's loop; the trainer's own
    Python work and launches after each step)."""
    lines = [f"{'GPU':5s} {'configuration':13s} {'blocks':>6s} {'r(sidecar loop)':>15s} "
             f"{'r(own Python)':>13s} {'r(own launches)':>15s}"]
    for key in sorted({(b.gpu, b.name) for b in bs}):
        group = [b for b in bs if (b.gpu, b.name) == key]
        step = np.array([np.median(b.step_ms) for b in group])
        paces = (np.array([np.nanmedian(b.sidecar_ms["sidecar"]) for b in group]),
                 np.array([np.median(b.after_python_ms) for b in group]),
                 np.array([np.median(b.after_launch_us) for b in group]))
        lines.append(f"{key[0]:5s} {key[1]:13s} {len(group):6d} " + " ".join(
            f"{r(step, p):>+{n}.2f}" for p, n in zip(paces, (15, 13, 15), strict=True)))
    return lines


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv if a != "--thin"] or sorted(ROOT.glob("traces/*/_probes/host-threads-*"))
    if "--thin" in argv:
        for d in dirs:
            write_thin(d)
    bs = [b for d in dirs for b in probe_blocks(d)]
    print("Step by step (median over blocks):")
    print("\n".join(thread_table(bs)))
    print("\nBlock against block:")
    print("\n".join(block_table(bs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
