"""ASTRA-sim's input files as calib reads and writes them: per-rank ETs and the comm-group JSON.

`PREFIX.<rank>.et` for every rank (plain, gzip or xz); comm groups `{"<id>": [ranks]}` with ids > 0;
a comm-group path containing "empty" means no groups, as ASTRA-sim reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from calib.chakra.codec import read_et, write_bytes_atomic
from calib.errors import CalibError
from calib.sim.types import SimWorkload


def read_comm_groups(path: str | Path | None, num_ranks: int) -> dict[int, list[int]]:
    if path is None or "empty" in str(path):
        return {}
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibError(f"comm-group configuration {p}: {exc}") from None
    if not isinstance(data, dict):
        raise CalibError(f"comm-group configuration {p}: expected an object {{\"<id>\": [ranks]}}")
    groups: dict[int, list[int]] = {}
    for key, ranks in data.items():
        try:
            gid = int(key)
            members = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise CalibError(f"comm-group configuration {p}: group {key!r} is not an integer id with a list of ranks") from None
        if gid <= 0:
            raise CalibError(f"comm-group configuration {p}: group id {gid} must be > 0")
        bad = [r for r in members if not 0 <= r < num_ranks]
        if bad or not members or len(set(members)) != len(members):
            raise CalibError(f"comm-group configuration {p}: group {gid} has ranks outside 0..{num_ranks - 1} or repeats ({members[:8]})")
        groups[gid] = members
    return groups


def write_comm_groups(groups: dict[int, list[int]], path: str | Path) -> None:
    data = {str(k): list(v) for k, v in sorted(groups.items())}
    write_bytes_atomic(path, json.dumps(data).encode())


def et_path(prefix: str | Path, rank: int) -> Path:
    return Path(f"{prefix}.{rank}.et")


def _existing(plain: Path) -> Path:
    """The plain ET, else its .gz or .xz twin, else the plain name (for the error that names it)."""
    for p in (plain, Path(f"{plain}.gz"), Path(f"{plain}.xz")):
        if p.exists():
            return p
    return plain


def read_workload(prefix: str | Path, num_ranks: int, comm_groups: str | Path | None = None) -> SimWorkload:
    """One class per rank, from `PREFIX.<rank>.et` (a `.et.gz` or `.et.xz` in its place is read too)."""
    traces = {}
    for r in range(num_ranks):
        p = _existing(et_path(prefix, r))
        if not p.exists():
            raise CalibError(f"workload: {p} is missing (the network has {num_ranks} NPUs; one ET per rank)")
        traces[r] = read_et(p)
        if not traces[r].nodes:
            raise CalibError(f"workload: {p} has no nodes (give an idle rank one 0-us COMP node)")
    extra = _existing(et_path(prefix, num_ranks))
    if extra.exists():
        # ASTRA-sim would silently drop the extra ranks: a wrong number, not a result.
        raise CalibError(f"workload: {extra} exists but the network has only {num_ranks} NPUs (ET count and network dimensions differ)")
    return SimWorkload.per_rank(traces, read_comm_groups(comm_groups, num_ranks))
