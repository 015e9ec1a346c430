"""`calib validate`: replay, held-out and in-sample step-time errors on the measured bundles (logic in
calib.validate)."""

from __future__ import annotations

from pathlib import Path

import typer


def validate(
    bundles: list[Path] = typer.Argument(None, help="Bundles or folders of bundles (default: the committed traces/)."),
    calibration: Path = typer.Option(
        None, "--calibration", help="Calibration YAML to validate (default: calib/data/calibration-<gpu>.yaml; "
        "fitted on all bundles when there is none). Its `validation` section is updated.",
    ),
    out: Path = typer.Option(Path("reports"), "--out", help="Folder for validation.json, validation.md, validation.html."),
    check: bool = typer.Option(False, "--check", help="Exit 1 (one line per violation) when a mean or max error exceeds "
                               "validation-thresholds.yaml, or when there are no real GPU bundles to validate."),
    thresholds: Path = typer.Option(None, "--thresholds", help="Thresholds file (default: validation-thresholds.yaml)."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Processes for the held-out fits."),
    heldout: bool = typer.Option(True, "--heldout/--no-heldout", help="Compute the leave-one-configuration-out errors."),
    replay: bool = typer.Option(True, "--replay/--no-replay", help="Replay each run's own converted ETs."),
    write_calibration: bool = typer.Option(
        True, "--write-calibration/--no-write-calibration", help="Record the errors in the calibration's `validation` section."
    ),
    cache: bool = typer.Option(
        True, "--cache/--no-cache", help="Reuse held-out results computed before by the same code on the same bundles "
        "($CALIB_CACHE_DIR, else ~/.cache/calib) and keep new ones.",
    ),
) -> None:
    """Rebuild every measured training run the calibration did not see and report how far off it is."""
    import sys

    from rich.console import Console

    from calib.validate import family_groups, preflight, run_validation
    from calib.validation.report import print_table

    preflight(bundles or None, out, thresholds, check)
    err = Console(stderr=True)
    # Several GPU models and no calibration named: each family against its own bundled calibration,
    # the largest in --out, the others in --out/<family>.
    groups = family_groups(bundles or None) if calibration is None else [("", list(bundles or []))]
    violations: list[str] = []
    for i, (fam, paths) in enumerate(groups):
        where = out if i == 0 or len(groups) == 1 else out / fam
        if len(groups) > 1:
            Console().print(f"[bold]{fam.upper()}[/bold]: {len(paths)} bundles -> {where}")
        report = run_validation(
            paths or None, calibration, where, replay=replay, heldout=heldout, jobs=jobs,
            write_calibration=write_calibration, thresholds_path=thresholds, cache=cache,
            progress=lambda msg: err.print(f"[dim]{msg}[/dim]"),
        )
        print_table(report)
        Console().print(f"reports written to {where}/validation.{{json,md,html}} ({report.wall_s:.1f} s)")
        violations += [f"{fam}: {v}" if len(groups) > 1 else v for v in report.violations]
    if check and violations:
        for line in violations:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(1)  # calib.cli.main drops the code of typer.Exit (standalone_mode=False)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
