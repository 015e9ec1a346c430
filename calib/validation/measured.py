"""What a training bundle measured: step time, energy per step, and its time breakdown.

The measured step time is the figure every validation error is taken against:
  - only measured, unprofiled steps count (profiled steps carry the profiler's overhead, and the
    warm-up steps are not measured steps);
  - a step lasts as long as its slowest rank (max over ranks of that step's `time_s`);
  - the run's step time is the median over those steps (an occasional step twice as long, seen on
    the H200 hosts, must not move it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calib.bundle.io import Bundle, steps_span_s
from calib.bundle.schema import RunSpec
from calib.chakra.model import ExecutionTrace, NodeType
from calib.errors import CalibError


@dataclass(frozen=True)
class MeasuredStep:
    time_s: float  # median over measured steps of the max over ranks
    steps: int  # how many steps the median rests on
    spread: float  # (p90 - p10) / median of the per-step times: how noisy the run was


def is_real_gpu(bundle: Bundle) -> bool:
    """Only GPU bundles count in an error figure; CPU (gloo) test bundles never do."""
    return (bundle.manifest.gpu.vendor or "").lower() not in ("cpu", "")


def measured_step(bundle: Bundle) -> MeasuredStep:
    """Median over unprofiled measured steps of the per-step maximum over ranks."""
    df = bundle.table("steps")
    rows = df[~df["profiled"].astype(bool)]
    warmup = int(bundle.manifest.steps.warmup or 0)
    # Warm-up steps are normally not written; if a writer did include them (more distinct
    # step ids than measured + profiled steps), drop the first `warmup` ids.
    ids = sorted(rows["step"].unique().tolist())
    expected = int(bundle.manifest.steps.measured or 0)
    if warmup and expected and len(ids) > expected:
        rows = rows[rows["step"].isin(ids[len(ids) - expected:])]
    if rows.empty:
        raise CalibError(f"bundle {bundle.path}: steps.parquet has no measured (unprofiled) steps")
    per_step = rows.groupby("step")["time_s"].max().to_numpy(dtype=float)
    if not np.all(np.isfinite(per_step)) or np.any(per_step <= 0):
        raise CalibError(f"bundle {bundle.path}: steps.parquet has non-positive or non-finite step times")
    median = float(np.median(per_step))
    p10, p90 = np.percentile(per_step, [10, 90])
    return MeasuredStep(time_s=median, steps=len(per_step), spread=float((p90 - p10) / median))


def measured_host_work_s(bundle: Bundle, min_samples: int = 3) -> float | None:
    """Median seconds of the host-pace sampler's fixed work (host_pace.parquet) inside the window of
    the measured, unprofiled steps: how fast the host was while the measured step time was taken
    (larger is slower). None where the bundle has no such table or fewer than `min_samples` samples
    fall in the window."""
    if not bundle.has("host_pace") or not bundle.has("steps"):
        return None
    steps = bundle.table("steps")
    rows = steps[~steps["profiled"].astype(bool)]
    if rows.empty:
        return None
    lo, hi = steps_span_s(rows)
    pace = bundle.table("host_pace")
    work = pace.loc[(pace["t_s"] >= lo) & (pace["t_s"] <= hi), "work_s"].to_numpy(dtype=float)
    return float(np.median(work)) if len(work) >= min_samples else None


def measured_own_launch_s(bundle: Bundle) -> float | None:
    """Seconds per tiny launch the trainer timed in its own main thread just after each measured,
    unprofiled step (steps.parquet's own_launch_s, measure/own_pace.py): each rank's median, then the
    slowest rank's (larger is slower). The ranks of a step wait for each other at its collectives, so a
    host-paced step goes at its slowest launching thread's pace, and two ranks' CPUs can differ by a
    quarter (traces/h100/*-s256-r32). None where the bundle has no such column or no finite value in it."""
    if not bundle.has("steps"):
        return None
    steps = bundle.table("steps")
    if "own_launch_s" not in steps.columns:
        return None
    timed = steps.loc[~steps["profiled"].astype(bool), ["rank", "own_launch_s"]]
    timed = timed[np.isfinite(timed["own_launch_s"].to_numpy(dtype=float))]
    return float(timed.groupby("rank")["own_launch_s"].median().max()) if len(timed) else None


def profiled_span_per_node_s(bundle: Bundle) -> float | None:
    """Seconds of the profiled step's GPU timeline (its converted ETs: the last node's end less the first
    node's start) per converted node, the slowest rank's. Under the profiler a step waits for its host, so this
    is the launching host's time per launch under the profiler (calib.models.profiled_pace). None where the
    bundle has no converted ETs."""
    files = bundle.et_files()
    if not files:
        return None
    return max(_span_per_node_s(str(f), *_stamp(f)) for f in files)


def _stamp(path: Path) -> tuple[int, int]:
    """A file's modification time and size, from one stat: what `_span_per_node_s` is cached by."""
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=4096)
def _span_per_node_s(path: str, mtime_ns: int, size: int) -> float:
    """One ET's span per node (cached by path, time and size: a validation asks for every run's in each of its
    held-out fits)."""
    from calib.chakra.codec import read_et

    nodes = read_et(path).nodes
    if not nodes:
        raise CalibError(f"{path}: an execution trace without nodes has no profiled span")
    start = min(n.start_time_micros for n in nodes)
    end = max(n.start_time_micros + n.duration_micros for n in nodes)
    return (end - start) * 1e-6 / len(nodes)


def profiled_clock_ratio(bundle: Bundle, min_samples: int = 3) -> float:
    """The SM clock during the profiled step over the SM clock during the measured steps (per GPU the
    median telemetry sample of each window, then the median over GPUs); 1.0 where the telemetry
    cannot say (none recorded, no SM clock, fewer than `min_samples` samples in a window).

    The profiler slows the host, the GPU idles more and stays under its power cap, so a power-capped
    run's profiled kernels run at a higher clock (up to 11 % on the H200 runs) than the same kernels
    in its unprofiled steps, whose time is the measured step."""
    ratio = measured_clock_ratio(bundle, min_samples)
    return 1.0 if ratio is None else ratio


def measured_clock_ratio(bundle: Bundle, min_samples: int = 3) -> float | None:
    """profiled_clock_ratio, or None where the telemetry cannot say (computed once per bundle)."""
    def ratio() -> float | None:
        pairs = _window_clocks(bundle, min_samples)
        return float(np.median([p / m for p, m in pairs])) if pairs else None

    return bundle.derived(("measured_clock_ratio", min_samples), ratio)


def profiled_clock_hz(bundle: Bundle, min_samples: int = 3) -> float | None:
    """The SM clock (Hz) the profiled step's kernels ran at: per GPU the median telemetry sample of the profiled
    window, then the median over GPUs; None where the telemetry cannot say (as measured_clock_ratio)."""
    pairs = _window_clocks(bundle, min_samples)
    return float(np.median([p for p, _ in pairs])) if pairs else None


def measured_clock_hz(bundle: Bundle, min_samples: int = 3) -> float | None:
    """The SM clock (Hz) of the measured, unprofiled steps, as profiled_clock_hz takes the profiled step's."""
    pairs = _window_clocks(bundle, min_samples)
    return float(np.median([m for _, m in pairs])) if pairs else None


def _window_clocks(bundle: Bundle, min_samples: int) -> list[tuple[float, float]]:
    """Per GPU whose telemetry has `min_samples` SM clock samples in both windows: (median clock of the profiled
    steps' window, of the measured steps' window), in Hz. Computed once per bundle."""
    return bundle.derived(("window_clocks", min_samples), lambda: _read_window_clocks(bundle, min_samples))


def _read_window_clocks(bundle: Bundle, min_samples: int) -> list[tuple[float, float]]:
    if not bundle.has("telemetry"):
        return []
    tel = bundle.table("telemetry")
    steps = bundle.table("steps")
    if tel.empty or "sm_clock_hz" not in tel.columns or steps.empty:
        return []
    prof = steps["profiled"].astype(bool)
    if not prof.any() or prof.all():
        return []
    windows = [steps_span_s(steps[prof]), steps_span_s(steps[~prof])]
    pairs = []
    for _, g in tel.groupby("gpu"):
        clock = []
        for lo, hi in windows:
            w = g.loc[(g["t_s"] >= lo) & (g["t_s"] <= hi), "sm_clock_hz"].to_numpy(dtype=float)
            w = w[np.isfinite(w) & (w > 0)]
            clock.append(float(np.median(w)) if len(w) >= min_samples else float("nan"))
        if all(np.isfinite(clock)):
            pairs.append((clock[0], clock[1]))
    return pairs


def measured_energy_per_step_j(bundle: Bundle) -> float | None:
    """Energy of one step summed over the run's GPUs, from the energy counters over the measured steps.

    The counter is read at the first and last telemetry sample inside the window spanned by the
    measured, unprofiled steps, divided by the time between them and multiplied by the median step
    time (a 20 Hz sample cannot resolve one step; many steps can). None when the bundle has no
    telemetry or its clock does not overlap the steps'.
    """
    if not bundle.has("telemetry") or not bundle.has("steps"):
        return None
    tel = bundle.table("telemetry")
    steps = bundle.table("steps")
    rows = steps[~steps["profiled"].astype(bool)]
    if tel.empty or rows.empty or tel["energy_j"].isna().all():
        return None
    t0, t1 = steps_span_s(rows)
    step_s = measured_step(bundle).time_s
    total_w = 0.0
    for _, g in tel.groupby("gpu"):
        w = g[(g["t_s"] >= t0) & (g["t_s"] <= t1)].sort_values("t_s")
        if len(w) < 2:
            return None
        dt = float(w["t_s"].iloc[-1] - w["t_s"].iloc[0])
        de = float(w["energy_j"].iloc[-1] - w["energy_j"].iloc[0])
        if dt <= 0 or de < 0:
            return None
        total_w += de / dt
    return total_w * step_s


def parallelism_type(spec: RunSpec) -> str:
    """A label for grouping errors: the parallel dimensions used, e.g. "TP+DP", or "single"."""
    parts = [name for name, n in (("TP", spec.tp), ("PP", spec.pp), ("DP", spec.dp)) if n > 1]
    if spec.ep > 1:
        parts.append("EP")
    return "+".join(parts) or "single"


def model_name(spec: RunSpec) -> str:
    m = spec.model
    return m if isinstance(m, str) else str((m or {}).get("name", "?"))


def et_breakdown_s(traces: dict[int, ExecutionTrace]) -> dict[str, float]:
    """Measured busy time per category, mean over ranks, read off the converted ETs.

    Compute = GPU kernels as measured; a communication category (tp/pp/dp/ep/comm) = the transfer
    part of its collectives (attr transfer_ns; the duration when absent); "wait" = the measured
    time collectives spent waiting for their slowest peer. CPU ops are left out (inflated by the
    profiler).
    """
    if not traces:
        return {}
    acc: dict[str, float] = {}
    for trace in traces.values():
        for n in trace.nodes:
            if n.type == NodeType.METADATA_NODE or n.is_cpu_op:
                continue
            if n.type == NodeType.COMP_NODE:
                cat = str(n.attr("category") or "compute")
                if cat in ("cpu",):
                    continue
                cat = "compute" if cat not in ("memcpy", "memset") else cat
                acc[cat] = acc.get(cat, 0.0) + n.duration_ns * 1e-9
            else:
                cat = str(n.attr("category") or ("pp" if n.type != NodeType.COMM_COLL_NODE else "comm"))
                transfer = n.attr("transfer_ns")
                acc[cat] = acc.get(cat, 0.0) + (int(transfer) if transfer is not None else n.duration_ns) * 1e-9
                wait = n.attr("wait_ns")
                if wait is not None:
                    acc["wait"] = acc.get("wait", 0.0) + int(wait) * 1e-9
    return {k: v / len(traces) for k, v in sorted(acc.items())}
