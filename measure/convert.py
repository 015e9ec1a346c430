"""Profiled step -> Chakra ETs and kernel/collective tables in a bundle, through calib.convert.

The raw traces (PyTorch host execution trace + Kineto trace per rank) are converted with calib's
own converter (docs/contracts.md). Where the converter is missing or fails, the run is still a
measurement: the raw traces are kept gzipped under raw/ so that `calib measure convert BUNDLE`
can produce the ETs later.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from calib.bundle.io import write_parquet
from calib.bundle.schema import COLLECTIVE_COLUMNS, KERNEL_COLUMNS
from calib.errors import CalibError
from measure.conventions import bandwidths_gbps


def raw_paths(folder: Path, world: int) -> tuple[dict[int, Path], dict[int, Path]]:
    """host.N.json(.gz|.xz) and device.N.json(.gz|.xz) for every rank that has both."""
    host, dev = {}, {}
    for r in range(world):
        for suffix in (".json", ".json.gz", ".json.xz"):
            h, d = folder / f"host.{r}{suffix}", folder / f"device.{r}{suffix}"
            if h.is_file() and d.is_file():
                host[r], dev[r] = h, d
    return host, dev


def convert_to(bundle_dir: Path, host: dict[int, Path], dev: dict[int, Path], step: int) -> dict:
    """Write et/, kernels.parquet and collectives.parquet into bundle_dir; return notes about it."""
    from calib.chakra.codec import write_et
    from calib.convert import convert_traces

    with tempfile.TemporaryDirectory() as tmp:
        host_plain = {r: _plain(p, Path(tmp)) for r, p in host.items()}
        dev_plain = {r: _plain(p, Path(tmp)) for r, p in dev.items()}
        conv = convert_traces(host_plain, dev_plain)
    et = bundle_dir / "et"
    et.mkdir(exist_ok=True)
    for rank, trace in sorted(conv.traces.items()):
        write_et(trace, et / f"rank.{rank}.et.xz")
        (et / f"rank.{rank}.et.gz").unlink(missing_ok=True)  # an older conversion's, which would stand beside it
    groups = {str(k): list(v) for k, v in sorted(conv.comm_groups.items())}
    _atomic_text(et / "comm_groups.json", json.dumps(groups, indent=1))
    kernels = conv.kernels.copy()
    if "step" not in kernels.columns or kernels["step"].isna().all():
        kernels["step"] = step
    missing = [c for c in KERNEL_COLUMNS if c not in kernels.columns]
    if missing:
        raise CalibError(f"converter's kernel table lacks column(s) {', '.join(missing)}")
    write_parquet(kernels, bundle_dir / "kernels.parquet")
    coll = collective_table(conv.collectives)
    write_parquet(coll, bundle_dir / "collectives.parquet")
    return {"et": f"converted by calib.convert: {len(conv.traces)} ranks", "et_step": step}


def collective_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per-instance collectives of a training step -> collectives.parquet rows (repeats = 1)."""
    out = df.copy()
    for col in ("kind", "group_size", "bytes", "time_s", "wait_s", "transfer_s"):
        if col not in out.columns:
            out[col] = pd.NA
    bw = [
        bandwidths_gbps(str(k), int(n), float(b), float(t))
        if pd.notna(n) and pd.notna(b) and pd.notna(t) else (float("nan"), float("nan"))
        for k, n, b, t in zip(out["kind"], out["group_size"], out["bytes"], out["transfer_s"], strict=False)
    ]
    out["algbw_gbps"] = [a for a, _ in bw]
    out["busbw_gbps"] = [b for _, b in bw]
    out["repeats"] = 1
    first = [c for c in COLLECTIVE_COLUMNS]
    return out[first + [c for c in out.columns if c not in first]]


def keep_raw(work: Path, raw_dir: Path, world: int, gz: bool = True) -> None:
    """Keep the raw traces in the bundle's raw/ folder, gzipped (or plain JSON when gz is False)."""
    raw_dir.mkdir(exist_ok=True)
    for r in range(world):
        for kind in ("host", "device"):
            src = work / f"{kind}.{r}.json"
            if src.is_file() and not gz:
                shutil.move(src, raw_dir / src.name)
            elif src.is_file():
                with open(src, "rb") as a, gzip.open(raw_dir / f"{kind}.{r}.json.gz", "wb", compresslevel=6) as b:
                    shutil.copyfileobj(a, b)


def _plain(path: Path, tmp: Path) -> Path:
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix)
    if opener is None:
        return path
    dst = tmp / path.name[:-3]
    with opener(path, "rb") as a, open(dst, "wb") as b:
        shutil.copyfileobj(a, b)
    return dst


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
