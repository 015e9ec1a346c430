"""Checks on output paths, made before any work so that a bad one costs one line, not minutes."""

from __future__ import annotations

from pathlib import Path

from calib.errors import CalibError


def check_output_folder(path: str | Path, option: str) -> Path:
    """Refuse a folder argument that is a file or lies under a file."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "is a file" if p == path else f"lies under {p}, which is a file"
            raise CalibError(f"{option} {path} {where}; name a folder")
    return path
