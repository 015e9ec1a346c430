"""Read, write (atomically) and check measurement bundles.

Writing: everything goes into `<dir>.partial/`; `finish()` writes manifest.json last and renames
the folder into place, so a bundle folder without `.partial` and with status "complete" is whole.
`fail(reason)` does the same with status "failed": a crashed run never leaves a bundle that looks
complete. A killed process leaves only the `.partial` folder, which readers refuse.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from calib.bundle.schema import (
    KINDS,
    REQUIRED_TABLES,
    SCHEMA,
    STATUSES,
    TABLE_COLUMNS,
    TELEMETRY_REQUIRED,
    Manifest,
)
from calib.errors import CalibError

T = TypeVar("T")

PARTIAL = ".partial"
# Bundle tables travel with every device call under a 64 MiB limit: zstd at its strongest, and of four
# column encodings whichever is smallest for the table. Floats split by byte stream (telemetry's
# timestamps and counters repeat their high bytes) suit some; the kernel tables' names and op classes
# compress ~18 % smaller without dictionaries on their integers and floats; small tables smallest plain;
# and each column's own smallest beat all three by 4.7 % over the committed tables (1.54 of 32.7 MiB:
# telemetry's timestamps split by byte stream beside its power readings plain). measure.compact
# recompresses older bundles. zstd's level 22 saved 0.05 % more than 19.
PARQUET_ZSTD_LEVEL = 19


def _encoded(t: pa.Table, enc: dict) -> bytes:
    """`t` as a bundle table's bytes with the column encodings `enc` (write_table's options)."""
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf, compression="zstd", compression_level=PARQUET_ZSTD_LEVEL, **enc)
    return buf.getvalue().to_pybytes()


def _per_column(t: pa.Table) -> dict:
    """Each column's smallest encoding of plain, dictionary and (floats) byte stream split, as one write's options."""
    plain = {"use_dictionary": False, "use_byte_stream_split": False}
    dictionary, split = [], []
    for f in t.schema:
        col = t.select([f.name])
        options = {"plain": plain, "dictionary": {**plain, "use_dictionary": True}}
        if pa.types.is_floating(f.type):
            options["split"] = {**plain, "use_byte_stream_split": True}
        best = min(options, key=lambda k: len(_encoded(col, options[k])))
        (dictionary if best == "dictionary" else split if best == "split" else []).append(f.name)
    return {"use_dictionary": dictionary or False, "use_byte_stream_split": split or False}


def _encodings(t: pa.Table) -> list[dict]:
    floats = [f.name for f in t.schema if pa.types.is_floating(f.type)]
    strings = [f.name for f in t.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    others = [n for n in t.column_names if n not in floats]
    return [{"use_dictionary": others or False, "use_byte_stream_split": floats or False},
            {"use_dictionary": strings or False, "use_byte_stream_split": False},
            {"use_dictionary": False, "use_byte_stream_split": False},
            _per_column(t)]


def write_parquet(table: pd.DataFrame | pa.Table, path: str | os.PathLike) -> None:
    """Write one bundle table as every bundle table is written (the one place that says how): the
    smallest of `_encodings`, the same values whichever."""
    t = pa.Table.from_pandas(table, preserve_index=False) if isinstance(table, pd.DataFrame) else table
    Path(path).write_bytes(min((_encoded(t, enc) for enc in _encodings(t)), key=len))


def manifest_text(data: dict) -> str:
    """A manifest as every bundle's manifest.json holds it (the one place that says how): keys sorted, no whitespace
    between tokens. Each committed bundle's manifest travels with every device call under the 64 MiB limit, and the
    indented form took 0.43 MiB more over the committed bundles; `python -m json.tool` shows one indented."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BundleWriter:
    """Collects a bundle in `<path>.partial/` and moves it into place when finished or failed."""

    def __init__(self, path: str | os.PathLike, manifest: Manifest, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + PARTIAL)
        self.manifest = manifest
        if self.path.exists() and not overwrite:
            raise CalibError(f"bundle {self.path} already exists (use another output or --overwrite)")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        if not manifest.created_utc:
            manifest.created_utc = utc_now()

    def dir(self, sub: str = "") -> Path:
        d = self.tmp / sub if sub else self.tmp
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write_table(self, name: str, df: pd.DataFrame) -> None:
        missing = [c for c in TABLE_COLUMNS[name] if c not in df.columns]
        if missing:
            raise CalibError(f"table {name}: missing column(s) {', '.join(missing)}")
        write_parquet(df, self.tmp / f"{name}.parquet")

    def _seal(self) -> Path:
        (self.tmp / "manifest.json").write_text(manifest_text(self.manifest.to_dict()))
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.tmp, self.path)
        return self.path

    def finish(self) -> Path:
        self.manifest.status = "complete"
        self.manifest.failure = ""
        return self._seal()

    def fail(self, reason: str) -> Path:
        self.manifest.status = "failed"
        self.manifest.failure = " ".join(reason.split())
        return self._seal()


@dataclass
class Bundle:
    path: Path
    manifest: Manifest
    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    _derived: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.path.name

    def has(self, table: str) -> bool:
        return (self.path / f"{table}.parquet").is_file()

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            file = self.path / f"{name}.parquet"
            if not file.is_file():
                raise CalibError(f"bundle {self.path}: has no {name} table")
            try:
                self._tables[name] = pd.read_parquet(file)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
                raise CalibError(f"bundle {self.path}: {name}.parquet is unreadable ({exc})") from None
        return self._tables[name]

    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`, a value derived from this bundle's files alone, computed once per Bundle object as
        its tables are read once. `calib validate` refits every model once per held-out configuration on
        the same bundles; their points, read again each time, were about a third of a held-out fit.
        Callers must not change what it returns."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def et_files(self) -> list[Path]:
        """et/rank.N.et[.gz|.xz], one per rank in rank order; two files of one rank are refused (which
        would stand for it is a guess)."""
        d = self.path / "et"
        by_rank: dict[int, list[Path]] = {}
        for f in d.glob("rank.*.et*") if d.is_dir() else []:
            rank = f.name.split(".")[1]
            if not rank.isdigit():
                raise CalibError(f"bundle {self.path}: et/{f.name} is not named rank.N.et[.gz|.xz]")
            by_rank.setdefault(int(rank), []).append(f)
        twice = sorted(r for r, fs in by_rank.items() if len(fs) > 1)
        if twice:
            raise CalibError(f"bundle {self.path}: et/ has more than one file for rank(s) {twice} (e.g. .et.gz and .et.xz)")
        return [by_rank[r][0] for r in sorted(by_rank)]

    def sha256(self) -> str:
        return bundle_sha256(self.path)


def bundle_sha256(path: str | os.PathLike) -> str:
    """Content hash of every file in the bundle (names and bytes), independent of mtime."""
    root = Path(path)
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(file.relative_to(root)).encode())
        h.update(b"\0")
        h.update(file.read_bytes())
    return h.hexdigest()


def update_notes(path: str | os.PathLike, notes: dict) -> None:
    """Merge `notes` into the notes of the bundle manifest at `path`, rewriting it atomically and
    leaving every other field as written (later fixes and links record themselves there)."""
    from calib.report import write_text_atomic  # lazily: bundle readers need not load the report code

    manifest = Path(path) / "manifest.json"
    data = json.loads(manifest.read_text())
    data.setdefault("notes", {}).update(notes)
    write_text_atomic(manifest, manifest_text(data))


def steps_span_s(steps: pd.DataFrame) -> tuple[float, float]:
    """(first start, last end) in seconds of the steps in a steps table: the window telemetry is read in."""
    return float(steps["start_s"].min()), float((steps["start_s"] + steps["time_s"]).max())


def read_bundle(path: str | os.PathLike, require_complete: bool = True) -> Bundle:
    """Open a bundle; refuse a partial, failed (unless asked) or unknown-schema one in one line."""
    p = Path(path)
    if p.name.endswith(PARTIAL):
        raise CalibError(f"bundle {p} is incomplete: its run never finished (a .partial folder)")
    if not p.is_dir():
        raise CalibError(f"bundle {p} does not exist or is not a folder")
    mf = p / "manifest.json"
    if not mf.is_file():
        raise CalibError(f"bundle {p} has no manifest.json: incomplete or not a bundle")
    try:
        data = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CalibError(f"bundle {p}: manifest.json is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(data, dict):
        raise CalibError(f"bundle {p}: manifest.json is not a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise CalibError(f"bundle {p}: schema {schema!r} is not supported (this calib reads {SCHEMA!r})")
    if data.get("kind") not in KINDS:
        raise CalibError(f"bundle {p}: kind {data.get('kind')!r} is not one of {', '.join(KINDS)}")
    if data.get("status") not in STATUSES:
        raise CalibError(f"bundle {p}: status {data.get('status')!r} is not one of {', '.join(STATUSES)}")
    try:
        manifest = Manifest.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CalibError(f"bundle {p}: manifest.json is malformed ({type(exc).__name__}: {exc})") from None
    if require_complete and manifest.status != "complete":
        raise CalibError(f"bundle {p} is a failed run: {manifest.failure or 'no reason recorded'}")
    return Bundle(p, manifest)


def check_bundle(bundle: Bundle) -> list[str]:
    """Problems that make a complete bundle unusable; empty when it is fine."""
    problems: list[str] = []
    m = bundle.manifest
    for table in REQUIRED_TABLES[m.kind]:
        if not bundle.has(table):
            problems.append(f"missing {table}.parquet")
    for name, columns in TABLE_COLUMNS.items():
        if not bundle.has(name):
            continue
        df = bundle.table(name)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            problems.append(f"{name}.parquet lacks column(s) {', '.join(missing)}")
    if m.kind == "training":
        if m.spec is None:
            problems.append("training bundle without a spec")
        elif bundle.has("steps"):
            world = m.spec.tp * m.spec.pp * m.spec.dp
            ranks = set(bundle.table("steps")["rank"].unique().tolist())
            lost = sorted(set(range(world)) - ranks)
            if lost:
                problems.append(f"steps.parquet has no rows for rank(s) {lost} of {world}")
            times = bundle.table("steps").get("time_s")
            if times is not None and times.isna().any():
                problems.append("steps.parquet has NaN step times")
            elif times is not None and (times <= 0).any():
                problems.append("steps.parquet has step times <= 0 s")
        if m.steps.profiled and m.spec is not None:
            world = m.spec.tp * m.spec.pp * m.spec.dp
            have = {int(f.name.split(".")[1]) for f in bundle.et_files()}
            lost = sorted(set(range(world)) - have)
            if lost:
                problems.append(f"et/ lacks rank(s) {lost}")
    for name in ("kernels", "collectives"):
        if bundle.has(name) and "time_s" in bundle.table(name).columns:
            t = bundle.table(name)["time_s"]
            if t.isna().any() or (t < 0).any():
                problems.append(f"{name}.parquet has NaN or negative time_s")
    if bundle.has("host_pace"):
        work = bundle.table("host_pace").get("work_s")
        if work is not None and (work.isna().any() or (work <= 0).any()):
            problems.append("host_pace.parquet has NaN or non-positive work_s")
    if bundle.has("telemetry"):
        df = bundle.table("telemetry")
        for col in TELEMETRY_REQUIRED:
            if col in df.columns and df[col].isna().any():
                problems.append(f"telemetry.parquet has NaN in {col}")
    return problems


def load_bundles(paths: list[str | os.PathLike], kinds: tuple[str, ...] = KINDS) -> list[Bundle]:
    """Expand folders that hold bundles (traces/, traces/h200) and open every complete bundle.

    A directory with a manifest.json is a bundle; any other directory is searched below.
    Failed bundles are skipped when found by search, refused when named directly.
    """
    found: list[Bundle] = []
    for raw in paths:
        p = Path(raw)
        if (p / "manifest.json").is_file() or p.name.endswith(PARTIAL):
            found.append(read_bundle(p))
            continue
        if not p.is_dir():
            raise CalibError(f"{p} is neither a bundle nor a folder of bundles")
        if not any(p.rglob("manifest.json")) and any(p.glob("*.parquet")):
            raise CalibError(f"bundle {p} has no manifest.json: incomplete or not a bundle")
        for mf in sorted(p.rglob("manifest.json")):
            if any(part.endswith(PARTIAL) for part in mf.parts):
                continue
            b = read_bundle(mf.parent, require_complete=False)
            if b.manifest.status == "complete":
                found.append(b)
    out = [b for b in found if b.manifest.kind in kinds]
    for b in out:
        problems = check_bundle(b)
        if problems:
            raise CalibError(f"bundle {b.path}: {problems[0]}")
    return out



