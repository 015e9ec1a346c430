"""Per-GPU power as a function of what the GPU does, from energy counters over many steps.

    power_w = sum_c  p_c * share_c  +  e_flop * flops_per_s,   c in (compute, memory, comm, idle),
                                                              sum_c share_c = 1

share_c is the fraction of a profiled step's wall time in which the GPU ran a kernel of that
activity (exclusive, by priority compute > memory > comm; idle = no kernel); flops_per_s is the
GEMM and attention work of the step (calib.ops FLOPs) over the step time. A GEMM that keeps the
tensor cores busy draws more than a small one that does not fill them for the same time: the
compute share alone over-predicted the host-bound runs (small kernels) and under-predicted the
GEMM-heavy ones (leave-one-configuration-out energy per step, H200 4.58 -> 2.42 %, H100 7.24 ->
2.62 %; benchmarks/power_terms.py). The byte rate of memory-bound kernels, tried beside it, fits to
zero. Freeing the activity powers from the limit does about as well on these runs (2.46 / 2.44 %) by
giving compute time 940-990 W, above the limit that holds the average; the FLOP term keeps every
activity under it and charges a GEMM for the work it does rather than for its duration. p_c in [0, power
limit] and e_flop >= 0 are fitted by bounded least squares in relative error across runs and GPUs
on the mean power that the cumulative energy counter gives over the measured-step window (a
20 Hz power sample cannot resolve one step, the counter difference over many steps can). Idle
readings (samples with the idle clock reason or zero utilization outside the window) add points
with share_idle = 1. The step's power is capped at the limit.

Also kept: peak power (largest instantaneous reading in any window) and clock throttling (mean SM
clock under load vs the configured maximum, and how often each NVML clock-event reason was set).
Kernel times measured under the same clocks already include that slowdown; `throttle_factor` is
for a projection that wants to state it or to apply it to unthrottled rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calib.bundle.io import steps_span_s
from calib.errors import CalibError
from calib.models.kernel import op_instances
from calib.ops import FLOP_CLASSES, is_split_k_reduce

ACTIVITIES = ("compute", "memory", "comm", "idle")
COMM_CLASSES = {"comm", "communication", "collective", "nccl"}
# NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*).
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# NVML's energy counter moves in steps (about every 100 ms on H200): shorter windows than this
# leave the update granularity visible in the energy, so such a run gives no power point.
MIN_WINDOW_S = 0.5
PFLOP = 1e15


def activity_of(op_class: str, name: str) -> str:
    c = str(op_class or "").lower()
    if c in COMM_CLASSES or str(name).startswith("nccl"):
        return "comm"
    if c in FLOP_CLASSES:
        return "compute"
    return "memory"


def exclusive_shares(starts: np.ndarray, ends: np.ndarray, acts: list[str], span_s: float) -> dict[str, float]:
    """Fractions of span_s covered by each activity, overlaps resolved compute > memory > comm."""
    prio = {"compute": 0, "memory": 1, "comm": 2}
    covered = dict.fromkeys(ACTIVITIES, 0.0)
    if len(starts):
        edges = np.unique(np.concatenate([starts, ends]))
        active = np.zeros((len(edges) - 1, 3), dtype=bool)
        for s, e, a in zip(starts, ends, acts, strict=True):
            i0, i1 = np.searchsorted(edges, [s, e])
            active[i0:i1, prio[a]] = True
        widths = np.diff(edges)
        taken = np.zeros(len(widths), dtype=bool)
        for a, j in prio.items():
            sel = active[:, j] & ~taken
            covered[a] = float(widths[sel].sum())
            taken |= sel
    busy = sum(covered[a] for a in ("compute", "memory", "comm"))
    if busy > span_s > 0:  # kernels spilling past the step's end: scale to the step
        for a in ("compute", "memory", "comm"):
            covered[a] *= span_s / busy
        busy = span_s
    covered["idle"] = max(span_s - busy, 0.0)
    total = sum(covered.values())
    return {a: (covered[a] / total if total > 0 else 0.0) for a in ACTIVITIES}


@dataclass
class PowerPoint:
    """One GPU of one run: mean power over the measured-step window and its activity shares."""

    bundle: str
    config: str
    gpu: int
    shares: dict[str, float]
    mean_power_w: float
    energy_per_step_j: float
    step_time_s: float
    steps: int
    window_s: float
    peak_power_w: float
    sm_clock_load_hz: float
    reasons: dict[str, float] = field(default_factory=dict)
    flops_per_s: float = 0.0  # GEMM and attention FLOPs of a profiled step over the measured step time


def _measured_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The timed, unprofiled steps (steps.parquet holds no warm-up rows; profiled ones run slower)."""
    plain = steps[~steps["profiled"].astype(bool)]
    return plain if not plain.empty else steps


def power_points(bundle, gpu_count: int | None = None) -> tuple[list[PowerPoint], list[float], str]:
    """Points of one training bundle with telemetry, idle power readings, and why there are no
    points when the bundle has telemetry but cannot give any ("" otherwise). Computed once per bundle
    (Bundle.derived): not to be changed by the caller."""
    return bundle.derived(("power_points", gpu_count), lambda: _power_points(bundle, gpu_count))


def _power_points(bundle, gpu_count: int | None) -> tuple[list[PowerPoint], list[float], str]:
    m = bundle.manifest
    if m.kind != "training" or not bundle.has("telemetry") or not bundle.has("kernels"):
        return [], [], ""
    tel = bundle.table("telemetry")
    if tel.empty:
        return [], [], ""
    all_steps = bundle.table("steps")
    steps = _measured_steps(all_steps)
    profiled = _profiled_steps(bundle)
    by_rank = _by_rank(bundle.table("kernels"))
    win0, win1 = steps_span_s(steps)
    n_steps = int(steps["step"].nunique())
    if win1 - win0 < MIN_WINDOW_S:
        return [], [], (f"{bundle.id}: measured steps last {win1 - win0:.3f} s, under the {MIN_WINDOW_S} s "
                        "the energy counter's update steps need")
    ranks_per_gpu = _rank_to_gpu(bundle, gpu_count)
    coll = _collectives(bundle)
    points: list[PowerPoint] = []
    idle: list[float] = []
    for gpu, g in tel.sort_values("t_s").groupby("gpu"):
        t = g["t_s"].to_numpy(float)
        e = g["energy_j"].to_numpy(float)
        if t[0] > win0 or t[-1] < win1:
            raise CalibError(
                f"bundle {bundle.path}: telemetry of GPU {gpu} covers {t[0]:.3f}-{t[-1]:.3f} s but the "
                f"measured steps run {win0:.3f}-{win1:.3f} s (same clock expected)"
            )
        # Interpolate between the samples at which the counter changed (its update instants).
        moved = np.concatenate([[True], np.diff(e) != 0])
        e0, e1 = np.interp([win0, win1], t[moved], e[moved])
        if not e1 > e0:
            raise CalibError(f"bundle {bundle.path}: energy counter of GPU {gpu} did not increase over the steps")
        inside = (t >= win0) & (t <= win1)
        inst = g["power_instant_w"].to_numpy(float) if "power_instant_w" in g else g["power_w"].to_numpy(float)
        inst = np.where(np.isfinite(inst), inst, g["power_w"].to_numpy(float))
        peak = float(np.nanmax(inst[inside])) if inside.any() else float("nan")
        clock = g["sm_clock_hz"].to_numpy(float) if "sm_clock_hz" in g else np.full(len(g), np.nan)
        util = g["util_gpu"].to_numpy(float) if "util_gpu" in g else np.full(len(g), np.nan)
        loaded = inside & (np.nan_to_num(util, nan=100.0) > 0)
        sm_load = float(np.nanmean(clock[loaded])) if loaded.any() and np.isfinite(clock[loaded]).any() else float("nan")
        reasons = _reason_fractions(g, loaded)
        rsn = pd.to_numeric(g["clock_event_reasons"], errors="coerce").fillna(0).astype(np.int64).to_numpy() \
            if "clock_event_reasons" in g else np.zeros(len(g), dtype=np.int64)
        idle_mask = ~((t >= win0 - 1.0) & (t <= win1 + 1.0)) & (((rsn & 0x1) != 0) | (util == 0))
        idle.extend(g["power_w"].to_numpy(float)[idle_mask].tolist())
        ranks = ranks_per_gpu.get(int(gpu), [])
        if not ranks:
            continue
        shares = _shares_for_ranks(by_rank, all_steps, ranks, profiled, coll)
        if shares is None:
            continue
        window = win1 - win0
        points.append(PowerPoint(
            bundle.id, m.spec.key() if m.spec else bundle.id, int(gpu), shares, float((e1 - e0) / window),
            float((e1 - e0) / n_steps), window / n_steps, n_steps, window, peak, sm_load, reasons,
            _flop_rate_for_ranks(by_rank, all_steps, ranks, profiled),
        ))
    return points, idle, ""


def measured_shares(bundle) -> dict[str, float] | None:
    """Activity shares of a training bundle's profiled steps over its measured step time, the mean over
    all its ranks (`_shares_for_ranks`; telemetry not needed); None without kernels. Computed once per
    bundle (Bundle.derived): not to be changed by the caller."""
    return bundle.derived("measured_shares", lambda: _measured_shares(bundle))


def _measured_shares(bundle) -> dict[str, float] | None:
    if not bundle.has("kernels") or not bundle.has("steps"):
        return None
    kernels, steps = bundle.table("kernels"), bundle.table("steps")
    if kernels.empty:
        return None
    by_rank = _by_rank(kernels)
    return _shares_for_ranks(by_rank, steps, sorted(by_rank), _profiled_steps(bundle), _collectives(bundle))


def _profiled_steps(bundle) -> set:
    """The profiled steps' ids: the manifest's list, else the steps table's `profiled` rows."""
    steps = bundle.table("steps")
    return set(bundle.manifest.steps.profiled) or set(steps.loc[steps["profiled"].astype(bool), "step"])


def _collectives(bundle) -> pd.DataFrame | None:
    return bundle.table("collectives") if bundle.has("collectives") else None


def _rank_to_gpu(bundle, gpu_count: int | None) -> dict[int, list[int]]:
    """Ranks on each GPU as telemetry numbers it. The manifest's notes.physical_gpus lists the
    device each local rank used (telemetry's `gpu`); without it, rank r runs on GPU r mod the
    GPUs per host, as torchrun places them."""
    m = bundle.manifest
    world = m.spec.tp * m.spec.pp * m.spec.dp if m.spec else 1
    phys = list((m.notes or {}).get("physical_gpus") or [])
    per_host = len(phys) or gpu_count or m.gpu.count or world
    out: dict[int, list[int]] = {}
    for r in range(min(world, per_host)):
        local = r % per_host
        out.setdefault(int(phys[local]) if phys else local, []).append(r)
    return out


def _reason_fractions(g: pd.DataFrame, loaded: np.ndarray) -> dict[str, float]:
    if "clock_event_reasons" not in g or not loaded.any():
        return {}
    codes = pd.to_numeric(g["clock_event_reasons"], errors="coerce").to_numpy(float)[loaded]
    codes = codes[np.isfinite(codes)].astype(np.int64)
    if codes.size == 0:
        return {}
    out = {}
    for bit, name in CLOCK_REASONS.items():
        frac = float(np.mean((codes & bit) != 0))
        if frac > 0:
            out[name] = round(frac, 4)
    return out


def _by_rank(kernels: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """The kernel table split by rank, once per bundle (shares and FLOP rates read it rank by rank)."""
    return {int(r): k for r, k in kernels.groupby("rank", sort=True)}


def _shares_for_ranks(by_rank: dict[int, pd.DataFrame], steps: pd.DataFrame, ranks: list[int], profiled: set,
                      collectives: pd.DataFrame | None = None) -> dict | None:
    """Mean activity shares of these ranks over their profiled steps.

    Kernels are grouped by their own `step` value; each group's busy time is divided by the
    rank's median unprofiled step time. Collectives recorded in
    collectives.parquet (no start times there) fill the time no compute/memory kernel covers,
    up to their summed duration per step: comm kernels run while the compute stream waits.
    """
    acc = dict.fromkeys(ACTIVITIES, 0.0)
    n = 0
    for r in ranks:
        kr = by_rank.get(r)
        if kr is None or kr.empty:
            continue
        span = _measured_step_s(steps, r, profiled)
        groups = list(kr.groupby("step"))
        comm_per_step = 0.0
        if collectives is not None and not collectives.empty and "rank" in collectives.columns:
            cr = collectives[collectives["rank"] == r]
            comm_per_step = float(pd.to_numeric(cr["time_s"], errors="coerce").fillna(0).sum()) / max(len(groups), 1)
        for _, ks in groups:
            st = ks["start_s"].to_numpy(float)
            en = st + ks["time_s"].to_numpy(float)
            acts = [activity_of(c, nm) for c, nm in zip(ks["op_class"], ks["name"], strict=True)]
            sh = exclusive_shares(st, en, acts, span)
            if comm_per_step > 0 and span > 0:
                extra = min(comm_per_step / span, sh["idle"])
                sh["comm"] += extra
                sh["idle"] -= extra
            for a in ACTIVITIES:
                acc[a] += sh[a]
            n += 1
    if n == 0:
        return None
    return {a: acc[a] / n for a in ACTIVITIES}


def _measured_step_s(steps: pd.DataFrame, rank: int, profiled: set) -> float:
    """The rank's median unprofiled step time: shares and rates are of the measured step, since the
    profiler slows the step it records by host-side gaps, not by GPU work."""
    srow = steps[steps["rank"] == rank]
    plain = srow[~srow["step"].isin(profiled)] if profiled else srow
    return float((plain if not plain.empty else srow)["time_s"].median())


def flops_per_step(kernels: pd.DataFrame, rank: int, classes: tuple[str, ...] = FLOP_CLASSES) -> float:
    """FLOPs of `classes` (GEMM and attention unless told) in one rank's profiled step (the mean over its
    profiled steps).

    cuBLAS's split-K reduction kernels carry their GEMM's shape and FLOPs in tables converted before
    calib.ops.split_k_reduce_record (calib.fit.split_k_reductions): they do no GEMM work of their own."""
    return _flops_per_step(kernels[kernels["rank"] == rank], classes)


def _flops_per_step(kr: pd.DataFrame, classes: tuple[str, ...] = FLOP_CLASSES) -> float:
    """flops_per_step of one rank's kernel rows. Every kernel of an attention op carries the op's
    record (the flash backward's three kernels): its FLOPs count once per op instance
    (calib.models.kernel.op_instances), as the generator counts them."""
    if kr.empty or "flops" not in kr.columns:
        return 0.0
    cls = kr["op_class"].astype(str).str.lower()
    parts = []
    if "gemm" in classes:
        parts.append(kr.loc[(cls == "gemm") & ~kr["name"].map(is_split_k_reduce).astype(bool)])
    if "attention" in classes:
        parts.append(op_instances(kr.loc[cls == "attention"]))
    flops = [pd.to_numeric(rows["flops"], errors="coerce").fillna(0.0).sum() for rows in parts]
    return float(sum(flops)) / kr["step"].nunique()


def _flop_rate_for_ranks(by_rank: dict[int, pd.DataFrame], steps: pd.DataFrame, ranks: list[int],
                         profiled: set) -> float:
    """Mean over these ranks of their GEMM and attention FLOPs per profiled step over the measured step time."""
    rates = [_flops_per_step(by_rank[r]) / span for r in ranks
             if r in by_rank and (span := _measured_step_s(steps, r, profiled)) > 0]
    return float(np.mean(rates)) if rates else 0.0


@dataclass
class PowerModel:
    """Fitted per-GPU power by activity; plain numbers."""

    power_by_activity_w: dict[str, float]
    peak_power_w: float = float("nan")
    throttle_factor: float = 1.0  # max SM clock / mean SM clock under load (>= 1)
    sm_clock_load_hz: float = float("nan")
    max_sm_clock_hz: float = float("nan")
    clock_reasons: dict[str, float] = field(default_factory=dict)
    count: int = 0
    power_limit_w: float = float("nan")  # the GPUs' enforced limit (manifest gpu.power_limit_w)
    energy_per_flop_j: float = 0.0  # e_flop (module docstring); 0 in files written before it
    unmeasured: list[str] = field(default_factory=list)  # activities no window ran: given the idle power

    def power_w(self, shares: dict[str, float], flops_per_s: float = 0.0) -> float:
        """Mean power over a window with these activity shares and this GEMM/attention FLOP rate."""
        unknown = set(shares) - set(ACTIVITIES)
        if unknown:
            raise CalibError(f"power model: unknown activity {sorted(unknown)[0]!r} (known: {', '.join(ACTIVITIES)})")
        total = sum(shares.values())
        if not total > 0:
            raise CalibError("power model: activity shares sum to zero")
        p = float(sum(self.power_by_activity_w[a] * shares.get(a, 0.0) for a in ACTIVITIES) / total)
        p += self.energy_per_flop_j * max(float(flops_per_s), 0.0)
        return min(p, self.power_limit_w) if np.isfinite(self.power_limit_w) and self.power_limit_w > 0 else p

    def energy_j(self, step_time_s: float, shares: dict[str, float], flops: float = 0.0) -> float:
        """Energy of one GPU over one step of step_time_s with these activity shares and `flops` of
        GEMM and attention work."""
        rate = flops / step_time_s if step_time_s > 0 else 0.0
        return self.power_w(shares, rate) * step_time_s

    @classmethod
    def fit(cls, points: list[PowerPoint], idle_w: list[float] | None = None, max_sm_clock_hz: float = float("nan"),
            min_points: int = 4, power_limit_w: float = float("nan")) -> PowerModel:
        from scipy.optimize import lsq_linear

        if len(points) < min_points:
            raise CalibError(f"power model: {len(points)} GPU window(s) with telemetry, need at least {min_points}")
        # The FLOP rate enters in PFLOP/s so that its column is of the shares' order.
        a = np.array([[p.shares[c] for c in ACTIVITIES] + [p.flops_per_s / PFLOP] for p in points])
        y = np.array([p.mean_power_w for p in points])
        w = np.ones(len(points))
        if idle_w:
            # The idle readings enter as one point (their median) weighted like one GPU window.
            a = np.vstack([a, [0.0, 0.0, 0.0, 1.0, 0.0]])
            y = np.append(y, float(np.median(idle_w)))
            w = np.append(w, 1.0)
        # Relative error (each row divided by its measured power); every activity's power lies
        # between 0 and the GPU's power limit (the firmware caps the average there).
        cap = power_limit_w if np.isfinite(power_limit_w) and power_limit_w > 0 else np.inf
        has_flops = bool(a[:, -1].any())
        upper = np.array([cap] * len(ACTIVITIES) + [np.inf if has_flops else 1e-12])
        sol = lsq_linear(a * (w / y)[:, None], w, bounds=(np.zeros(len(upper)), upper)).x
        pw = {c: float(v) for c, v in zip(ACTIVITIES, sol, strict=False)}
        per_flop = float(sol[-1]) / PFLOP if has_flops else 0.0
        # An activity no window ran (communication on one-GPU runs) is not determined by the fit (the
        # solver leaves it anywhere in its bounds): it gets the idle power, what a GPU that waits draws.
        unmeasured = [c for i, c in enumerate(ACTIVITIES) if c != "idle" and not a[:, i].any()
                      and a[:, ACTIVITIES.index("idle")].any()]
        for c in unmeasured:
            pw[c] = pw["idle"]
        peak = float(np.nanmax([p.peak_power_w for p in points]))
        clocks = np.array([p.sm_clock_load_hz for p in points], dtype=float)
        sm_load = float(np.nanmean(clocks)) if np.isfinite(clocks).any() else float("nan")
        mx = max_sm_clock_hz
        if np.isfinite(clocks).any():
            mx = float(np.nanmax([mx if np.isfinite(mx) else 0.0, np.nanmax(clocks)]))
        factor = float(mx / sm_load) if np.isfinite(sm_load) and sm_load > 0 and np.isfinite(mx) else 1.0
        reasons: dict[str, float] = {}
        for p in points:
            for k, v in p.reasons.items():
                reasons[k] = reasons.get(k, 0.0) + v / len(points)
        return cls(pw, peak, factor, sm_load, mx, {k: round(v, 4) for k, v in reasons.items()}, len(points),
                   float(power_limit_w), per_flop, unmeasured)

    def to_dict(self) -> dict:
        return {
            "form": "sum over activities of power_w * time share (compute, memory, comm, idle) + energy_per_flop_j * "
                    "GEMM/attention FLOPs per second, at most power_limit_w",
            "power_by_activity_w": dict(self.power_by_activity_w),
            "energy_per_flop_j": self.energy_per_flop_j,
            "unmeasured_activities": list(self.unmeasured),
            "peak_power_w": self.peak_power_w,
            "throttle_factor": self.throttle_factor,
            "sm_clock_load_hz": self.sm_clock_load_hz,
            "max_sm_clock_hz": self.max_sm_clock_hz,
            "clock_reasons_fraction": dict(self.clock_reasons),
            "count": self.count,
            "power_limit_w": self.power_limit_w,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PowerModel:
        return cls(
            {str(k): float(v) for k, v in d["power_by_activity_w"].items()},
            float(d.get("peak_power_w", float("nan"))), float(d.get("throttle_factor", 1.0)),
            float(d.get("sm_clock_load_hz", float("nan"))), float(d.get("max_sm_clock_hz", float("nan"))),
            {str(k): float(v) for k, v in (d.get("clock_reasons_fraction") or {}).items()}, int(d.get("count", 0)),
            float(d.get("power_limit_w", float("nan"))), float(d.get("energy_per_flop_j", 0.0)),
            [str(a) for a in d.get("unmeasured_activities") or []],
        )
