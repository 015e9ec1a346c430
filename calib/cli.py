"""The `calib` command: one typer app; each sub-command lives in calib/commands/<name>.py.

Every module in COMMANDS exposes `register(app: typer.Typer) -> None`. Heavy imports (torch,
megatron-core, matplotlib) happen inside the command functions, so `calib --help` stays fast and the
core install never needs torch.
"""

from __future__ import annotations

import importlib
import sys

import typer

from calib.errors import CalibError

COMMANDS = ["trace", "sim", "measure", "fit", "project", "validate"]

app = typer.Typer(
    name="calib",
    help="Measure small LLM trainings, calibrate a simulator on them, project to thousands of GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_all() -> None:
    for name in COMMANDS:
        importlib.import_module(f"calib.commands.{name}").register(app)


_register_all()


@app.callback()
def _root() -> None:
    """calib: trustworthy large-scale training simulation."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning CalibError into one line on stderr and exit status 2."""
    try:
        # Without standalone mode click returns typer.Exit's code instead of raising it.
        rc = app(args=argv, standalone_mode=False)
    except CalibError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer.Exit / click usage errors carry their own code
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - a click usage error or a bug: still one line
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        if isinstance(exc, click.exceptions.Abort):
            print("error: aborted", file=sys.stderr)
            return 1
        raise
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
