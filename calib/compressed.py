"""Bytes that may be gzip or xz compressed, told apart by their magic bytes (not the file name): the
one reader of compressed traces, for the ET codec and the JSON trace loader alike."""

from __future__ import annotations

import gzip
import lzma
import zlib

from calib.errors import CalibError

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"


def decompress(data: bytes, source: str) -> bytes:
    """`data` decompressed if it starts with a gzip or xz header, else as it is; corrupt or truncated
    compressed data is one CalibError naming `source`."""
    if data[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise CalibError(f"{source}: corrupt or truncated gzip data: {exc}") from None
    if data[:6] == XZ_MAGIC:
        try:
            return lzma.decompress(data)
        except (lzma.LZMAError, EOFError) as exc:
            raise CalibError(f"{source}: corrupt or truncated xz data: {exc}") from None
    return data
