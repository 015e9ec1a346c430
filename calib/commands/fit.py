"""`calib fit BUNDLES... -o calibration.yaml`: fit the kernel, network and power models."""

from __future__ import annotations

import math
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("fit")
    def fit(
        bundles: list[Path] = typer.Argument(..., help="Bundle folders, or folders holding bundles (e.g. traces/h200)."),
        output: Path = typer.Option(..., "-o", "--output", help="Calibration file to write (YAML)."),
        gpu: str = typer.Option(None, "--gpu", help="Use only bundles measured on this GPU (e.g. h200, 'NVIDIA H100')."),
        allow_mixed_gpus: bool = typer.Option(False, "--allow-mixed-gpus", help="Fit bundles of different GPU models together."),
        folds: int = typer.Option(5, "--folds", min=2, help="k of the k-fold cross-validation (kernels, collectives)."),
    ) -> None:
        """Fit kernel, network and power models on measurement bundles; write the calibration file.

        Prints each model's cross-validated error and which parameters are calibrated (measured) or
        configured (datasheet values). Nothing is written when an input is bad or too small.
        """
        from calib.bundle.io import load_bundles
        from calib.calibration import Calibration
        from calib.fit import FitOptions, fit_calibration

        Calibration.check_output(output)  # before minutes of fitting, not after
        found = load_bundles([str(b) for b in bundles])
        cal = fit_calibration(found, FitOptions(folds=folds, allow_mixed_gpus=allow_mixed_gpus, gpu=gpu, replay_host=True))
        cal.save(output)
        print_summary(cal, output)


def print_summary(cal: object, output: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from calib.fit import GOAL_PCT

    console = Console()
    t = Table(title=f"calib fit: {cal.gpu}, {len(cal.bundles)} bundle(s) -> {output}")  # type: ignore[attr-defined]
    for col in ("model", "MAPE %", "max %", "count", "goal %", "method"):
        t.add_column(col, justify="right" if col not in ("model", "method") else "left")
    for name, e in cal.errors.items():  # type: ignore[attr-defined]
        goal = GOAL_PCT.get(name)
        t.add_row(name, _pct(e.mape), _pct(e.max), str(e.count), "" if goal is None else f"{goal:g}", escape(e.method))
    console.print(t)
    p = Table(title="parameters")
    p.add_column("parameter")
    p.add_column("origin")
    for key, origin in cal.provenance.items():  # type: ignore[attr-defined]
        style = "green" if origin.startswith("calibrated") else ("yellow" if origin.startswith("configured") else "red")
        p.add_row(escape(key), f"[{style}]{escape(origin)}[/{style}]")
    console.print(p)
    from calib.stack import stack_summary

    console.print("[bold]measured on:[/bold] " + escape(stack_summary(cal.software)))  # type: ignore[attr-defined]


def _pct(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}"
