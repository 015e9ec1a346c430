"""Presenting projections: the rich table on the terminal, JSON, and a PNG/HTML breakdown plot."""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from calib.errors import CalibError
from calib.project import ProjectionResult
from calib.stack import stack_summary

BREAKDOWN_ORDER = ("compute", "exposed_tp", "exposed_pp", "exposed_dp", "exposed_ep", "pipeline_bubble", "other")


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.3f} s"


def _band(r: ProjectionResult) -> str:
    b = r.error_band
    if b.get("low") is None:
        return "none (" + str(b.get("from", "")) + ")"
    return f"{_fmt_s(b['low'])} .. {_fmt_s(b['high'])} (±{b['pct']:.1f}%, {b['from']})"


def projection_table(r: ProjectionResult) -> Table:
    inp = r.inputs
    par = inp["parallel"]
    title = (
        f"{inp['model']['name']} on {inp['gpus']} x {inp['cluster_gpu']} ({inp['cluster']}): TP {par['tp']} PP {par['pp']} "
        f"DP {par['dp']}" + (f" EP {par['ep']}" if par["ep"] > 1 else "") + (f" VPP {par['vpp']}" if par["vpp"] > 1 else "")
        + f", micro-batch {par['micro_batch']}, global batch {par['global_batch']}"
    )
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("step time", _fmt_s(r.step_time_s))
    t.add_row("error band", _band(r))
    t.add_row("tokens/s", f"{r.tokens_per_s:,.0f}")
    t.add_row("TFLOP/s per GPU (model)", f"{r.tflops_per_gpu:.1f}")
    t.add_row("MFU", f"{100 * r.mfu:.1f}%")
    for key in BREAKDOWN_ORDER:
        if key in r.breakdown_s:
            v = r.breakdown_s[key]
            t.add_row(f"  {key.replace('_', ' ')}", f"{_fmt_s(v)} ({100 * v / r.step_time_s:.1f}%)")
    d = r.memory_detail_gib
    verdict = {"fits": "fits", "tight": "tight: may not fit", "out of memory": "OUT OF MEMORY"}[r.memory_verdict]
    t.add_row("peak memory per GPU (torch allocated)", f"{r.memory_gib_per_gpu:.1f} GiB")
    if d.get("device_high", 0.0) > d.get("device_low", 0.0) or d.get("outside_allocator", 0.0) > 0:
        t.add_row("  device peak (allocator reserve, CUDA/NCCL)",
                  f"{d['device_low']:.1f}-{d['device_high']:.1f} GiB of {d['capacity']:.1f} ({verdict})")
    else:
        t.add_row("  of the device's", f"{d['capacity']:.1f} GiB ({verdict})")
    t.add_row("energy per step", "n/a" if r.energy_j_per_step is None else f"{r.energy_j_per_step / 1e6:.3f} MJ")
    t.add_row("average power per GPU", "n/a" if r.avg_power_w is None else f"{r.avg_power_w:.0f} W")
    t.add_row("peak power per GPU (highest measured reading)", "n/a" if r.peak_power_w is None else f"{r.peak_power_w:.0f} W")
    return t


def _name(item: str) -> str:
    """The parameter part of a "parameter: source" entry."""
    return item.split(": ", 1)[0]


def print_projection(r: ProjectionResult, console: Console | None = None) -> None:
    c = console or Console()
    c.print(projection_table(r))
    c.print(f"[bold]calibration:[/bold] {r.calibration_id or 'none'}"
            + (f" ({r.inputs.get('calibration')})" if r.inputs.get("calibration") else ""))
    if r.calibration_id:
        c.print("[bold]measured on:[/bold] " + escape(stack_summary(r.inputs.get("calibration_software"))))
    c.print("[bold]calibrated:[/bold] " + (", ".join(_name(x) for x in r.calibrated) or "nothing"))
    c.print("[bold]configured:[/bold] " + ", ".join(_name(x) for x in r.configured) + " [dim](sources: --json)[/dim]")
    if r.transferred:
        c.print("[bold yellow]transferred from another GPU:[/bold yellow] " + "; ".join(r.transferred))
    for n in r.notes:
        c.print(f"[dim]note: {n}[/dim]")


def write_text_atomic(path: str | Path, text: str | bytes) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def _finite(value: object) -> object:
    """JSON has no NaN/inf: such a number (an unknown) becomes null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json_text(r: ProjectionResult) -> str:
    return json.dumps(_finite(r.to_json()), indent=2, allow_nan=False, default=float)


def plot_projection(r: ProjectionResult, path: str | Path) -> Path:
    """Step-time breakdown as a stacked bar with the error band: PNG through matplotlib, or HTML."""
    p = Path(path)
    parts = [(k, r.breakdown_s[k]) for k in BREAKDOWN_ORDER if r.breakdown_s.get(k, 0) > 0]
    if p.suffix.lower() == ".html":
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{v:.4f}</td><td>{100 * v / r.step_time_s:.1f}%</td></tr>" for k, v in parts
        )
        bars = "".join(
            f'<div title="{html.escape(k)}" style="display:inline-block;height:24px;width:{100 * v / r.step_time_s:.2f}%;'
            f'background:hsl({i * 50},60%,55%)"></div>' for i, (k, v) in enumerate(parts)
        )
        doc = (
            "<!doctype html><meta charset='utf-8'><title>calib projection</title>"
            f"<h1>{html.escape(r.inputs['model']['name'])} on {r.inputs['gpus']} GPUs ({html.escape(r.inputs['cluster'])})</h1>"
            f"<p>step time {r.step_time_s:.4f} s; error band: {html.escape(_band(r))}</p>"
            f"<div style='width:100%;border:1px solid #888'>{bars}</div>"
            f"<table><tr><th>part</th><th>seconds</th><th>share</th></tr>{rows}</table>"
        )
        return write_text_atomic(p, doc)
    if p.suffix.lower() != ".png":
        raise CalibError(f"--plot {p}: the file name must end in .png or .html")
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.6))
    left = 0.0
    for i, (k, v) in enumerate(parts):
        ax.barh([0], [v], left=left, color=plt.cm.tab10(i), label=k.replace("_", " "))
        left += v
    b = r.error_band
    if b.get("low") is not None:
        ax.errorbar([r.step_time_s], [0], xerr=[[r.step_time_s - b["low"]], [b["high"] - r.step_time_s]], color="k",
                    capsize=6, label="error band")
    ax.set_yticks([])
    ax.set_xlabel("seconds per step")
    ax.set_title(f"{r.inputs['model']['name']}, {r.inputs['gpus']} x {r.inputs['cluster_gpu']}: step {r.step_time_s:.3f} s")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return write_text_atomic(p, buf.getvalue())
