"""Write the validation report: reports/validation.json, .md, .html (plots embedded) and a rich table.

Every figure carries its kind (replay | held-out | in-sample | predicted before the run) and the number of
runs behind it.
All files are written to a temporary name and moved into place, so a crash never leaves a report
that looks complete.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from pathlib import Path

from calib.stack import stack_summary
from calib.validation.types import (
    GPU_BOUND_KEY,
    GPU_BOUND_TEXT,
    HELDOUT,
    IN_SAMPLE,
    KIND_TEXT,
    PREDICTED,
    REPLAY,
    REPLAY_GPU_BOUND_KEY,
    REPLAY_GPU_BOUND_TEXT,
    SUMMARY_KEYS,
    RunError,
    ValidationReport,
    repeats,
)

KIND_LABEL = {REPLAY: "replay", HELDOUT: "held-out", IN_SAMPLE: "in-sample", PREDICTED: "predicted before the run"}
KIND_NOTES = (*KIND_TEXT.values(), GPU_BOUND_TEXT, REPLAY_GPU_BOUND_TEXT)  # what each summary row means, listed under the table
KIND_COLOR = {REPLAY: "tab:blue", HELDOUT: "tab:red", IN_SAMPLE: "tab:gray", PREDICTED: "tab:green"}

def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:+.2f}%" if signed else f"{v:.2f}%"


def _spread(r: RunError) -> str:
    return _pct(None if r.measured_spread is None else 100 * r.measured_spread)


def _ms(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{1e3 * v:.2f}"


def _json_safe(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_reports(report: ValidationReport, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "validation.json", "md": out / "validation.md", "html": out / "validation.html"}
    _atomic_write(paths["json"], json.dumps(_json_safe(report.to_dict()), indent=2) + "\n")
    _atomic_write(paths["md"], markdown(report))
    _atomic_write(paths["html"], html_report(report, plots(report)))
    return paths


# --- text ---------------------------------------------------------------------------------------------


def summary_lines(report: ValidationReport) -> list[tuple[str, str, str, str, str, str]]:
    """(kind, mean, max, runs, configs, threshold / goal) rows of the summary."""
    s = report.summary
    rows = []
    keys = [(key, KIND_LABEL[kind]) for key, kind in SUMMARY_KEYS]
    if s.get(f"{GPU_BOUND_KEY}_share") is not None:
        share = f"host share <= {100 * s[f'{GPU_BOUND_KEY}_share']:.0f}%"
        keys.insert(1, (GPU_BOUND_KEY, f"held-out, predicted GPU-bound ({share})"))
        if s.get(f"{REPLAY_GPU_BOUND_KEY}_count") is not None:
            keys.insert(3, (REPLAY_GPU_BOUND_KEY, f"replay, predicted GPU-bound ({share} held out)"))
    for key, label in keys:
        lim = report.thresholds.get(key, {})
        goal = report.goals.get(key, {})
        bound = ", ".join(
            f"{w} <= {lim[k]:.2f}%" for k, w in (("mean_pct", "mean"), ("max_pct", "max")) if k in lim
        ) or "-"
        aim = ", ".join(f"{w} {goal[k]:.0f}%" for k, w in (("mean_pct", "mean"), ("max_pct", "max")) if k in goal) or "-"
        rows.append((label, _pct(s.get(f"{key}_mape")), _pct(s.get(f"{key}_max")),
                     str(s.get(f"{key}_count", 0)), str(s.get(f"{key}_configs", 0)), f"{bound} (goal: {aim})"))
    if s.get("config_floor_count"):
        rows.append((FLOOR_LABEL, _pct(s.get("config_floor_mape")), _pct(s.get("config_floor_max")),
                     str(s["config_floor_count"]), str(s.get("config_floor_configs", 0)), "- (no model enters it)"))
    return rows


# calib.validation.types.config_floor
FLOOR_LABEL = ("held-out floor: one step per configuration, the best knowing every run's measurement (what a "
               "prediction from the configuration alone cannot go below)")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(report: ValidationReport) -> str:
    s = report.summary
    cal = report.calibration
    lines = [
        "# calib validation report",
        "",
        f"Created {report.created_utc}; calibration: {cal.get('path') or '(none)'} ({cal.get('source', '')}); "
        f"{s.get('real_bundles', 0)} real GPU training bundles; {report.wall_s:.1f} s.",
        "",
        *([f"Measured on: {stack_summary(cal.get('software'))}. Every error below is that stack's.", ""]
          if cal.get("source") not in (None, "", "none") else []),
        "Step-time error = (predicted - measured) / measured. Measured = median over the measured, "
        "unprofiled steps of the slowest rank's step time; spread = (p90 - p10) / median of those steps, "
        "the measurement's own step-to-step variation.",
        "",
        "| kind | mean abs error | max abs error | runs | configurations | threshold (goal, not enforced) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {' | '.join(row)} |" for row in summary_lines(report)]
    lines += ["", *(f"- {text}" for text in KIND_NOTES), ""]
    if report.violations:
        lines += ["## Threshold violations", "", *(f"- {v}" for v in report.violations), ""]
    lines += [
        "## Runs", "",
        "| run | kind | model | GPUs | TP/PP/DP/EP | measured ms (steps) | spread | predicted ms | error | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(report.runs, key=lambda r: (r.run, r.kind)):
        lines.append(
            f"| {r.run} | {KIND_LABEL.get(r.kind, r.kind)} | {r.model} | {r.gpus} | {r.tp}/{r.pp}/{r.dp}/{r.ep} | "
            f"{_ms(r.measured_step_s)} ({r.measured_steps}) | "
            f"{_spread(r)} | {_ms(r.predicted_step_s)} | "
            f"{_pct(r.error_pct, signed=True)} | {_cell(r.note)} |"
        )
    lines += _repeat_lines(report)
    lines += _host_pace_lines(report)
    lines += _bias_lines(report)
    lines += _depth_lines(report)
    lines += ["", "## Per-model errors", "", "| model | kind | MAPE | max | points | how |", "| --- | --- | --- | --- | --- | --- |"]
    for m in report.models:
        lines.append(f"| {m.model} | {m.kind} | {_pct(m.mape)} | {_pct(m.max)} | {m.count} | {_cell(m.method)} |")
    if report.excluded:
        lines += ["", "## Not counted", "", *(f"- {e['run']}: {e['why']}" for e in report.excluded)]
    if report.notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in report.notes)]
    return "\n".join(lines) + "\n"


REPEAT_TEXT = ("The same configuration measured more than once (its telemetry twin, or the same run again, on the "
               "same or another machine): "
               "spread = (max - min) / min of the runs' measured steps. No model enters it: a step-time error "
               "of these configurations below it cannot be told from the measurement's own repeatability.")


def _repeat_rows(report: ValidationReport) -> list[tuple[str, str, str, str, str]]:
    """(configuration, runs, measured ms, spread between runs, held-out errors) per repeated configuration."""
    held = {r.run: r.error_pct for r in report.runs if r.kind == HELDOUT}
    rows = []
    for rep in repeats(report.runs):
        rows.append((rep["config"], ", ".join(rep["runs"]), ", ".join(_ms(t) for t in rep["measured_step_s"]),
                     _pct(rep["spread_pct"]), ", ".join(_pct(held.get(k), signed=True) for k in rep["runs"])))
    return rows


REPEAT_HEAD = ("configuration", "runs", "measured ms", "spread between runs", "held-out error")


def _section(title: str, text: str, figures: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown section: title, what it shows, its figures, its table (nothing without rows)."""
    if not rows:
        return []
    return ["", f"## {title}", "", text, figures, "", f"| {' | '.join(head)} |", "| --- " * len(head) + "|",
            *(f"| {' | '.join(_cell(c) for c in row)} |" for row in rows)]


HOST_PACE_TEXT = ("Runs measured with the host's pace beside them (`calib measure`). Host work = the median time "
                  "of a second process's fixed pure-Python work over the measured steps (measure/telemetry/"
                  "host_pace.py); own launch = the median time per tiny CUDA launch timed in the trainer's own "
                  "thread just after each measured step (measure/own_pace.py; from round 30 on). Larger is a "
                  "slower host. A step that waits for the host moves with its launching threads' CPUs, which "
                  "on the H200 hosts the second process does not see and the own launch timing does. The host "
                  "model scales a timed run's launch and sync costs by its own launch pace (calib.models.host, "
                  "own_launch_ref_s), and a run that did not time it by the pace its profiled step gives: under the "
                  "profiler a step waits for its host, and the profiled step's span per converted node (profiled "
                  "us) follows the timed pace (calib.models.profiled_pace, host.profiled_pace); host work is "
                  "informative only: it says which errors the host's pace on the day can explain.")
HOST_PACE_HEAD = ("run", "configuration", "measured ms", "spread", "host work ms", "own launch us", "profiled us",
                  "held-out error", "replay error")


def _host_pace_rows(report: ValidationReport) -> list[tuple[str, ...]]:
    """One row per run sampled for its host's pace, by configuration then host work."""
    by_kind = {(r.run, r.kind): r.error_pct for r in report.runs}
    sampled = [r for r in report.runs if r.kind == HELDOUT and (r.host_work_s is not None or r.own_launch_s is not None)]
    return [(r.run, r.config, _ms(r.measured_step_s), _spread(r),
             "-" if r.host_work_s is None else f"{r.host_work_s * 1e3:.2f}",
             "-" if r.own_launch_s is None else f"{r.own_launch_s * 1e6:.2f}",
             "-" if r.profiled_span_s is None else f"{r.profiled_span_s * 1e6:.1f}",
             _pct(by_kind.get((r.run, HELDOUT)), signed=True), _pct(by_kind.get((r.run, REPLAY)), signed=True))
            for r in sorted(sampled, key=lambda r: (r.config, r.host_work_s or 0.0))]


def _host_pace_lines(report: ValidationReport) -> list[str]:
    rows = _host_pace_rows(report)
    return _section("Host pace", HOST_PACE_TEXT, f"{len(rows)} runs sampled.", HOST_PACE_HEAD, rows)


# A run whose steps spread less than this (p90 - p10 over the median) is paced steadily, by its GPU: its error
# is the model's, where an unsteady run's is mostly its host's pace on the day.
STEADY_SPREAD = 0.05
BIAS_TEXT = (f"Signed mean error by parallelism type over the steady runs (measured steps spreading under "
             f"{STEADY_SPREAD:.0%}), whose error is the model's rather than the host's pace on the day: a sign "
             "shared by most runs of a type is a bias of the model, not noise. The unsteady runs' mean absolute "
             "error is beside it.")
BIAS_HEAD = ("parallelism", "steady runs", "held-out, signed mean", "held-out, negative", "replay, signed mean",
             "unsteady runs", "their held-out mean abs")


def _bias_stats(report: ValidationReport) -> list[dict]:
    """One entry per parallelism type: its steady runs' held-out and replay errors and its unsteady runs'
    held-out errors (percent, signed)."""

    def errors(kind: str, steady: bool, par: str) -> list[float]:
        return [r.error_pct for r in report.runs if r.kind == kind and r.parallelism == par
                and r.error_pct is not None and r.measured_spread is not None
                and (r.measured_spread < STEADY_SPREAD) == steady]

    out = []
    for par in sorted({r.parallelism for r in report.runs if r.kind == HELDOUT}):
        held, unsteady = errors(HELDOUT, True, par), errors(HELDOUT, False, par)
        if held or unsteady:
            out.append({"parallelism": par, "held": held, "replay": errors(REPLAY, True, par), "unsteady": unsteady})
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _bias_rows(stats: list[dict]) -> list[tuple[str, ...]]:
    """One row per parallelism type: the steady runs' signed mean held-out and replay errors, how many of
    them are predicted short, and the unsteady runs' held-out mean absolute error."""
    return [(s["parallelism"], str(len(s["held"])), _pct(_mean(s["held"]), signed=True),
             f"{sum(e < 0 for e in s['held'])} of {len(s['held'])}", _pct(_mean(s["replay"]), signed=True),
             str(len(s["unsteady"])), _pct(_mean([abs(e) for e in s["unsteady"]]))) for s in stats]


def _bias_lines(report: ValidationReport) -> list[str]:
    stats = _bias_stats(report)
    steady, unsteady = sum(len(s["held"]) for s in stats), sum(len(s["unsteady"]) for s in stats)
    return _section("Bias by parallelism", BIAS_TEXT, f"{steady} steady and {unsteady} unsteady runs held out.",
                    BIAS_HEAD, _bias_rows(stats))


def _repeat_lines(report: ValidationReport) -> list[str]:
    s = report.summary
    return _section("Repeated configurations", REPEAT_TEXT,
                    f"Mean {_pct(s.get('repeat_spread_mean'))}, max {_pct(s.get('repeat_spread_max'))} over "
                    f"{s.get('repeat_configs', 0)} configurations.", REPEAT_HEAD, _repeat_rows(report))


DEPTH_TEXT = ("Each series is one configuration measured at several layer counts, all else equal (the scaling-down "
              "rule of calib.workload.models). Measured step = fixed + per layer x layers (least squares); linearity "
              "= the largest distance of a measured step from that line. The held-out predictions get the same line; "
              "per-layer error = held-out per-layer time against the measured one, the part of the error a "
              "projection to the full depth multiplies. Compute share = the profiled step's GPU kernel time over "
              "the measured step (near 100%: GPU-bound).")
DEPTH_HEAD = ("series", "layers", "runs", "measured ms", "compute share", "held-out ms", "held-out error")


def _depth_rows(report: ValidationReport) -> list[tuple[str, ...]]:
    """One row per depth of every series, then the series' lines: measured, held-out, per-layer error."""
    rows: list[tuple[str, ...]] = []
    for s in report.depth:
        for p in s["points"]:
            share = p.get("compute_share")
            rows.append((s["series"], str(p["layers"]), ", ".join(p["runs"]), _ms(p["measured_step_s"]),
                         "n/a" if share is None else f"{100 * share:.0f}%", _ms(p["heldout_step_s"]),
                         _pct(p["heldout_error_pct"], signed=True)))
        held = ("n/a" if s["heldout_per_layer_s"] is None else
                f"{_ms(s['heldout_fixed_s'])} + {_ms(s['heldout_per_layer_s'])} per layer")
        rows.append((s["series"], "line", f"linear within {_pct(s['linearity_pct'])}",
                     f"{_ms(s['fixed_s'])} + {_ms(s['per_layer_s'])} per layer", "", held,
                     f"per layer {_pct(s['per_layer_error_pct'], signed=True)}"))
    return rows


def _depth_lines(report: ValidationReport) -> list[str]:
    s = report.summary
    return _section("Scaled-down models (depth series)", DEPTH_TEXT,
                    f"{s.get('depth_series', 0)} series; per-layer error at most "
                    f"{_pct(s.get('depth_per_layer_error_max'))}, measured steps within "
                    f"{_pct(s.get('depth_linearity_max'))} of their lines.", DEPTH_HEAD, _depth_rows(report))


def print_table(report: ValidationReport, console: object | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=max(Console().width, 110))
    t = Table(title="calib validate: step-time error (measured = median unprofiled step, slowest rank)")
    for col in ("run", "kind", "GPUs", "TP/PP/DP/EP", "measured ms", "predicted ms", "error"):
        t.add_column(col, justify="right" if col not in ("run", "kind") else "left", no_wrap=True)
    missing = []
    for r in sorted(report.runs, key=lambda r: (r.run, r.kind)):
        t.add_row(r.run, KIND_LABEL.get(r.kind, r.kind), str(r.gpus), f"{r.tp}/{r.pp}/{r.dp}/{r.ep}",
                  _ms(r.measured_step_s), _ms(r.predicted_step_s), _pct(r.error_pct, signed=True))
        if r.error_pct is None:
            missing.append(f"n/a  {r.run} ({KIND_LABEL.get(r.kind, r.kind)}): {r.note or 'no prediction'}")
    con.print(t)
    for line in missing:
        con.print(line, markup=False, highlight=False)
    s = Table(title="summary (mean / max absolute error)")
    for col in ("kind", "mean", "max", "runs", "configs", "threshold (goal)"):
        s.add_column(col)
    for row in summary_lines(report):
        s.add_row(*row)
    con.print(s)
    rs = report.summary
    if rs.get("repeat_configs"):
        con.print(f"same configuration measured more than once: runs {_pct(rs['repeat_spread_mean'])} apart on mean, "
                  f"{_pct(rs['repeat_spread_max'])} at most ({rs['repeat_configs']} configurations)",
                  markup=False, highlight=False)
    if rs.get("depth_series"):
        con.print(f"scaled-down models: {rs['depth_series']} depth series, per-layer error at most "
                  f"{_pct(rs['depth_per_layer_error_max'])}, measured steps within {_pct(rs['depth_linearity_max'])} "
                  "of a line in the layer count", markup=False, highlight=False)
    if report.models:
        m = Table(title="per-model errors")
        for col in ("model", "kind", "MAPE", "max", "points"):
            m.add_column(col)
        for e in report.models:
            m.add_row(e.model, e.kind, _pct(e.mape), _pct(e.max), str(e.count))
        con.print(m)


# --- plots ---------------------------------------------------------------------------------------------


def plots(report: ValidationReport) -> dict[str, bytes]:
    """PNG bytes by title: predicted vs measured, per-run errors, error by parallelism, breakdown."""
    # Figure objects, not pyplot: no global backend switch (the notebook keeps its inline backend)
    # and nothing to close.
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    done = [r for r in report.runs if r.predicted_step_s is not None and r.error_pct is not None]
    out: dict[str, bytes] = {}
    if not done:
        return out

    def png(fig: Figure) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()

    def subplots(figsize: tuple[float, float]) -> tuple[Figure, object]:
        fig = Figure(figsize=figsize)
        return fig, fig.subplots()

    fig, ax = subplots(figsize=(5.5, 5))
    lo = min(min(r.measured_step_s, r.predicted_step_s) for r in done) * 1e3 * 0.8
    hi = max(max(r.measured_step_s, r.predicted_step_s) for r in done) * 1e3 * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="exact")
    ax.plot([lo, hi], [lo * 1.06, hi * 1.06], "k:", lw=0.6, label="±6% (held-out goal for the max)")
    ax.plot([lo, hi], [lo * 0.94, hi * 0.94], "k:", lw=0.6)
    for kind, marker, size in ((IN_SAMPLE, "s", 40), (REPLAY, "^", 28), (HELDOUT, "o", 22), (PREDICTED, "D", 26)):
        rs = [r for r in done if r.kind == kind]
        if rs:
            ax.scatter([r.measured_step_s * 1e3 for r in rs], [r.predicted_step_s * 1e3 for r in rs],
                       facecolors="none" if kind == IN_SAMPLE else KIND_COLOR[kind], edgecolors=KIND_COLOR[kind],
                       marker=marker, label=f"{KIND_LABEL[kind]} ({len(rs)} runs)", s=size)
    ax.set(xscale="log", yscale="log", xlabel="measured step time (ms)", ylabel="predicted step time (ms)",
           title="predicted vs measured")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        if hi / lo < 20:  # within about a decade the minor ticks are the only labels; beyond, too many
            axis.set_minor_formatter(plain)
    ax.legend(fontsize=8)
    out["predicted vs measured"] = png(fig)

    runs = sorted({r.run for r in done})
    kinds = [k for k in (HELDOUT, REPLAY, IN_SAMPLE, PREDICTED) if any(r.kind == k for r in done)]
    fig, ax = subplots(figsize=(8, 0.32 * len(runs) * len(kinds) + 1.5))
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        err = {r.run: r.error_pct for r in done if r.kind == kind}
        ys = [i + j * width for i, run in enumerate(runs) if run in err]
        ax.barh(ys, [err[run] for run in runs if run in err], height=width, color=KIND_COLOR[kind],
                label=f"{KIND_LABEL[kind]} ({len(err)} runs)")
    ax.set_yticks([i + 0.4 - width / 2 for i in range(len(runs))], runs, fontsize=7)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="step-time error (%), predicted vs measured", title="per-run error")
    ax.legend(fontsize=8)
    out["per-run error"] = png(fig)

    types = sorted({r.parallelism for r in done})
    fig, ax = subplots(figsize=(max(5, 1.1 * len(types)), 4))
    for j, kind in enumerate(kinds):
        vals, counts = [], []
        for t in types:
            errs = [abs(r.error_pct) for r in done if r.kind == kind and r.parallelism == t]
            vals.append(sum(errs) / len(errs) if errs else 0.0)
            counts.append(len(errs))
        xs = [i + j * width for i in range(len(types))]
        bars = ax.bar(xs, vals, width=width, color=KIND_COLOR[kind], label=KIND_LABEL[kind])
        for bar, n in zip(bars, counts, strict=True):
            if n:
                ax.annotate(f"n={n}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(types))], types)
    ax.set(ylabel="mean absolute step-time error (%)", title="error by parallelism type")
    ax.legend(fontsize=8)
    out["error by parallelism type"] = png(fig)

    rows = [r for r in done if r.kind == REPLAY and r.breakdown_measured_s and r.breakdown_predicted_s]
    if rows:
        # "wait" (collectives waiting for peers) overlaps everything else: listed in the JSON, not stacked.
        cats = sorted({c for r in rows for c in (*r.breakdown_measured_s, *r.breakdown_predicted_s)} - {"wait"})
        fig, ax = subplots(figsize=(max(6, 0.9 * len(rows)), 4.5))
        cmap = matplotlib.colormaps["tab10"]
        for i, r in enumerate(rows):
            for j, (bd, hatch) in enumerate(((r.breakdown_measured_s, ""), (r.breakdown_predicted_s, "//"))):
                bottom = 0.0
                for c_i, cat in enumerate(cats):
                    v = bd.get(cat, 0.0) * 1e3
                    ax.bar(i + 0.4 * j, v, width=0.38, bottom=bottom, color=cmap(c_i % 10), hatch=hatch,
                           label=cat if (i == 0 and j == 0) else None, edgecolor="white")
                    bottom += v
        ax.scatter([i for i in range(len(rows))], [r.measured_step_s * 1e3 for r in rows], marker="_", s=200,
                   color="black", label="measured step time", zorder=3)
        ax.scatter([i + 0.4 for i in range(len(rows))], [r.predicted_step_s * 1e3 for r in rows], marker="_", s=200,
                   color="tab:red", label="replayed step time", zorder=3)
        ax.set_xticks([i + 0.2 for i in range(len(rows))], [r.run for r in rows], rotation=60, ha="right", fontsize=7)
        ax.set(ylabel="busy time per rank (ms), mean over ranks",
               title="time breakdown: measured ET (plain) vs simulated replay (hatched), busy time by category")
        ax.legend(fontsize=7)
        out["time breakdown measured vs simulated"] = png(fig)
    if report.depth:
        fig, ax = subplots(figsize=(7, 4.5))
        cmap = matplotlib.colormaps["tab10"]
        for i, s in enumerate(report.depth):
            layers = [p["layers"] for p in s["points"]]
            color = cmap(i % 10)
            ax.plot(layers, [1e3 * p["measured_step_s"] for p in s["points"]], "o", color=color,
                    label=s["series"].split("/", 1)[0])
            ax.plot(layers, [1e3 * (s["fixed_s"] + s["per_layer_s"] * n) for n in layers], "-", color=color, lw=0.8)
            held = [(n, p["heldout_step_s"]) for n, p in zip(layers, s["points"], strict=True) if p["heldout_step_s"]]
            if held:
                ax.plot([n for n, _ in held], [1e3 * t for _, t in held], "x--", color=color, lw=0.8)
        ax.set(xlabel="layers", ylabel="step time (ms)",
               title="scaled-down models: measured (o, least-squares line) and held-out (x, dashed) by depth")
        ax.legend(fontsize=7)
        out["scaled-down models by depth"] = png(fig)
    return out


def _html_section(title: str, text: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [f"<h2>{html.escape(title)}</h2><p>{html.escape(text)}</p><table><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>",
            *("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows), "</table>"]


def html_report(report: ValidationReport, images: dict[str, bytes]) -> str:
    md = markdown(report)
    body = [f"<h1>calib validation report</h1><p>{html.escape(md.splitlines()[2])}</p>", "<table>",
            "<tr><th>kind</th><th>mean abs error</th><th>max abs error</th><th>runs</th><th>configurations</th>"
            "<th>threshold (goal, not enforced)</th></tr>"]
    body += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in summary_lines(report)]
    body.append("</table><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in KIND_NOTES) + "</ul>")
    if report.violations:
        body.append("<h2>Threshold violations</h2><ul>"
                    + "".join(f"<li>{html.escape(v)}</li>" for v in report.violations) + "</ul>")
    for title, data in images.items():
        b64 = base64.b64encode(data).decode()
        body.append(f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{b64}">')
    body.append("<h2>Runs</h2><table><tr><th>run</th><th>kind</th><th>model</th><th>GPUs</th><th>TP/PP/DP/EP</th>"
                "<th>measured ms (steps)</th><th>spread</th><th>predicted ms</th><th>error</th><th>note</th></tr>")
    for r in sorted(report.runs, key=lambda r: (r.run, r.kind)):
        cells = (r.run, KIND_LABEL.get(r.kind, r.kind), r.model, str(r.gpus), f"{r.tp}/{r.pp}/{r.dp}/{r.ep}",
                 f"{_ms(r.measured_step_s)} ({r.measured_steps})", _spread(r), _ms(r.predicted_step_s),
                 _pct(r.error_pct, signed=True), r.note)
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    body.append("</table>")
    if rows := _repeat_rows(report):
        body += _html_section("Repeated configurations", REPEAT_TEXT, REPEAT_HEAD, rows)
    if rows := _bias_rows(_bias_stats(report)):
        body += _html_section("Bias by parallelism", BIAS_TEXT, BIAS_HEAD, rows)
    if rows := _host_pace_rows(report):
        body += _html_section("Host pace", HOST_PACE_TEXT, HOST_PACE_HEAD, rows)
    if rows := _depth_rows(report):
        body += _html_section("Scaled-down models (depth series)", DEPTH_TEXT, DEPTH_HEAD, rows)
    body.append("<h2>Per-model errors</h2><table><tr><th>model</th><th>kind</th><th>MAPE</th><th>max</th>"
                "<th>points</th><th>how</th></tr>")
    for m in report.models:
        cells = (m.model, m.kind, _pct(m.mape), _pct(m.max), str(m.count), m.method)
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    body.append("</table>")
    if report.excluded:
        body.append("<h2>Not counted</h2><ul>"
                    + "".join(f"<li>{html.escape(e['run'])}: {html.escape(e['why'])}</li>" for e in report.excluded)
                    + "</ul>")
    if report.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in report.notes) + "</ul>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>calib validation</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
