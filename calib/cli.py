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
    """Entry point: run the app, turning CalibError and usage errors into one line on stderr, exit status 2."""
    try:
        # Without standalone mode click returns typer.Exit's code instead of raising it.
        rc = app(args=argv, prog_name="calib", standalone_mode=False)
    except CalibError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer.Exit / click usage errors carry their own code
        return int(exc.code or 0)
    except Exception as exc:  # a click/typer usage error gets one line too; anything else is a bug
        handled = _usage_error(exc)
        if handled is None:
            raise
        return handled
    return rc if isinstance(rc, int) else 0


def _click_exception_modules() -> list:
    """click's exceptions, and typer's vendored copy of them (typer >= 0.2x raises its own classes)."""
    import click.exceptions

    mods = [click.exceptions]
    try:
        from typer._click import exceptions as vendored
    except ImportError:
        return mods
    return [*mods, vendored]


def _usage_error(exc: Exception) -> int | None:
    """Print a usage error (missing option, bad integer, unknown command) as `error: ...`; its exit code."""
    for mod in _click_exception_modules():
        abort = getattr(mod, "Abort", None)
        if abort is not None and isinstance(exc, abort):
            print("error: aborted", file=sys.stderr)
            return 1
        if not isinstance(exc, mod.ClickException):
            continue
        ctx = getattr(exc, "ctx", None)
        no_args = getattr(mod, "NoArgsIsHelpError", None)
        if no_args is not None and isinstance(exc, no_args) and ctx is not None:
            print(ctx.get_help())  # `calib` or `calib trace` alone: the help, then why it is an error
            print(f"error: {ctx.command_path} needs a command", file=sys.stderr)
            return 2
        msg = " ".join(exc.format_message().split())
        if ctx is not None:
            msg += f" (see: {ctx.command_path} --help)"
        print(f"error: {msg}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2) or 2)
    return None


if __name__ == "__main__":
    sys.exit(main())
