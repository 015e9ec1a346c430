"""Held-out results kept between `calib validate` runs, keyed by everything they are computed from.

A held-out entry refits every model without one configuration and rebuilds it: 24-40 s per configuration
on one core once its process has read the bundles (benchmarks/heldout_fit.py), about half an hour for the
committed H200 runs on 2 cores. It is a pure function of the
bundles (the left-out ones and the ones fitted on, by name and content hash, in order) and of the
code that fits and simulates (every file of the calib package but the fitted calibration files and
the modules that only present results: the report writer, the commands), the cluster presets in simconfigs/, and the versions of Python and the numeric libraries). The key is a
hash of all of them, so any change to code, presets, libraries or bundles misses and recomputes;
only entries whose fit and predictions all succeeded are kept, so a failure is always recomputed
and reported afresh.

The cache lives in $CALIB_CACHE_DIR, else $XDG_CACHE_HOME/calib, else ~/.cache/calib
(`heldout/<key>.json`); `calib validate --no-cache` neither reads nor writes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from calib.bundle.io import bundle_sha256

CACHE_ENV = "CALIB_CACHE_DIR"
PACKAGE = Path(__file__).resolve().parent.parent
# Fitted on the bundles, not read by a held-out fit (it fits its own): `calib validate` rewrites
# their `validation` section, which must not invalidate the cache it was computed from. The report's
# writer and the command line only present what a held-out fit returned.
NOT_INPUTS = ("calibration-*.yaml", "validation/report.py", "commands/*.py", "cli.py")
LIBRARIES = ("numpy", "pandas", "scikit-learn", "scipy", "pyarrow", "pyyaml")


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "calib"


def _files(root: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc" and not any(p.match(pat) for pat in skip))


@functools.cache
def code_digest() -> str:
    """Hash of the code and configuration a held-out result depends on (see the module docstring)."""
    from calib.cluster import SIMCONFIGS

    h = hashlib.sha256(sys.version.encode())
    for lib in LIBRARIES:
        try:
            h.update(f"{lib}={metadata.version(lib)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{lib}=-".encode())
    for root, skip in ((PACKAGE, NOT_INPUTS), (SIMCONFIGS, ())):
        for f in _files(root, skip):
            h.update(f"{root.name}/{f.relative_to(root)}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def heldout_key(group_paths: list[str], other_paths: list[str],
                sha: Callable[[str], str] = bundle_sha256) -> str:
    """The key of one held-out configuration: code, then the left-out and the fitted-on bundles
    (`sha`: a bundle's content hash, memoised by a caller that keys many configurations)."""
    h = hashlib.sha256(code_digest().encode())
    for tag, paths in ((b"heldout", group_paths), (b"fitted_on", other_paths)):
        h.update(tag)
        for p in paths:
            h.update(f"{Path(p).name}:{sha(p)}".encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / "heldout" / f"{key}.json"


def load_heldout(key: str) -> dict | None:
    """The stored result under `key`, or None (absent, unreadable or not of this key: recompute)."""
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    return data.get("result") if isinstance(data, dict) and data.get("key") == key else None


def cacheable(result: dict) -> bool:
    """Only a held-out result whose fit and every prediction succeeded is kept."""
    preds = result.get("predictions") or {}
    return not result.get("note") and bool(preds) and all("step_s" in p for p in preds.values())


def store_heldout(key: str, result: dict) -> bool:
    """Keep `result` under `key` when it is cacheable; an unwritable cache only costs the reuse."""
    if not cacheable(result):
        return False
    from calib.report import write_text_atomic

    try:
        write_text_atomic(_path(key), json.dumps({"key": key, "result": result}))
    except OSError:
        return False
    return True
