"""Recompress a bundle's gzip files with xz, losslessly and checked: its kept raw traces
(raw/*.json.gz) and its Chakra ETs (et/rank.N.et.gz); and a probe round's results (*.json.gz, as
measure.probes.host_phases writes them into traces/*/_probes/host-phases-N).

    python -m measure.compact BUNDLE_OR_PROBE_DIR [...]

The committed tree travels with every device call under a 64 MiB limit, and these are its largest
files: xz keeps the same bytes in about half of gzip's (raw JSON traces under half, ETs ~0.48).
Each file is decompressed again and compared byte for byte before the .gz goes; every reader takes
either (by magic bytes). Bundles converted since round 21 write their ETs in xz already.
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import os
import zlib
from pathlib import Path

from calib.chakra.codec import XZ_PRESET
from calib.errors import CalibError

PATTERNS = ("raw/*.json.gz", "et/rank.*.et.gz", "*.json.gz")


def compact(bundle: Path) -> tuple[int, int]:
    """(bytes before, bytes after) over every gzip file of PATTERNS in `bundle`, each replaced by its .xz."""
    before = after = 0
    for gz in sorted(p for pattern in PATTERNS for p in bundle.glob(pattern)):
        try:  # gzip itself, not calib.compressed.decompress: a file named .gz must be gzip to be recompressed
            data = gzip.decompress(gz.read_bytes())
        except (OSError, EOFError, zlib.error) as exc:
            raise CalibError(f"{gz}: not a readable gzip file ({exc}); left as it was") from None
        packed = lzma.compress(data, preset=XZ_PRESET)
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
        try:
            before, after = compact(Path(b))
        except CalibError as exc:
            raise SystemExit(f"compact: {exc}") from None
        if before:
            print(f"{b}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
