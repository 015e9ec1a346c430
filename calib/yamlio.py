"""Reading a YAML file with calib's one-line errors (one place for every YAML input)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from calib.errors import CalibError


def load_yaml(path: str | os.PathLike, what: str) -> Any:
    """Parse `path`; `what` names the file in errors ("calibration file", "cluster file" ...)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise CalibError(f"{what} {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibError(f"{what} {p}: {str(exc).splitlines()[0]}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CalibError(f"{what} {p}: not valid YAML ({str(exc).splitlines()[0]})") from None
