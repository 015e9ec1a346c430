"""Recompress a bundle's kept raw traces (raw/*.json.gz) with xz, losslessly and checked.

    python -m measure.compact_raw BUNDLE_DIR [...]

The committed tree travels with every device call under a 64 MiB limit, and the raw Kineto and host
traces are its largest files: xz keeps the same JSON in less than half the bytes of gzip. Each file is
decompressed again and compared byte for byte before the .gz goes; readers take either (by magic bytes).
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import os
from pathlib import Path

from calib.errors import CalibError

PRESET = 9 | lzma.PRESET_EXTREME


def compact(raw_dir: Path) -> tuple[int, int]:
    """(bytes before, bytes after) for every *.json.gz in raw_dir, each replaced by its .json.xz."""
    before = after = 0
    for gz in sorted(raw_dir.glob("*.json.gz")):
        data = gzip.decompress(gz.read_bytes())
        packed = lzma.compress(data, preset=PRESET)
        if lzma.decompress(packed) != data:
            raise CalibError(f"{gz}: xz round trip differs; left as it was")
        xz = gz.with_suffix(".xz")
        tmp = xz.with_name(xz.name + ".tmp")
        tmp.write_bytes(packed)
        os.replace(tmp, xz)
        before += gz.stat().st_size
        after += len(packed)
        gz.unlink()
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundles", nargs="+")
    for b in ap.parse_args().bundles:
        before, after = compact(Path(b) / "raw")
        print(f"{b}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
