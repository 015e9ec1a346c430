"""The profiled step as a host-pace covariate for the runs that did not time their trainer's own pace
(docs/host.md, "The profiled step's pace").

    python benchmarks/profiled_pace.py [h200|h100] [VARIANT ...]   (default: h200, every variant; 20-40 s a fit)

Every training bundle keeps its profiled step as Chakra ETs. Under the profiler a step waits for its host (the
profiled GPT-3 1.3B step at sequence 256 spans 360-820 ms against its 100-210 ms unprofiled), so its span per
converted node (calib.validation.measured.profiled_span_per_node_s) is the launching host's time per launch
under the profiler. The timed runs give their own launch pace beside it. Variants, for the untimed runs:

- `reference`: at the reference pace, as calib took them until the forty-second session;
- `pooled`: at the pace calib's line gives their span per node (calib.models.profiled_pace: log own pace
  against log span per node, least squares over the timed runs), as calib takes them now;
- `per-config`: where the configuration has timed runs, at the run's span per node over theirs (medians) times
  their median own pace, else `pooled`;
- `pooled-hostbound`: `pooled` only where the profiled step's GPU was busy at most half its span, else the
  reference;
- `pooled-idle`: the line over the span's idle share per node instead of the span;
- `all-profiled`: every run, the timed ones too, at the pace the line gives its span per node (how well the
  profiled step stands in for a timed pace, on the timed runs);
- `all-reference`: every run at the reference pace (the timed runs too: what their own pace adds);
- `pooled-clamped`: `pooled`, the estimate held within the timed runs' range of paces (no extrapolation);
- `timed-blend`: `pooled`, and a timed run at the geometric mean of its timed pace and its profiled step's.

Prints the line, then per variant the host model's leave-one-configuration-out error over all runs, the timed
and the untimed runs, and the fitted costs (calib.models.host.fit_runs on the committed calibration's kernel and
network models, as benchmarks/untimed_pace.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from calib.models.profiled_pace import ProfiledPace

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("reference", "pooled", "per-config", "pooled-hostbound", "pooled-idle", "all-profiled", "all-reference",
            "pooled-clamped", "timed-blend")


def busy_share(bundle: object) -> float:
    """The GPU's compute share of the profiled step's span (the union of its compute kernels' intervals:
    collectives, which wait for their peers, not counted), on the rank with the longest span per node; for the
    `pooled-hostbound` and `pooled-idle` variants."""
    from calib.chakra.codec import read_et

    worst, busy = 0.0, 0.0
    for path in bundle.et_files():  # type: ignore[attr-defined]
        nodes = sorted(read_et(path).nodes, key=lambda n: n.start_time_micros)
        start = nodes[0].start_time_micros
        end = max(n.start_time_micros + n.duration_micros for n in nodes)
        covered, reach = 0, start
        for n in (n for n in nodes if n.attr("category") == "compute"):
            a, b = max(n.start_time_micros, reach), n.start_time_micros + n.duration_micros
            if b > a:
                covered += b - a
                reach = b
        if (end - start) / len(nodes) > worst:
            worst, busy = (end - start) / len(nodes), covered / (end - start)
    return busy


def config_of(run_id: str) -> str:
    return re.sub(r"-r\d+[a-z]*$", "", run_id)


def untimed_paces(ids: list[str], spans: np.ndarray, busy: np.ndarray, paces: list[float | None],
                  variant: str, line: ProfiledPace) -> list[float | None]:
    """Each run's own launch pace, an untimed run's estimated by `variant` from its span per node (`line`: calib's,
    over the timed runs the host paced; `pooled-idle` fits its own, over every timed run's idle span)."""
    from calib.models.profiled_pace import fit_profiled_pace

    if variant == "pooled-idle":
        spans = spans * (1 - busy)
        line = fit_profiled_pace(list(spans), paces)
    timed = np.array([p is not None for p in paces])
    own = np.array([p if p is not None else np.nan for p in paces])
    out: list[float | None] = []
    for i, p in enumerate(paces):
        if variant == "all-reference":
            out.append(None)
            continue
        if variant == "all-profiled":
            out.append(line.own_launch_s(float(spans[i])))
            continue
        if variant == "timed-blend" and p is not None:
            out.append(float(np.sqrt(p * line.own_launch_s(float(spans[i])))))
            continue
        if p is not None or variant == "reference" or (variant == "pooled-hostbound" and busy[i] > 0.5):
            out.append(p)
            continue
        sibs = [j for j in range(len(ids)) if timed[j] and config_of(ids[j]) == config_of(ids[i])]
        if variant == "per-config" and sibs:
            out.append(float(np.median(own[sibs]) * spans[i] / np.median(spans[sibs])))
        elif variant == "pooled-clamped":
            out.append(float(np.clip(line.own_launch_s(float(spans[i])), np.nanmin(own), np.nanmax(own))))
        else:
            out.append(line.own_launch_s(float(spans[i])))
    return out


def main(argv: list[str]) -> int:
    from host_path_weights import prepared_runs, training_bundles

    from calib.models import host
    from calib.validation.measured import profiled_span_per_node_s

    gpu = next((a for a in argv if a in ("h200", "h100")), "h200")
    variants = [a for a in argv if a in VARIANTS] or list(VARIANTS)
    bundles, cal = training_bundles([str(ROOT / "traces" / gpu)])
    prepared, rp = prepared_runs(bundles, cal)
    paces, ref, line = rp.timed, rp.reference, rp.line
    ids = [b.id for b in bundles]
    spans = np.array([profiled_span_per_node_s(b) for b in bundles])
    busy = np.array([busy_share(b) for b in bundles])
    timed = np.array([p is not None for p in paces])
    print(f"{gpu}: {len(bundles)} runs, {timed.sum()} timed; log(own) = {line.log_intercept:.2f} + "
          f"{line.slope:.2f} log(span per node), r {line.r:+.2f}; reference {ref * 1e6:.2f} us")
    for v in variants:
        est = untimed_paces(ids, spans, busy, paces, v, line)
        runs = [p_run.at_own_pace(host.own_pace_factor(p, ref)) for p_run, p in zip(prepared, est, strict=True)]
        with host.collector_paused():
            model, err = host.fit_runs(runs)
        errors = np.array([abs(x["heldout_step_s"] / x["measured_s"] - 1) * 100 for x in model.runs])
        factors = np.array([host.own_pace_factor(p, ref) for p in est])
        print(f"{v:11s} LOCO {err['mape']:.2f} / {err['max']:.1f} %  timed {errors[timed].mean():.2f} %  "
              f"untimed {errors[~timed].mean():.2f} / {errors[~timed].max():.1f} %  untimed factors "
              f"{factors[~timed].min():.2f}-{factors[~timed].max():.2f}  launch {model.launch_s * 1e6:.1f} us  "
              f"sync {model.sync_s * 1e3:.2f} ms  pace {model.pace_per_path or 1:.3f}")
        worst = sorted(model.runs, key=lambda x: -abs(x["heldout_step_s"] / x["measured_s"] - 1))[:5]
        print("    " + ", ".join(f"{x['id']} {100 * (x['heldout_step_s'] / x['measured_s'] - 1):+.1f}" for x in worst))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
