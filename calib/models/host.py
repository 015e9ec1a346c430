"""The host (CPU launch) model: what one kernel launch costs the host thread, and what a host sync adds.

Parameters (seconds):
- `launch_s`: host time per kernel launch (compute kernels, collectives, sends/receives alike):
  everything eager PyTorch and megatron-core do on the Python/autograd thread per kernel;
- `sync_s`: host time between a sync point's GPU work ending and the next launch (the device-to-
  host copy returning and the Python work before the next kernel), at the sync points of
  calib.workload.host.SYNC_AFTER.
The generator (calib.workload.generate with `host=`) puts them into the ET as ASTRA-sim CPU ops.

Fit (`fit_host`): for every training bundle, the generated step of its configuration (kernel
times from the calibration's kernel model, network from its network fit, on the bundle's host
preset) is simulated for trial launch costs; the simulated step time never decreases with the
launch cost, so a bracketing root search finds the cost at which it equals the measured step.
`launch_s` is the median over runs; then, with it fixed, `sync_s` is fitted the same way on the
runs that have sync points, median over those; a second round refits the launch costs at that
sync cost (and the sync cost at the new launch cost). Runs whose GPU-bound step is already longer than
measured give 0. The error is leave-one-configuration-out: each configuration (RunSpec.key(),
telemetry twins together) is predicted with the medians of the other configurations' fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calib.errors import CalibError
from calib.workload.host import SYNC_AFTER

LAUNCH_MAX_S = 1e-3  # search bracket: no eager launch costs a millisecond
SYNC_MAX_S = 50e-3
ROUNDS = 2  # alternations of the launch and sync fits (the second round moves launch_s by < 1 % here)
REL_TOL = 0.002  # stop when the simulated step is within 0.2 % of the measured one


@dataclass
class HostModel:
    launch_s: float = 0.0
    sync_s: float = 0.0
    replay_launch_s: float | None = None  # per measured kernel, for replays of converted ETs (fit_replay_launch)
    sync_points: dict[str, str] = field(default_factory=lambda: dict(SYNC_AFTER))
    runs: list[dict] = field(default_factory=list)  # per training bundle: id, config, measured_s, launch_s, sync_s
    provenance: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "launch_s": float(self.launch_s), "sync_s": float(self.sync_s),
            "replay_launch_s": None if self.replay_launch_s is None else float(self.replay_launch_s),
            "sync_points": dict(self.sync_points),
            "runs": [dict(r) for r in self.runs], "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Any) -> HostModel:
        if not isinstance(data, dict) or "launch_s" not in data:
            raise CalibError("calibration host section: expected a mapping with launch_s (and sync_s)")
        try:
            launch, sync = float(data["launch_s"]), float(data.get("sync_s", 0.0))
            replay = data.get("replay_launch_s")
            replay = None if replay is None else float(replay)
        except (TypeError, ValueError):
            raise CalibError("calibration host section: launch_s and sync_s must be numbers (seconds)") from None
        if not (np.isfinite(launch) and np.isfinite(sync)) or launch < 0 or sync < 0:
            raise CalibError(f"calibration host section: launch_s {launch} / sync_s {sync} must be finite and >= 0")
        if replay is not None and not (np.isfinite(replay) and replay >= 0):
            raise CalibError(f"calibration host section: replay_launch_s {replay} must be finite and >= 0")
        return cls(launch, sync, replay, dict(data.get("sync_points") or SYNC_AFTER), list(data.get("runs") or []),
                   dict(data.get("provenance") or {}))


def _short(ids: Sequence[str], most: int = 4) -> str:
    """Bundle ids for a provenance line (the calibration's `bundles` list has them all)."""
    ids = list(ids)
    return ", ".join(ids) if len(ids) <= most else f"{', '.join(ids[:most])} and {len(ids) - most} more bundles"


StepOf = Callable[[float, float], float]  # (launch_s, sync_s) -> simulated step seconds


@dataclass
class _Run:
    id: str
    key: str
    measured_s: float
    syncs: int
    step: StepOf


def solve(step: Callable[[float], float], target: float, hi: float) -> float:
    """The smallest x in [0, hi] with step(x) ~= target for a non-decreasing step; 0 when step(0) is
    already above target, hi when step(hi) is still below. Regula falsi (Illinois) on the bracket."""
    lo, f_lo = 0.0, step(0.0) - target
    if f_lo >= 0:
        return 0.0
    f_hi = step(hi) - target
    if f_hi <= 0:
        return hi
    side = 0
    x = lo
    for _ in range(40):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
        if not lo < x < hi:
            x = 0.5 * (lo + hi)
        f = step(x) - target
        if abs(f) <= REL_TOL * target or hi - lo < 1e-9:
            return x
        if f > 0:
            hi, f_hi = x, f
            if side == 1:
                f_lo *= 0.5
            side = 1
        else:
            lo, f_lo = x, f
            if side == -1:
                f_hi *= 0.5
            side = -1
    return x


def _combine(launch: dict[str, float], sync: dict[str, float], ids: set[str]) -> tuple[float, float]:
    ls = [v for k, v in launch.items() if k in ids]
    ss = [v for k, v in sync.items() if k in ids]
    return (float(np.median(ls)) if ls else 0.0), (float(np.median(ss)) if ss else 0.0)


def fit_runs(runs: Sequence[_Run]) -> tuple[HostModel, dict]:
    """Fit and cross-validate on prepared runs (see the module docstring)."""
    if not runs:
        raise CalibError("host model: no training bundles to fit on")
    sync_s = 0.0
    for _ in range(ROUNDS):  # launch cost at the current sync cost, then the sync cost at that launch cost
        launch = {r.id: solve(lambda x, r=r, s=sync_s: r.step(x, s), r.measured_s, LAUNCH_MAX_S) for r in runs}
        launch_s = float(np.median(list(launch.values())))
        sync = {r.id: solve(lambda x, r=r, c=launch_s: r.step(c, x), r.measured_s, SYNC_MAX_S) for r in runs if r.syncs}
        sync_s = float(np.median(list(sync.values()))) if sync else 0.0
    ids = [r.id for r in runs]
    errors: list[float] = []
    per_run: list[dict] = []
    keys = sorted({r.key for r in runs})
    heldout: dict[str, float] = {}
    for key in keys:
        others = {r.id for r in runs if r.key != key}
        if not others:
            continue
        lo, so = _combine(launch, sync, others)
        for r in runs:
            if r.key == key:
                pred = r.step(lo, so)
                heldout[r.id] = pred
                errors.append(100.0 * (pred - r.measured_s) / r.measured_s)
    for r in runs:
        per_run.append({
            "id": r.id, "config": r.key, "measured_s": r.measured_s, "launch_s": launch[r.id],
            "sync_s": sync.get(r.id), "syncs": r.syncs, "heldout_step_s": heldout.get(r.id),
        })
    abs_err = np.abs(errors) if errors else np.array([np.nan])
    err = {"mape": float(np.mean(abs_err)), "max": float(np.max(abs_err)), "count": len(errors),
           "method": "leave-one-configuration-out: each configuration's simulated step with the medians of the "
                     "other configurations' per-run fits (kernel and network models as given; the per-run fits of "
                     "the last round, made at the all-run medians)"}
    src = _short(ids)
    model = HostModel(launch_s, sync_s, None, dict(SYNC_AFTER), per_run, {
        "host.launch_s": f"calibrated: median per-run fit of the simulated to the measured step over {src}",
        "host.sync_s": (f"calibrated: median per-run fit at host.launch_s over {_short(list(sync))}" if sync else
                        "not calibrated: no training bundle has a host sync point (0)"),
        "host.sync_points": "configured: megatron-core host synchronisations (calib.workload.host.SYNC_AFTER)",
    })
    return model, err


def prepare_run(bundle: Any, kernel_model: Any, calibration: Any) -> _Run:
    """The step-time function of one training bundle's generated configuration (module docstring)."""
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.measured import measured_step
    from calib.workload.generate import generate
    from calib.workload.host import count_host

    spec = bundle.manifest.spec
    if spec is None:
        raise CalibError(f"bundle {bundle.path}: a training bundle without a spec cannot fit the host model")
    model, par = engine.model_of(spec), engine.parallel_of(spec)
    network, system = engine.replay_network(bundle, calibration)
    cache: dict[tuple[float, float], float] = {}

    def step(launch_s: float, sync_s: float) -> float:
        key = (launch_s, sync_s)
        if key not in cache:
            gen = generate(model, par, kernel_model.predict, HostModel(launch_s, sync_s))
            cache[key] = simulate(gen.workload, network, system).step_time_s
        return cache[key]

    probe = generate(model, par, kernel_model.predict, HostModel(0.0, 0.0))
    syncs = sum(count_host(c.trace)[1] for c in probe.workload.classes)
    return _Run(bundle.id, spec.key(), measured_step(bundle).time_s, syncs, step)


def fit_host(bundles: Sequence[Any], kernel_model: Any, calibration_without_host: Any) -> tuple[HostModel, dict]:
    """Fit the host model on the training bundles among `bundles` (real GPU runs only); return it and
    its cross-validated step-time error {mape, max, count, method} (percent)."""
    from calib.validation.measured import is_real_gpu

    chosen = [b for b in bundles if b.manifest.kind == "training" and is_real_gpu(b) and b.manifest.spec is not None]
    if not chosen:
        raise CalibError("host model: no real-GPU training bundles among the inputs")
    runs = [prepare_run(b, kernel_model, calibration_without_host) for b in chosen]
    return fit_runs(runs)


def replay_run(bundle: Any, calibration: Any, sync_s: float) -> _Run:
    """The replayed step-time function of one bundle's converted ETs with host launches at a trial
    launch cost (calib.validation.replay semantics: measured kernel durations, simulated network)."""
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.measured import measured_step
    from calib.validation.replay import check_replayable, read_run_traces, replay_workload
    from calib.workload.host import add_host_to_replay, converted_sync_points

    spec = bundle.manifest.spec
    run = read_run_traces(bundle)
    check_replayable(run, spec.pp, f"bundle {bundle.id}")
    network, system = engine.replay_network(bundle, calibration)
    base = replay_workload(run)
    syncs = max(len(converted_sync_points(c.trace)) for c in base.classes)
    cache: dict[tuple[float, float], float] = {}

    def step(launch_s: float, sync: float) -> float:
        key = (launch_s, sync)
        if key not in cache:
            cache[key] = simulate(add_host_to_replay(base, launch_s, sync), network, system).step_time_s
        return cache[key]

    return _Run(bundle.id, spec.key(), measured_step(bundle).time_s, syncs, lambda c, _s: step(c, sync_s))


def fit_replay_launch(bundles: Sequence[Any], calibration: Any, host: HostModel) -> tuple[HostModel, dict]:
    """The launch cost per measured kernel for replays of converted ETs (`replay_launch_s`): the
    generator's templates leave out some of the small kernels a real step launches, so its
    `launch_s` (per generated launch) is not the cost of one real launch. Fitted like `launch_s`
    (per-run root search, median) at the host model's `sync_s`, with its leave-one-configuration-out
    error. Returns a copy of `host` with it set."""
    from calib.validation.measured import is_real_gpu

    runs = []
    skipped = []
    for b in bundles:
        if b.manifest.kind != "training" or not is_real_gpu(b) or b.manifest.spec is None or not b.et_files():
            continue
        try:
            runs.append(replay_run(b, calibration, host.sync_s))
        except CalibError as exc:  # a run that cannot be replayed (PP without send/recv) has no say
            skipped.append(f"{b.id}: {exc}")
    if not runs:
        raise CalibError("host model: no training bundle with replayable ETs to fit the replay launch cost on")
    fits = {r.id: solve(lambda x, r=r: r.step(x, 0.0), r.measured_s, LAUNCH_MAX_S) for r in runs}
    errors = []
    for key in sorted({r.key for r in runs}):
        others = [v for k, v in fits.items() if next(r for r in runs if r.id == k).key != key]
        if not others:
            continue
        c = float(np.median(others))
        errors += [100.0 * (r.step(c, 0.0) - r.measured_s) / r.measured_s for r in runs if r.key == key]
    out = HostModel.from_dict(host.to_dict())
    out.replay_launch_s = float(np.median(list(fits.values())))
    for r in out.runs:
        if r["id"] in fits:
            r["replay_launch_s"] = fits[r["id"]]
    out.provenance["host.replay_launch_s"] = (
        f"calibrated: median per-run fit of the replayed to the measured step over {_short(list(fits))}"
        + (f" (not replayable: {len(skipped)})" if skipped else ""))
    abs_err = np.abs(errors) if errors else np.array([np.nan])
    return out, {"mape": float(np.mean(abs_err)), "max": float(np.max(abs_err)), "count": len(errors),
                 "method": "leave-one-configuration-out on replays of the converted ETs (median of the other "
                           "configurations' per-run fits)"}
