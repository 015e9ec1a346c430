"""Scaled-down models in the validation report: does a model with fewer layers keep the full model's
bottlenecks, and does calib's error on it carry to the deeper model?

A depth series is the runs of one configuration that differ only in their layer count (same preset,
sequence, parallelism, batch, recomputation; calib.workload.models' scaling-down rule). Per series:
- measured step = fixed + per-layer x layers, fitted by least squares over the runs; `linearity_pct`
  is the largest distance of a measured step from that line, in percent of the step. A scaled-down
  model keeps the full model's per-layer behaviour when the line holds;
- the same line through the held-out predictions, and the per-layer error: the predicted per-layer
  time against the measured one, the part of the error that a projection multiplies by the depth;
- per depth, the GPU's compute share of the measured step (kernel time of the profiled step over
  the unprofiled step; near 100 % GPU-bound, well under it host- or communication-bound).
No series, no section: configurations measured at one depth only say nothing about depth. Without
held-out records (`calib validate --no-heldout`) the section has the measured lines and shares only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calib.errors import CalibError
from calib.validation.types import HELDOUT, RunError
from calib.workload.models import resolve_model


@dataclass(frozen=True)
class DepthPoint:
    layers: int
    runs: list[str]
    measured_step_s: float  # mean over the runs of their measured (median) steps
    heldout_step_s: float | None
    heldout_error_pct: float | None
    compute_share: float | None  # measured GPU compute busy / measured step


@dataclass(frozen=True)
class DepthSeries:
    series: str  # the configuration with the layer count as `L*`
    points: list[DepthPoint]  # by layer count
    fixed_s: float
    per_layer_s: float
    linearity_pct: float  # max |measured - line| / measured, percent
    heldout_fixed_s: float | None
    heldout_per_layer_s: float | None
    per_layer_error_pct: float | None  # 100 x (held-out per layer - measured per layer) / measured per layer

    def to_dict(self) -> dict:
        return {
            "series": self.series, "fixed_s": self.fixed_s, "per_layer_s": self.per_layer_s,
            "linearity_pct": self.linearity_pct, "heldout_fixed_s": self.heldout_fixed_s,
            "heldout_per_layer_s": self.heldout_per_layer_s, "per_layer_error_pct": self.per_layer_error_pct,
            "points": [vars(p) | {"runs": list(p.runs)} for p in self.points],
        }


def series_key(run: RunError) -> tuple[str, int] | None:
    """(series, layers) of a run whose model is a preset, else None (an architecture of its own has no
    deeper or shallower sibling)."""
    try:
        spec = resolve_model(run.model)
    except CalibError:
        return None
    base = run.model.split("@", 1)[0]
    rest = run.config.split("/", 1)[1] if "/" in run.config else ""
    return f"{base}@L*,S{spec.seq_length}/{rest}", spec.layers


def _line(layers: list[int], steps: list[float]) -> tuple[float, float]:
    """(fixed, per layer) of the least-squares line through (layers, step)."""
    per_layer, fixed = np.polyfit(np.asarray(layers, float), np.asarray(steps, float), 1)
    return float(fixed), float(per_layer)


def depth_series(runs: list[RunError]) -> list[DepthSeries]:
    """Every configuration measured at two or more layer counts. The measured line comes from any
    record of each run (replay, held-out or in-sample: they carry the same measurement), the held-out
    line from the held-out records where `calib validate` computed them (not with --no-heldout)."""
    by_run: dict[str, list[RunError]] = {}
    for r in runs:
        by_run.setdefault(r.run, []).append(r)
    by_series: dict[str, dict[int, list[tuple[RunError, RunError | None]]]] = {}
    for records in by_run.values():
        held = next((r for r in records if r.kind == HELDOUT), None)
        first = held or records[0]
        key = series_key(first)
        if key is not None:
            by_series.setdefault(key[0], {}).setdefault(key[1], []).append((first, held))
    out = []
    for series, by_layers in sorted(by_series.items()):
        if len(by_layers) < 2:
            continue
        points = [_point(n, rs) for n, rs in sorted(by_layers.items())]
        layers = [p.layers for p in points]
        fixed, per_layer = _line(layers, [p.measured_step_s for p in points])
        linearity = max(abs(p.measured_step_s - fixed - per_layer * p.layers) / p.measured_step_s for p in points)
        held = [p for p in points if p.heldout_step_s is not None]
        h_fixed = h_per_layer = err = None
        if len(held) == len(points):
            h_fixed, h_per_layer = _line(layers, [p.heldout_step_s for p in held])  # type: ignore[misc]
            err = 100.0 * (h_per_layer - per_layer) / per_layer if per_layer > 0 else None
        out.append(DepthSeries(series, points, fixed, per_layer, 100.0 * linearity, h_fixed, h_per_layer, err))
    return out


def _point(layers: int, runs: list[tuple[RunError, RunError | None]]) -> DepthPoint:
    measured = float(np.mean([r.measured_step_s for r, _ in runs]))
    predicted = [h.predicted_step_s for _, h in runs if h is not None and h.predicted_step_s is not None]
    # A configuration's runs are left out together and share one prediction; the mean also covers one
    # depth spelled two ways (`gpt3-1.3b`, `gpt3-1.3b@L24`), two configurations.
    heldout = float(np.mean(predicted)) if predicted and len(predicted) == len(runs) else None
    shares = [r.breakdown_measured_s["compute"] / r.measured_step_s for r, _ in runs
              if r.breakdown_measured_s.get("compute") and r.measured_step_s > 0]
    return DepthPoint(layers, sorted(r.run for r, _ in runs), measured, heldout,
                      None if heldout is None else 100.0 * (heldout - measured) / measured,
                      float(np.mean(shares)) if shares else None)


def depth_summary(series: list[DepthSeries]) -> dict:
    """The summary keys: how many series, the largest per-layer error and the largest departure from
    a line (percent; None without series)."""
    errs = [abs(s.per_layer_error_pct) for s in series
            if s.per_layer_error_pct is not None and math.isfinite(s.per_layer_error_pct)]
    return {"depth_series": len(series), "depth_per_layer_error_max": max(errs) if errs else None,
            "depth_linearity_max": max((s.linearity_pct for s in series), default=None)}
