"""The PyTorch host execution trace (ExecutionTraceObserver JSON): ops by rf_id, tree, process groups.

Schema `1.1.1-chakra.0.0.4` is the tested one; other versions are read with a warning, and a
missing field that conversion needs fails with a CalibError naming the file and the field.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib.convert.loader import load_json
from calib.errors import CalibError

TESTED_SCHEMAS = {"1.1.1-chakra.0.0.4"}


@dataclass
class ProcessGroup:
    pg_name: str
    pg_desc: str
    ranks: list[int]  # global ranks; [] = all ranks (torch writes the default group so)
    group_size: int


@dataclass
class CommCall:
    """What record_param_comms says about one collective or P2P call."""

    collective_name: str
    dtype: str
    in_nelems: int
    out_nelems: int
    pg_name: str
    pg_desc: str
    seq: int | None
    is_p2p: bool
    rank_arg: int | None  # own group rank for collectives, the group-local peer for send/recv
    group_size: int


@dataclass
class HostOp:
    id: int
    name: str
    parent: int
    rf_id: int
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    attrs: dict[str, Any]
    comm: CommCall | None = None


@dataclass
class HostTrace:
    path: Path
    schema: str
    pid: int | None
    ops_by_rf: dict[int, HostOp] = field(default_factory=dict)
    ops_by_id: dict[int, HostOp] = field(default_factory=dict)
    groups: dict[str, ProcessGroup] = field(default_factory=dict)
    _step_cache: dict[int, int | None] = field(default_factory=dict)

    def step_of(self, op: HostOp) -> int | None:
        """N of the enclosing `ProfilerStep#N` op, None when there is none."""
        chain: list[int] = []
        cur: HostOp | None = op
        found: int | None = None
        while cur is not None:
            if cur.id in self._step_cache:
                found = self._step_cache[cur.id]
                break
            chain.append(cur.id)
            if cur.name.startswith("ProfilerStep#"):
                try:
                    found = int(cur.name.split("#", 1)[1])
                except ValueError:
                    found = None
                break
            nxt = self.ops_by_id.get(cur.parent)
            cur = nxt if nxt is not None and nxt.id != cur.id else None
        for i in chain:
            self._step_cache[i] = found
        return found


def _need(d: dict[str, Any], key: str, path: Path, what: str) -> Any:
    if key not in d:
        raise CalibError(f"{path}: host execution trace lacks the field {key!r} ({what})")
    return d[key]


def _comm_call(node: dict[str, Any], attrs: dict[str, Any], path: Path) -> CommCall:
    vals = node.get("inputs", {}).get("values", [])
    seq: int | None = None
    is_p2p = False
    rank_arg: int | None = None
    # inputs.values = [tensors?, [seq, isP2P], [pg_name, pg_desc], rank|peer|root, coll_name, ...];
    # the tensor list is absent for `wait`, so locate [int, bool] instead of trusting a position.
    for i, v in enumerate(vals):
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], bool):
            seq, is_p2p = int(v[0]), bool(v[1])
            if i + 2 < len(vals) and isinstance(vals[i + 2], int):
                rank_arg = int(vals[i + 2])
            break
    name = attrs.get("collective_name")
    if name is None:
        raise CalibError(f"{path}: record_param_comms node {node.get('id')} lacks the attribute 'collective_name'")
    return CommCall(
        collective_name=str(name),
        dtype=str(attrs.get("dtype", "")),
        in_nelems=int(attrs.get("in_msg_nelems", 0) or 0),
        out_nelems=int(attrs.get("out_msg_nelems", 0) or 0),
        pg_name=str(attrs.get("pg_name", "0")),
        pg_desc=str(attrs.get("pg_desc", "")),
        seq=seq,
        is_p2p=is_p2p,
        rank_arg=rank_arg,
        group_size=int(attrs.get("pg_size", 0) or 0),
    )


def _groups(node: dict[str, Any], path: Path) -> dict[str, ProcessGroup]:
    vals = node.get("inputs", {}).get("values", [])
    out: dict[str, ProcessGroup] = {}
    if not vals:
        return out
    try:
        items = json.loads(vals[0]) if isinstance(vals[0], str) else vals[0]
        for g in items:
            name = str(g["pg_name"])
            out[name] = ProcessGroup(name, str(g.get("pg_desc", "")), [int(r) for r in g.get("ranks", [])],
                                     int(g.get("group_size", len(g.get("ranks", [])))))
    except (ValueError, KeyError, TypeError) as exc:
        raise CalibError(f"{path}: unreadable process_group:init node: {type(exc).__name__}: {exc}") from None
    return out


def parse_host(data: Any, path: Path) -> HostTrace:
    try:
        return _parse_host(data, path)
    except (TypeError, ValueError, AttributeError) as exc:  # a node of the wrong shape: still one line
        raise CalibError(f"{path}: malformed host execution trace ({type(exc).__name__}: {exc})") from None
    except CalibError as exc:
        schema = data.get("schema") if isinstance(data, dict) else None
        if schema is not None and str(schema) not in TESTED_SCHEMAS and "schema" not in str(exc):
            raise CalibError(f"{exc} (its schema {str(schema)!r} is not one calib was tested with: {', '.join(sorted(TESTED_SCHEMAS))})") from None
        raise


def _parse_host(data: Any, path: Path) -> HostTrace:
    if not isinstance(data, dict):
        raise CalibError(f"{path}: not a PyTorch host execution trace (top level is not an object)")
    schema = str(_need(data, "schema", path, "schema version"))
    if schema not in TESTED_SCHEMAS:
        warnings.warn(f"{path}: host trace schema {schema!r} is not one calib was tested with "
                      f"({', '.join(sorted(TESTED_SCHEMAS))}); reading it anyway", stacklevel=2)
    nodes = _need(data, "nodes", path, "the list of ops")
    if not isinstance(nodes, list):
        raise CalibError(f"{path}: host execution trace field 'nodes' is not a list")
    host = HostTrace(path=path, schema=schema, pid=data.get("pid"))
    for n in nodes:
        nid = _need(n, "id", path, "node id")
        name = str(_need(n, "name", path, f"name of node {nid}"))
        attrs = {a["name"]: a.get("value") for a in n.get("attrs", []) if "name" in a}
        if "rf_id" not in attrs:
            raise CalibError(f"{path}: host execution trace node {nid} lacks the attribute 'rf_id' (needed to link Kineto ops)")
        parent = n.get("ctrl_deps", n.get("parent"))
        if isinstance(parent, list):
            parent = parent[0] if parent else -1
        op = HostOp(int(nid), name, int(parent if parent is not None else -1), int(attrs["rf_id"]),
                    n.get("inputs", {}), n.get("outputs", {}), attrs)
        if name == "record_param_comms":
            op.comm = _comm_call(n, attrs, path)
        elif "process_group:init" in name:
            host.groups.update(_groups(n, path))
        host.ops_by_id[op.id] = op
        # rf_id 0 belongs to the observer's root nodes; real ops have unique non-zero ids.
        if op.rf_id or op.rf_id not in host.ops_by_rf:
            host.ops_by_rf[op.rf_id] = op
    return host


def read_host(path: str | Path) -> HostTrace:
    p = Path(path)
    return parse_host(load_json(p), p)
