"""The versioned error thresholds (validation-thresholds.yaml) and the `--check` verdict.

Thresholds are percentages on the step-time errors of the summary: `mean_pct` bounds the mean
absolute error (the summary's `<kind>_mape`), `max_pct` the largest one (`<kind>_max`), for each
kind (heldout, replay, and heldout_gpu_bound / replay_gpu_bound: the held-out runs whose prediction is GPU-bound,
held out and replayed); `missing` is how many runs may lack a figure of that kind (0 when not
given: a run that cannot be validated must not pass silently). They are set at what
calib reaches now, rounded up a little, and only ever lowered. `by_gpu` (optional) maps a GPU family
(`h100`, as calib.validation.engine.gpu_family names it) to limits of its own, which replace the common
ones for that family's bundles: a family with other runs is held to what it reaches, and the others keep
theirs. `goals` are the targets of the project: printed beside the thresholds, never enforced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from calib.errors import CalibError
from calib.yamlio import load_yaml

SCHEMA = "calib.validation-thresholds/1"
# The last two: the held-out runs predicted GPU-bound, held out and replayed (calib.validation.types.summarize).
KINDS = ("heldout", "replay", "heldout_gpu_bound", "replay_gpu_bound")
STATS = ("mean_pct", "max_pct", "missing")
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "validation-thresholds.yaml"


@dataclass
class Thresholds:
    limits: dict[str, dict[str, float]]  # kind -> "mean_pct" | "max_pct" -> percent
    goals: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""
    by_family: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # `by_gpu`

    def for_family(self, family: str | None) -> Thresholds:
        """The limits one GPU family's bundles are held to: its `by_gpu` entries over the common ones."""
        own = self.by_family.get(family or "")
        if not own:
            return self
        limits = {kind: dict(stats) for kind, stats in self.limits.items()}
        for kind, stats in own.items():
            limits.setdefault(kind, {}).update(stats)
        return Thresholds(limits=limits, goals=self.goals, source=f"{self.source}, by_gpu.{family}")


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    p = Path(path) if path is not None else DEFAULT_PATH
    if not p.is_file():
        raise CalibError(f"thresholds file {p} does not exist")
    data = load_yaml(p, "thresholds file")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CalibError(f"thresholds file {p}: schema must be {SCHEMA!r}")
    limits = _section(data.get("thresholds"), p, "thresholds")
    if not limits:
        raise CalibError(f"thresholds file {p}: no thresholds set")
    goals = _section(data.get("goals") or {}, p, "goals")
    by_gpu = data.get("by_gpu") or {}
    if not isinstance(by_gpu, dict):
        raise CalibError(f"thresholds file {p}: by_gpu must map GPU families (h100, h200, ...) to thresholds")
    by_family = {str(fam): _section(raw, p, f"by_gpu.{fam}") for fam, raw in by_gpu.items()}
    return Thresholds(limits=limits, goals=goals, source=str(p), by_family=by_family)


def _section(raw: object, p: Path, name: str) -> dict[str, dict[str, float]]:
    if not isinstance(raw, dict):
        raise CalibError(f"thresholds file {p}: {name} must map heldout/replay to mean_pct/max_pct")
    out: dict[str, dict[str, float]] = {}
    for kind, stats in raw.items():
        if kind not in KINDS or not isinstance(stats, dict):
            raise CalibError(f"thresholds file {p}: {name}.{kind} is not one of {', '.join(KINDS)} with mean_pct/max_pct")
        out[kind] = {}
        for stat, value in stats.items():
            if stat not in STATS:
                raise CalibError(f"thresholds file {p}: {name}.{kind}.{stat} is not one of {', '.join(STATS)}")
            if stat == "missing":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise CalibError(f"thresholds file {p}: {name}.{kind}.missing must be a count >= 0, got {value!r}")
            elif not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise CalibError(f"thresholds file {p}: {name}.{kind}.{stat} must be a positive percentage, got {value!r}")
            out[kind][stat] = float(value)
    return out


def violations(summary: dict, thresholds: Thresholds | None) -> list[str]:
    """One line per broken threshold; a threshold whose error could not be computed is broken too,
    and so is a validation with no real GPU training bundle or no thresholds at all."""
    out: list[str] = []
    if not summary.get("real_bundles"):
        out.append("no real GPU training bundles to validate (CPU bundles never count)")
        return out
    if thresholds is None:
        return ["no thresholds file: nothing to check the errors against"]
    for kind, stats in thresholds.limits.items():
        count = int(summary.get(f"{kind}_count") or 0)
        if count == 0:
            out.append(f"{kind}: no {kind} error could be computed, so its thresholds cannot be met")
            continue
        missing = list(summary.get(f"{kind}_missing_runs") or [])
        allowed = int(stats.get("missing", 0))
        if len(missing) > allowed:
            out.append(f"{kind}: {len(missing)} run(s) have no {kind} error ({', '.join(missing)}); "
                       f"the threshold allows {allowed} ({thresholds.source}; the reports say why)")
        for stat, limit in stats.items():
            if stat == "missing":
                continue
            key = f"{kind}_{'mape' if stat == 'mean_pct' else 'max'}"
            value = summary.get(key)
            if value is None or not math.isfinite(float(value)) or float(value) > limit:
                shown = "n/a" if value is None else f"{float(value):.2f}%"
                what = "mean" if stat == "mean_pct" else "max"
                out.append(f"{kind} {what} step-time error {shown} exceeds the threshold {limit:.2f}% "
                           f"({count} runs; {thresholds.source})")
    return out
