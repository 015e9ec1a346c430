"""What moves a host-paced step between runs, from measure.probes.host_pace's results (docs/host.md,
thirty-third session).

    python benchmarks/host_pace_probe.py [PROBE_DIR ...]   (default: traces/*/_probes/host-pace-*)

Per configuration and CPU placement (`free`: every CPU, as `calib measure` runs; `pin2`: two CPUs): the
range of the blocks' median steps; the fixed pure-Python work timed before each block (its fast and slow
modes); the machine's steal time and the process's involuntary context switches over the blocks; and,
where the pace was sampled after every step (`per-step`), the correlation of a step's time with the
pace sampled just before it, per block (median and range) and pooled; where a second process sampled the
same work all along (`sidecar`), the correlation of each step with the samples taken while it ran.

    python benchmarks/host_pace_probe.py --thin PROBE_DIR ...

rewrites each results file with its second process's samples replaced by what the tables read of them, each step's
mean sample (`sidecar_step_ms` per block; the samples were 97 % of traces/h100/_probes/host-pace-1's sidecar.json.xz,
and the travelling tree's room is what a new round of bundles needs). The tables are the same either way.
"""

from __future__ import annotations

import json
import lzma
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path) -> dict:
    from calib.compressed import decompress

    return json.loads(decompress(path.read_bytes(), str(path)))


def blocks(results: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        for b in r["blocks"]:
            out.setdefault((r["name"], b["policy"]), []).append(b)
    return out


def placement_table(results: list[dict]) -> list[str]:
    lines = [f"{'configuration':14s} {'placement':9s} {'blocks':>6s} {'median step, ms':>18s} "
             f"{'python work, ms':>16s} {'slow blocks':>11s} {'steal %':>8s} {'invol. switches':>15s}"]
    for (name, policy), bs in sorted(blocks(results).items()):
        steps = [1e3 * statistics.median(b["step_s"]) for b in bs]
        py = [b["python_pace_us"] / 1e3 for b in bs]
        fast = min(py)
        slow = sum(p > 1.5 * fast for p in py)
        ticks = {k: sum(b["cpu_ticks"][k] for b in bs) for k in bs[0]["cpu_ticks"]}
        steal = 100 * ticks["steal"] / max(1, sum(ticks.values()))
        invol = statistics.median(b["ctx_switches"]["involuntary"] for b in bs)
        lines.append(f"{name:14s} {policy:9s} {len(bs):6d} {min(steps):8.1f} - {max(steps):6.1f} "
                     f"{min(py):7.1f} - {max(py):5.1f} {slow:6d} of {len(bs):<2d} {steal:8.3f} {invol:15.0f}")
    return lines


def correlation_table(pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]], pace: str) -> list[str]:
    """Per configuration: its steps (ms) against the pace beside each (ms), block by block: the range of
    each, the correlation per block (median and range) and pooled."""
    lines = [f"{'configuration':14s} {'steps':>5s} {'step, ms':>14s} {pace:>19s} "
             f"{'r per block (median, range)':>28s} {'r pooled':>8s}"]
    for name, blocks_ in sorted(pairs.items()):
        rs = [float(np.corrcoef(y, x)[0, 1]) for y, x in blocks_]
        y, x = np.concatenate([p[0] for p in blocks_]), np.concatenate([p[1] for p in blocks_])
        lines.append(f"{name:14s} {len(y):5d} {y.min():6.0f} - {y.max():5.0f} {x.min():8.2f} - {x.max():6.2f} "
                     f"{statistics.median(rs):+10.2f} ({min(rs):+.2f} to {max(rs):+.2f}) {np.corrcoef(x, y)[0, 1]:+8.2f}")
    return lines


def per_step_table(results: list[dict]) -> list[str]:
    """Each step against the trainer's own pace sample taken just before it (after the step before)."""
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for r in results:
        for b in r["blocks"]:
            if b.get("pace_after_step_us"):
                pairs.setdefault(r["name"], []).append(
                    (np.array(b["step_s"][1:]) * 1e3, np.array(b["pace_after_step_us"][:-1]) / 1e3))
    return correlation_table(pairs, "pace sample, ms")


def sampled(result: dict) -> bool:
    """Whether a second process sampled beside this one (its samples kept, or thinned to `sidecar_step_ms`)."""
    return bool(result.get("sidecar")) or any("sidecar_step_ms" in b for b in result["blocks"])


def sidecar_steps(result: dict) -> list[np.ndarray]:
    """Per block, each step's mean of the second process's samples taken while it ran (ms, same clock; NaN where
    none was)."""
    if not result.get("sidecar"):
        return [np.array([math.nan if v is None else v for v in b["sidecar_step_ms"]], dtype=float)
                for b in result["blocks"]]
    samples = np.array(result["sidecar"], dtype=float)
    at, took = samples[:, 0], samples[:, 1] / 1e3
    out = []
    for b in result["blocks"]:
        step = np.array(b["step_s"])
        inside = [(at >= t0) & (at < t0 + s * 1e9) for t0, s in zip(b["step_start_ns"], step, strict=True)]
        out.append(np.array([took[m].mean() if m.any() else np.nan for m in inside]))
    return out


def sidecar_table(results: list[dict]) -> list[str]:
    """Each step against the mean of the second process's samples taken while it ran (same clock)."""
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for r in results:
        if not sampled(r):
            continue
        for b, during in zip(r["blocks"], sidecar_steps(r), strict=True):
            step = np.array(b["step_s"])
            ok = ~np.isnan(during)
            pairs.setdefault(r["name"], []).append((1e3 * step[ok], during[ok]))
    return correlation_table(pairs, "sidecar sample, ms")


def thin(path: Path) -> None:
    """Rewrite a results file with each sampled process's samples replaced by their per-step means (module
    docstring); a file without samples is left as it is."""
    data = load(path)
    if not any(r.get("sidecar") for r in data["results"]):
        return
    for r in data["results"]:
        if r.get("sidecar"):
            for b, during in zip(r["blocks"], sidecar_steps(r), strict=True):
                b["sidecar_step_ms"] = [None if math.isnan(v) else float(v) for v in during]
            del r["sidecar"]
    path.write_bytes(lzma.compress(json.dumps(data).encode(), preset=9 | lzma.PRESET_EXTREME))


def sidecar_cost(results: list[dict]) -> list[str]:
    """Block medians of the processes that ran beside the second process against those that did not (the
    same machine, trials alternating): what sampling costs the step it samples."""
    lines = [f"{'configuration':14s} {'blocks without / with':>22s} {'median of block medians, ms':>30s}"]
    for name in sorted({r["name"] for r in results}):
        without = [1e3 * statistics.median(b["step_s"]) for r in results if r["name"] == name and not sampled(r)
                   for b in r["blocks"]]
        with_ = [1e3 * statistics.median(b["step_s"]) for r in results if r["name"] == name and sampled(r)
                 for b in r["blocks"]]
        if without and with_:
            lines.append(f"{name:14s} {len(without):10d} / {len(with_):<9d} {statistics.median(without):14.1f} / "
                         f"{statistics.median(with_):.1f}")
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["--thin"]:
        for d in argv[1:]:
            for f in sorted(Path(d).glob("*.json.xz")):
                thin(f)
        return 0
    dirs = [Path(a) for a in argv] or sorted(ROOT.glob("traces/*/_probes/host-pace-*"))
    for d in dirs:
        print(f"== {d.relative_to(ROOT) if d.is_relative_to(ROOT) else d}")
        for f in sorted(d.glob("*.json*")):
            results = load(f)["results"]
            print(f"-- {f.name}: {len(results)} processes")
            print("\n".join(placement_table(results)))
            if any(b.get("pace_after_step_us") for r in results for b in r["blocks"]):
                print("\n".join(per_step_table(results)))
            if any(sampled(r) for r in results):
                print("\n".join(sidecar_table(results)))
                if not all(sampled(r) for r in results):
                    print("\n".join(sidecar_cost(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
