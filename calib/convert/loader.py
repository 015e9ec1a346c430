"""Load a JSON trace file, plain, gzip or xz (by magic bytes), with one-line errors naming the file."""

from __future__ import annotations

import gzip
import json
import lzma
import zlib
from pathlib import Path
from typing import Any

from calib.errors import CalibError


def load_json(path: str | Path) -> Any:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CalibError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise CalibError(f"{p}: corrupt or truncated gzip data: {exc}") from None
    elif data[:6] == b"\xfd7zXZ\x00":
        try:
            data = lzma.decompress(data)
        except (lzma.LZMAError, EOFError) as exc:
            raise CalibError(f"{p}: corrupt or truncated xz data: {exc}") from None
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise CalibError(f"{p}: not a JSON trace (bad bytes at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CalibError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); truncated?") from None
