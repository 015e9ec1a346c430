"""Convert the PyTorch traces of a run (host ET + Kineto per rank) to per-rank Chakra ETs.

Everything is converted in memory first; files are written only when every rank converted, each
atomically, so a failure never leaves a set of outputs that looks complete.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calib.chakra.codec import encode, write_bytes_atomic, write_et
from calib.chakra.model import ExecutionTrace
from calib.convert.build import CommInstance, RankBuild, build_rank
from calib.convert.host import read_host
from calib.convert.kineto import read_kineto
from calib.convert.link import link
from calib.errors import CalibError

KERNEL_COLUMNS = ["rank", "step", "stream", "name", "op_class", "start_s", "time_s",
                  "aten_op", "m", "n", "k", "batch", "flops", "bytes", "dtype"]
COLLECTIVE_COLUMNS = ["rank", "pg_name", "seq", "kind", "group_size", "bytes", "time_s", "wait_s", "transfer_s"]
_TRACE_NAME = re.compile(r"^(host|device)\.(\d+)\.json(\.gz)?$")


@dataclass
class RunConversion:
    traces: dict[int, ExecutionTrace]
    comm_groups: dict[int, list[int]]  # ASTRA-sim comm-group file: pg id -> global ranks (world group omitted)
    kernels: pd.DataFrame
    collectives: pd.DataFrame
    builds: dict[int, RankBuild] = field(default_factory=dict, repr=False)


def transfer_split(starts: Any, durations: Any) -> tuple[Any, Any]:
    """(wait, transfer) of each member of a collective call from its kernel's start and duration (one clock): the
    transfer starts when the last member arrives, so a member waits that long, at most its whole kernel.

    Arrays of members (axis 0), or of members x calls; measure.collectives times its harness's calls this way too.
    """
    start, dur = np.asarray(starts), np.asarray(durations)
    wait = np.minimum(start.max(axis=0) - start, dur)
    return wait, dur - wait


def _align(builds: dict[int, RankBuild]) -> None:
    """The wait/transfer split of the same call (pg, seq) on every member (`transfer_split`).

    Assumes the ranks' clocks agree (one host: Kineto converts GPU times to the host clock).
    Calls whose peers' traces are missing keep no split.
    """
    by_key: dict[tuple[object, ...], list[CommInstance]] = {}
    for b in builds.values():
        for ci in b.comms:
            by_key.setdefault(ci.key, []).append(ci)
    for key, group in by_key.items():
        expected = 2 if key[0] == "p2p" else group[0].op.comm.group_size  # type: ignore[union-attr]
        if len({ci.rank for ci in group}) != expected or len(group) != expected:
            continue
        waits, transfers = transfer_split([ci.start_ns for ci in group], [ci.dur_ns for ci in group])
        for ci, wait, transfer in zip(group, waits, transfers, strict=True):
            ci.node.set_attr("wait_ns", int(wait))
            ci.node.set_attr("transfer_ns", int(transfer))


def _comm_groups(builds: dict[int, RankBuild]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for b in builds.values():
        for pg, ranks in b.groups.items():
            if pg in ("", "0"):
                continue  # the default (world) group needs no entry
            try:
                gid = int(pg)
            except ValueError as exc:
                raise CalibError(f"process group name {pg!r} is not an integer id; ASTRA-sim needs one") from exc
            if gid in out and out[gid] != ranks:
                raise CalibError(f"process group {pg} has ranks {out[gid]} on one rank and {ranks} on another")
            out[gid] = list(ranks)
    return dict(sorted(out.items()))


def _tables(builds: dict[int, RankBuild], base_ns: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    krows: list[dict[str, object]] = []
    crows: list[dict[str, object]] = []
    for rank, b in sorted(builds.items()):
        for op, node in zip(b.ops, b.trace.nodes, strict=True):
            act = op.act
            if op.comm is None:
                r = op.record
                krows.append({
                    "rank": rank, "step": op.step, "stream": act.stream, "name": act.name, "op_class": r.op_class,
                    "start_s": (base_ns[rank] + act.start_ns) * 1e-9, "time_s": act.dur_ns * 1e-9,
                    "aten_op": op.aten_op, "m": r.m, "n": r.n, "k": r.k, "batch": r.batch,
                    "flops": r.flops, "bytes": r.bytes, "dtype": r.dtype,
                })
            else:
                c = op.comm
                wait = node.attr("wait_ns")
                crows.append({
                    "rank": rank, "pg_name": c.pg_name, "seq": c.seq if c.seq is not None else -1, "kind": c.kind,
                    "group_size": c.group_size if c.comm_type is not None else 2, "bytes": c.nccl_bytes,
                    "time_s": act.dur_ns * 1e-9,
                    "wait_s": wait * 1e-9 if wait is not None else math.nan,
                    "transfer_s": (act.dur_ns - wait) * 1e-9 if wait is not None else math.nan,
                })
    kernels = pd.DataFrame(krows, columns=KERNEL_COLUMNS)
    collectives = pd.DataFrame(crows, columns=COLLECTIVE_COLUMNS)
    return kernels, collectives


def convert_traces(host_paths: dict[int, Path], device_paths: dict[int, Path]) -> RunConversion:
    """Convert the given ranks (rank -> host trace, rank -> Kineto trace); nothing is written."""
    if set(host_paths) != set(device_paths):
        raise CalibError(f"host traces for ranks {sorted(host_paths)} but device traces for ranks {sorted(device_paths)}")
    if not host_paths:
        raise CalibError("no traces to convert")
    builds: dict[int, RankBuild] = {}
    base_ns: dict[int, int] = {}
    for rank in sorted(host_paths):
        host = read_host(host_paths[rank])
        kt = read_kineto(device_paths[rank])
        if kt.rank is not None and kt.rank != rank:
            raise CalibError(f"{kt.path}: Kineto says rank {kt.rank}, expected rank {rank} (traces of different ranks?)")
        if not kt.gpu:
            raise CalibError(f"{kt.path}: no GPU kernels, memcpys or memsets (profiler run without CUDA activity?)")
        builds[rank] = build_rank(rank, link(host, kt, rank), kt, host.path.name)
        base_ns[rank] = kt.base_time_ns
    _align(builds)
    kernels, collectives = _tables(builds, base_ns)
    return RunConversion({r: b.trace for r, b in builds.items()}, _comm_groups(builds), kernels, collectives, builds)


def find_rank_traces(run_dir: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    """host.N.json[.gz] and device.N.json[.gz] of a run folder, by rank."""
    if not run_dir.is_dir():
        raise CalibError(f"{run_dir}: not a folder")
    found: dict[str, dict[int, Path]] = {"host": {}, "device": {}}
    for p in sorted(run_dir.iterdir()):
        m = _TRACE_NAME.match(p.name)
        if m:
            kind, rank = m.group(1), int(m.group(2))
            if rank in found[kind]:
                raise CalibError(f"{run_dir}: two {kind} traces for rank {rank} ({found[kind][rank].name}, {p.name})")
            found[kind][rank] = p
    if not found["host"] and not found["device"]:
        raise CalibError(f"{run_dir}: no host.N.json[.gz] / device.N.json[.gz] traces")
    for a, b in (("host", "device"), ("device", "host")):
        lone = sorted(set(found[a]) - set(found[b]))
        if lone:
            raise CalibError(f"{run_dir}: rank {lone[0]} has a {a} trace but no {b} trace")
    return found["host"], found["device"]


def write_outputs(conv: RunConversion, out_dir: Path, compress: bool = False) -> None:
    # Encode every rank before writing any: a rank that cannot be encoded must not leave the
    # others behind as a run folder that looks converted.
    suffix = ".et.gz" if compress else ".et"
    blobs: dict[str, bytes] = {}
    for rank, trace in sorted(conv.traces.items()):
        data = encode(trace)
        blobs[f"rank.{rank}{suffix}"] = gzip.compress(data, mtime=0) if compress else data
    groups = {str(k): v for k, v in conv.comm_groups.items()}
    blobs["comm_groups.json"] = (json.dumps(groups, indent=1) + "\n").encode()
    if out_dir.exists() and not out_dir.is_dir():
        raise CalibError(f"{out_dir}: cannot write the rank ETs there: it is a file, expected a folder")
    for name, data in blobs.items():
        write_bytes_atomic(out_dir / name, data)


def convert_run(run_dir: str | Path, out_dir: str | Path, compress: bool = False) -> RunConversion:
    """All ranks of a run folder -> OUT_DIR/rank.N.et (or .et.gz) + comm_groups.json."""
    hosts, devices = find_rank_traces(Path(run_dir))
    conv = convert_traces(hosts, devices)
    write_outputs(conv, Path(out_dir), compress)
    return conv


def _rank_from_name(path: Path) -> int | None:
    m = re.search(r"\.(\d+)\.(json|et)", path.name)
    return int(m.group(1)) if m else None


def convert_pair(host: str | Path, device: str | Path, out: str | Path) -> RunConversion:
    """One rank: HOST + DEVICE -> OUT (an .et or .et.gz file); the rank comes from Kineto or the file name."""
    hp, dp = Path(host), Path(device)
    hr, dr = _rank_from_name(hp), _rank_from_name(dp)
    if hr is not None and dr is not None and hr != dr:
        raise CalibError(f"{hp} is rank {hr} but {dp} is rank {dr}: traces of different ranks")
    rank = dr if dr is not None else hr
    if rank is None:  # names without a rank: ask the Kineto trace
        rank = read_kineto(dp).rank or 0
    conv = convert_traces({rank: hp}, {rank: dp})
    write_et(conv.traces[rank], out)
    return conv
