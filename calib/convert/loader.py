"""Load a JSON trace file, plain, gzip or xz (by magic bytes), with one-line errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calib.compressed import decompress
from calib.errors import CalibError


def load_json(path: str | Path) -> Any:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CalibError(f"{p}: cannot read: {exc.strerror or exc}") from None
    data = decompress(data, str(p))
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise CalibError(f"{p}: not a JSON trace (bad bytes at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CalibError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); truncated?") from None
