"""Recompress a bundle's gzip files with xz, losslessly and checked: its kept raw traces
(raw/*.json.gz) and its Chakra ETs (et/rank.N.et.gz); and a probe round's results (*.json.gz, as
measure.probes.host_phases writes them into traces/*/_probes/host-phases-N). Its parquet tables and its
manifest.json are rewritten as bundles are written now (calib.bundle.io.write_parquet, manifest_text), where that is
smaller and reads back the same.

    python -m measure.compact BUNDLE_OR_PROBE_DIR [...]

The committed tree travels with every device call under a 64 MiB limit, and these are its largest
files: xz keeps the same bytes in about half of gzip's (raw JSON traces under half, ETs ~0.48).
Each file is decompressed again and compared byte for byte before the .gz goes; every reader takes
either (by magic bytes). Bundles converted since round 21 write their ETs in xz already.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from calib.bundle.io import manifest_text, write_parquet
from calib.chakra.codec import XZ_PRESET
from calib.errors import CalibError
from calib.report import write_text_atomic

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
    for table in sorted(bundle.glob("*.parquet")):
        size, new = compact_parquet(table)
        before += size
        after += new
    if (bundle / "manifest.json").is_file():
        size, new = compact_manifest(bundle / "manifest.json")
        before += size
        after += new
    return before, after


def compact_manifest(file: Path) -> tuple[int, int]:
    """(bytes before, bytes after) of a manifest.json rewritten by manifest_text: kept only when it parses back to
    the same object (floats by their shortest repr, NaN included: the written form of what it parses to is itself)
    and is smaller."""
    text = file.read_text()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CalibError(f"{file}: not valid JSON ({exc}); left as it was") from None
    new = manifest_text(data)
    if manifest_text(json.loads(new)) != new:
        raise CalibError(f"{file}: JSON round trip differs; left as it was")
    before, after = len(text.encode()), len(new.encode())
    if after >= before:
        return before, before
    write_text_atomic(file, new)
    return before, after


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """The same schema (with its pandas metadata), nulls and values, floats bit for bit: NaNs count as
    equal to themselves (Table.equals calls two NaNs unequal)."""
    if not a.schema.equals(b.schema, check_metadata=True) or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name].combine_chunks(), b[name].combine_chunks()
        if not x.is_null().equals(y.is_null()):
            return False
        if pa.types.is_floating(x.type):
            bits = {16: pa.uint16(), 32: pa.uint32(), 64: pa.uint64()}[x.type.bit_width]
            if not x.fill_null(0).view(bits).equals(y.fill_null(0).view(bits)):
                return False
        elif not x.equals(y):
            return False
    return True


def compact_parquet(file: Path) -> tuple[int, int]:
    """(bytes before, bytes after) of one parquet table rewritten by write_parquet: kept only when it
    reads back to the same table and is smaller."""
    size = file.stat().st_size
    try:
        table = pq.read_table(file)
    except (OSError, pa.ArrowException) as exc:
        raise CalibError(f"{file}: not a readable parquet file ({exc}); left as it was") from None
    tmp = file.with_name(file.name + ".tmp")
    write_parquet(table, tmp)
    if not same_table(pq.read_table(tmp), table):
        tmp.unlink()
        raise CalibError(f"{file}: parquet round trip differs; left as it was")
    if tmp.stat().st_size >= size:
        tmp.unlink()
        return size, size
    new = tmp.stat().st_size
    os.replace(tmp, file)
    return size, new


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
