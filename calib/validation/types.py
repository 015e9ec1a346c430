"""The validation report's records: one per run and kind of error, one per fitted model, a summary."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

REPLAY = "replay"
HELDOUT = "heldout"
IN_SAMPLE = "in-sample"
PREDICTED = "predicted-before"
ERROR_KINDS = (REPLAY, HELDOUT, IN_SAMPLE, PREDICTED)
# A fit error that compares measurements with measurements, or with an estimate that has no fitted parameter.
MODEL_FREE = "no model"
# Each kind's prefix in the summary's keys (`heldout_mape`, ...), in the order reports list them.
SUMMARY_KEYS = (("heldout", HELDOUT), ("replay", REPLAY), ("in_sample", IN_SAMPLE), ("predicted_before", PREDICTED))
# The held-out runs whose own predicted step is GPU-bound (host share at most calib.project.HOST_BOUND_SHARE), scored
# apart in the summary as `heldout_gpu_bound_*`: what a projection the host hardly paces can expect.
GPU_BOUND_KEY = "heldout_gpu_bound"
GPU_BOUND_TEXT = ("held-out, predicted GPU-bound: the held-out runs whose own held-out prediction leaves at most the "
                  "stated share of the step to its host (the breakdown's \"other\": the GPU waiting for launches and "
                  "syncs); chosen by the prediction, not the measurement, as a projection's band is "
                  "(calib.project.error_band)")
# The replays of those same runs (chosen by their held-out prediction, so by the configuration, not by how the replay
# came out), scored apart as `replay_gpu_bound_*`: what a replay is off by where its host does not pace its step.
REPLAY_GPU_BOUND_KEY = "replay_gpu_bound"
REPLAY_GPU_BOUND_TEXT = ("replay, predicted GPU-bound: the replays of the held-out runs predicted GPU-bound (above); "
                         "each replays the kernels of one profiled step, so it moves with that step against the "
                         "median of the unprofiled ones")

# What each kind means, printed beside every figure.
KIND_TEXT = {
    REPLAY: "replay: the run's own converted ETs (measured kernel times) simulated on the calibrated network",
    HELDOUT: "held-out: its configuration left out of the fit, its workload generated from the spec and simulated",
    IN_SAMPLE: "in-sample: generated and simulated with the calibration fitted on all bundles, this run included",
    PREDICTED: "predicted before the run: `calib project` of its configuration with the calibration of its day, "
               "committed before the run existed (traces/<gpu>/_campaigns/*/predictions*.json)",
}


@dataclass
class RunError:
    """One run's step time: measured vs predicted, for one kind of error."""

    run: str  # bundle id
    config: str  # RunSpec.key(): runs sharing it left out together
    model: str
    gpus: int
    tp: int
    pp: int
    dp: int
    ep: int
    parallelism: str  # "TP+DP", "single", ...
    kind: str  # replay | heldout | in-sample | predicted-before
    measured_step_s: float
    measured_steps: int  # how many steps the measured median rests on
    predicted_step_s: float | None
    error_pct: float | None  # 100 x (predicted - measured) / measured (signed)
    breakdown_measured_s: dict[str, float] = field(default_factory=dict)
    breakdown_predicted_s: dict[str, float] = field(default_factory=dict)
    measured_energy_j: float | None = None
    predicted_energy_j: float | None = None
    fitted_on: list[str] = field(default_factory=list)  # bundle ids of the calibration used
    note: str = ""  # why no prediction, or what was special
    # (p90 - p10) / median of the measured steps: how far the measurement itself moves from step to
    # step (H200 MoE runs: 11-43 %; 24 of the 29 dense runs: under 2 %)
    measured_spread: float | None = None
    # Median seconds of the host-pace sampler's fixed work over the measured steps (larger: a slower
    # host; calib.validation.measured.measured_host_work_s); None where the run was not sampled.
    host_work_s: float | None = None
    # Median seconds per tiny launch timed in the trainer's own thread after each measured step (larger: slower
    # CPUs under the launching threads; calib.validation.measured.measured_own_launch_s); None where not timed.
    own_launch_s: float | None = None
    # Seconds of the profiled step's timeline per converted node, the slowest rank's
    # (calib.validation.measured.profiled_span_per_node_s): where own_launch_s is None, the run is simulated at the
    # own launch pace the calibration's host.profiled_pace gives this; None where the bundle has no converted ETs.
    profiled_span_s: float | None = None

    @property
    def abs_error_pct(self) -> float | None:
        return None if self.error_pct is None else abs(self.error_pct)

    @property
    def host_share(self) -> float | None:
        """The share of the predicted step its host exposes (calib.project.host_share); None for a replay, whose
        breakdown is the simulated busy time per category, and where there is no prediction."""
        from calib.project import host_share

        return host_share(self.breakdown_predicted_s, self.predicted_step_s)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["abs_error_pct"] = self.abs_error_pct
        out["host_share"] = self.host_share
        return out


@dataclass
class ModelError:
    """A fitted model's error (kernel, collective, energy ...) and where it comes from."""

    model: str
    mape: float | None  # percent
    max: float | None  # percent
    count: int
    kind: str  # heldout | in-sample | cross-validated | no model
    method: str  # how it was obtained, in words

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def error_stats(errors: list[float]) -> tuple[float | None, float | None]:
    vals = [abs(e) for e in errors if e is not None and math.isfinite(e)]
    if not vals:
        return None, None
    return float(np.mean(vals)), float(np.max(vals))


@dataclass
class ValidationReport:
    runs: list[RunError]
    models: list[ModelError]
    summary: dict
    calibration: dict  # path, gpu, bundles it was fitted on, how it was obtained
    excluded: list[dict] = field(default_factory=list)  # [{"run", "why"}]
    notes: list[str] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)
    goals: dict = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    depth: list[dict] = field(default_factory=list)  # calib.validation.depth.DepthSeries.to_dict(), per series
    created_utc: str = ""
    wall_s: float = 0.0

    def of_kind(self, kind: str) -> list[RunError]:
        return [r for r in self.runs if r.kind == kind]

    def to_dict(self) -> dict:
        return {
            "schema": "calib.validation/1",
            "created_utc": self.created_utc,
            "calibration": self.calibration,
            "kinds": KIND_TEXT,
            "summary": self.summary,
            "thresholds": self.thresholds,
            "goals": self.goals,
            "violations": self.violations,
            "runs": [r.to_dict() for r in self.runs],
            "models": [m.to_dict() for m in self.models],
            "depth_series": self.depth,
            "excluded": self.excluded,
            "notes": self.notes,
            "wall_s": self.wall_s,
        }


def relative_error_pct(predicted: float | None, measured: float) -> float | None:
    if predicted is None or not math.isfinite(predicted) or measured <= 0:
        return None
    return 100.0 * (predicted - measured) / measured


def repeats(runs: list[RunError]) -> list[dict]:
    """The configurations measured more than once (telemetry twins, repeats on other leases): each run's
    measured step and how far apart they are, (max - min) / min in percent. No model enters it: it is
    the floor under any step-time error of those configurations."""
    measured: dict[str, dict[str, float]] = {}
    for r in runs:
        measured.setdefault(r.config, {})[r.run] = r.measured_step_s
    out = []
    for config, by_run in sorted(measured.items()):
        if len(by_run) < 2:
            continue
        lo, hi = min(by_run.values()), max(by_run.values())
        out.append({"config": config, "runs": sorted(by_run), "measured_step_s": [by_run[k] for k in sorted(by_run)],
                    "spread_pct": 100.0 * (hi - lo) / lo})
    return out


def config_floor(runs: list[RunError]) -> dict[str, list[float]]:
    """Per configuration, the absolute error (percent) of each held-out run with a measured step against the one step
    time that minimises the configuration's mean absolute percent error, chosen knowing every run's measured step:
    the median of the runs' steps weighted by 1 / step (a configuration measured once: 0). No model enters it: a
    prediction from the configuration alone, as a projection is, cannot have a lower mean error on these runs."""
    steps: dict[str, list[float]] = {}
    for r in runs:
        if r.kind == HELDOUT and r.measured_step_s > 0:
            steps.setdefault(r.config, []).append(r.measured_step_s)
    out: dict[str, list[float]] = {}
    for config, measured in steps.items():
        ordered = sorted(measured)
        weights = np.cumsum([1.0 / m for m in ordered])
        best = ordered[int(np.searchsorted(weights, weights[-1] / 2))]
        out[config] = [100.0 * abs(best - m) / m for m in measured]
    return out


def _kind_summary(key: str, runs: list[RunError]) -> dict:
    """One kind's entries of the summary, `<key>_*`: the mean and max absolute error of those of `runs` with a
    figure, how many runs and configurations they are, and the runs missing one."""
    scored = [r for r in runs if r.error_pct is not None]
    missing = [r.run for r in runs if r.error_pct is None]
    mape, mx = error_stats([r.error_pct for r in scored])
    return {f"{key}_mape": mape, f"{key}_max": mx, f"{key}_count": len(scored),
            f"{key}_configs": len({r.config for r in scored}), f"{key}_missing": len(missing),
            f"{key}_missing_runs": missing}


def summarize(runs: list[RunError], real_bundles: int) -> dict:
    """heldout/replay/in-sample/predicted-before mean and max absolute error (percent), and the runs/configs
    behind each; `heldout_gpu_bound_*` the same over the held-out runs predicted GPU-bound (GPU_BOUND_KEY: no missing
    runs, a run without a prediction has no host share and counts under `heldout`); `replay_gpu_bound_*` over the
    replays of those runs (REPLAY_GPU_BOUND_KEY);
    `config_floor_*`: the held-out error no prediction from the configuration alone can go below (`config_floor`);
    `repeat_*`: how far apart the runs of a configuration measured more than once are (`repeats`)."""
    from calib.project import HOST_BOUND_SHARE

    out: dict = {"units": "percent of the measured step time", "real_bundles": real_bundles}
    for key, kind in SUMMARY_KEYS:
        out.update(_kind_summary(key, [r for r in runs if r.kind == kind]))
    gpu_bound = [r for r in runs if r.kind == HELDOUT and r.error_pct is not None and r.host_share is not None
                 and r.host_share <= HOST_BOUND_SHARE]
    out.update(_kind_summary(GPU_BOUND_KEY, gpu_bound))
    out[f"{GPU_BOUND_KEY}_share"] = HOST_BOUND_SHARE
    bound_runs = {r.run for r in gpu_bound}
    out.update(_kind_summary(REPLAY_GPU_BOUND_KEY, [r for r in runs if r.kind == REPLAY and r.run in bound_runs]))
    floor = config_floor(runs)
    out["config_floor_mape"], out["config_floor_max"] = error_stats([e for errs in floor.values() for e in errs])
    out["config_floor_count"] = sum(len(errs) for errs in floor.values())
    out["config_floor_configs"] = len(floor)
    rep = [r["spread_pct"] for r in repeats(runs)]
    out["repeat_configs"] = len(rep)
    out["repeat_spread_mean"] = sum(rep) / len(rep) if rep else None
    out["repeat_spread_max"] = max(rep) if rep else None
    return out
