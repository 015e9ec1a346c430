"""`calib validate`: placeholder until its module lands (owned by the issue that delivers it)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Nothing registered yet."""
