"""Link Kineto GPU activities to host ops, and describe each collective / P2P call.

kernel/memcpy/memset --(args.correlation)--> runtime launch --(thread, External id)--> Kineto CPU op
--("Record function id" == rf_id)--> host op. An NCCL kernel links to its record_param_comms op,
which gives the collective's name, sizes, process group and sequence number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from calib.chakra.model import CommType
from calib.convert.host import CommCall, HostOp, HostTrace
from calib.convert.kineto import GpuActivity, KinetoTrace, RuntimeCall, enclosing_cpu_op, step_at
from calib.errors import CalibError
from calib.ops import (
    COMM_DTYPE_BYTES,
    OpRecord,
    causal_of,
    classify,
    index_pieces,
    is_split_k_reduce,
    largest_operand_bytes,
    split_k_reduce_record,
)

MISMATCH_FRACTION = 0.1  # more unlinkable or renamed ops than this: the two files are not one run


@dataclass(slots=True)
class CommInfo:
    kind: str  # allreduce | allgather | reducescatter | alltoall | broadcast | reduce | gather | scatter | send | recv
    comm_type: CommType | None  # None for send/recv
    pg_name: str
    pg_desc: str
    seq: int | None
    group_size: int
    ranks: list[int]  # global ranks of the group
    in_bytes: int
    out_bytes: int
    peer: int | None = None  # global rank of the P2P peer

    @property
    def comm_size(self) -> int:
        """ASTRA-sim's comm_size: the input buffer (all-gather: the per-rank shard; reduce-scatter: the whole input)."""
        return self.in_bytes

    @property
    def nccl_bytes(self) -> int:
        """nccl-tests' size: all-gather by its output, reduce-scatter by its input, others by the buffer."""
        return max(self.in_bytes, self.out_bytes)


@dataclass(slots=True)
class LinkedOp:
    act: GpuActivity
    launch: RuntimeCall | None
    host: HostOp | None
    aten_op: str
    step: int
    record: OpRecord
    comm: CommInfo | None
    part: int = 0  # > 0: one more call of a coalesced NCCL kernel whose part 0 holds the kernel itself


_KINDS: list[tuple[str, str, CommType | None]] = [
    ("allreduce", "allreduce", CommType.ALL_REDUCE),
    ("allgather", "allgather", CommType.ALL_GATHER),
    ("reducescatter", "reducescatter", CommType.REDUCE_SCATTER),
    ("alltoall", "alltoall", CommType.ALL_TO_ALL),
    ("broadcast", "broadcast", CommType.BROADCAST),
    # ProcessGroupNCCL implements barrier as an all-reduce of one element: that is what ran
    ("barrier", "allreduce", CommType.ALL_REDUCE),
]
_EXACT: dict[str, tuple[str, CommType | None]] = {
    "send": ("send", None),
    "recv": ("recv", None),
    "reduce": ("reduce", CommType.REDUCE),
    "gather": ("gather", CommType.GATHER),
    "scatter": ("scatter", CommType.SCATTER),
}


def comm_kind(collective_name: str) -> tuple[str, CommType | None] | None:
    """("allgather", ALL_GATHER) for "_allgather_base"; None when the name is not a known collective."""
    n = collective_name.lower().replace("_", "").replace("coalesced", "").replace("base", "")
    n = n.replace("intotensor", "").replace("tensor", "")
    if n in _EXACT:
        return _EXACT[n]
    for key, kind, ct in _KINDS:
        if key in n:
            return kind, ct
    return None


def _parse_ranks(value: object) -> list[int]:
    if isinstance(value, list):
        return [int(x) for x in value]
    try:
        parsed = json.loads(str(value))
        return [int(x) for x in parsed] if isinstance(parsed, list) else []
    except (ValueError, TypeError):
        return []


def _group_ranks(host: HostTrace, kt: KinetoTrace, pg_name: str, act: GpuActivity, group_size: int) -> list[int]:
    g = host.groups.get(pg_name)
    if g is not None and g.ranks:
        return g.ranks
    from_kernel = _parse_ranks(act.args.get("Process Group Ranks", ""))
    if from_kernel:
        return from_kernel
    for pg in kt.pg_config:
        if str(pg.get("pg_name")) == pg_name and pg.get("ranks"):
            return [int(r) for r in pg["ranks"]]
    size = group_size or (g.group_size if g is not None else 0) or (kt.world_size or 0)
    return list(range(size))  # the default group: torch writes it with an empty rank list


NCCL_KERNEL_PREFIXES = ("ncclDevKernel_", "ncclKernel_")


def is_nccl_kernel(act: GpuActivity) -> bool:
    """An NCCL kernel by its name or by the args Kineto gives NCCL kernels."""
    return act.kind == "kernel" and (act.name.startswith(NCCL_KERNEL_PREFIXES) or "Collective name" in act.args)


def where(kt: KinetoTrace, act: GpuActivity) -> str:
    """The file, kernel and timestamp of one GPU activity, for one-line errors."""
    return f"{kt.path}: NCCL kernel {act.name[:60]!r} at {act.start_ns} ns"


def is_coalesced(op: HostOp | None, act: GpuActivity) -> bool:
    """A kernel that runs several calls issued between startCoalescing and endCoalescing."""
    if op is not None and "coalesced" in op.name and op.comm is None:
        return True  # launched under the "nccl:coalesced" record function
    name = op.comm.collective_name if op is not None and op.comm is not None else str(act.args.get("Collective name", ""))
    return name.lower().strip("_") == "coalesced"


def _comm_info(op: HostOp | None, act: GpuActivity, host: HostTrace, kt: KinetoTrace, rank: int,
               call_override: CommCall | None = None) -> CommInfo | None:
    call = op.comm if op is not None and op.comm is not None and op.comm.collective_name != "wait" else None
    if call_override is not None:
        call = call_override
    a = act.args
    if call is None and "Collective name" not in a:
        return None
    name = call.collective_name if call is not None else str(a["Collective name"])
    kind = comm_kind(name)
    if kind is None:
        raise CalibError(f"{kt.path}: collective {name!r} (kernel {act.name[:60]!r}) is not one calib can convert")
    dtype = call.dtype if call is not None else str(a.get("dtype", ""))
    if dtype not in COMM_DTYPE_BYTES:
        raise CalibError(f"{kt.path}: collective {name!r} has unknown dtype {dtype!r}; cannot compute its bytes")
    eb = COMM_DTYPE_BYTES[dtype]
    in_n = call.in_nelems if call is not None else int(a.get("In msg nelems", 0))
    out_n = call.out_nelems if call is not None else int(a.get("Out msg nelems", 0))
    pg_name = call.pg_name if call is not None else str(a.get("Process Group Name", "0"))
    pg_desc = call.pg_desc if call is not None else str(a.get("Process Group Description", ""))
    size = (call.group_size if call is not None else 0) or int(a.get("Group size", 0) or 0)
    ranks = _group_ranks(host, kt, pg_name, act, size)
    info = CommInfo(kind[0], kind[1], pg_name, pg_desc, call.seq if call is not None else None,
                    size or len(ranks), ranks, in_n * eb, out_n * eb)
    if info.kind in ("send", "recv"):
        peer: int | None = None
        if call is not None and call.rank_arg is not None and 0 <= call.rank_arg < len(ranks):
            peer = ranks[call.rank_arg]  # record_param_comms holds the group-local peer
        else:
            key = "Dst Rank" if info.kind == "send" else "Src Rank"
            if key in a:
                local = int(a[key])
                peer = ranks[local] if 0 <= local < len(ranks) else local
        if peer is None:
            raise CalibError(f"{kt.path}: {info.kind} (kernel at {act.start_ns} ns) names no peer rank")
        info.peer = peer
    return info


def link(host: HostTrace, kt: KinetoTrace, rank: int) -> list[LinkedOp]:
    """Every GPU activity of the Kineto trace, once, with its host op (None when it cannot be linked)."""
    if not kt.has_record_ids:
        raise CalibError(f"{kt.path}: Kineto CPU ops carry no 'Record function id': the profiler ran without "
                         "execution_trace_observer, so nothing links to the host trace")
    if host.pid is not None and kt.pid is not None and int(host.pid) != int(kt.pid):
        raise CalibError(f"{host.path} (pid {host.pid}) and {kt.path} (pid {kt.pid}) come from different "
                         "processes: host and device traces of different runs or ranks")
    out: list[LinkedOp] = []
    coalesced: list[LinkedOp] = []
    launched: set[int] = set()  # host ids of comm calls that launched their own kernel
    with_rf = missing = renamed = 0
    for act in kt.gpu:
        launch = kt.launches.get(int(act.correlation)) if act.correlation is not None else None
        op: HostOp | None = None
        cpu_name = ""
        if launch is not None:
            cpu = (kt.cpu_ops.get((launch.tid, int(launch.external_id))) if launch.external_id is not None
                   else enclosing_cpu_op(kt, launch.tid, launch.ts_ns))
            if cpu is not None:
                cpu_name = str(cpu.get("name", ""))
                rf = (cpu.get("args") or {}).get("Record function id")
                if rf is not None:
                    with_rf += 1
                    op = host.ops_by_rf.get(int(rf))
                    if op is None:
                        missing += 1
                    elif op.name != cpu_name:
                        renamed += 1
                        op = None
        aten = op.name if op is not None else cpu_name
        if act.kind in ("memcpy", "memset"):
            rec = OpRecord("memory", aten, bytes=float(act.args.get("bytes", 0) or 0))
        elif op is not None:
            i, o = op.inputs, op.outputs
            rec = classify(op.name, i.get("shapes", []), i.get("types", []), o.get("shapes"), o.get("types"),
                           causal=causal_of(op.name, i.get("values", [])))
            if rec.op_class == "gemm" and is_split_k_reduce(act.name):
                rec = split_k_reduce_record(rec)
        else:
            rec = OpRecord("other", aten)
        step = None
        if op is not None:
            step = host.step_of(op)
        if step is None:
            step = step_at(kt, launch.ts_ns if launch is not None else act.start_ns)
        if act.kind == "kernel" and op is None and _is_batched_p2p(act.args):
            # no host op, both peers in the kernel's own args: a send and a recv fused in one launch
            # (with a host op its record_param_comms calls say more: a batch may hold several of each)
            out += [LinkedOp(act if i == 0 else _copy(act), launch if i == 0 else None, op, aten, int(step or 0), rec,
                             info, i) for i, info in enumerate(_kineto_batched_p2p(act, host, kt))]
            continue
        if act.kind == "kernel" and is_coalesced(op, act):
            coalesced.append(LinkedOp(act, launch, op, aten, int(step or 0), rec, None))
            continue
        comm = _comm_info(op, act, host, kt, rank) if act.kind == "kernel" else None
        if comm is None and is_nccl_kernel(act):
            # never a COMP node: the host op carried no call and the kernel's args name none
            raise CalibError(f"{where(kt, act)} links to no record_param_comms op ({cpu_name or 'no CPU op'}) and its "
                             "Kineto args carry no 'Collective name': cannot tell what it communicated")
        if comm is not None and op is not None:
            launched.add(op.id)
        out.append(LinkedOp(act, launch, op, aten, int(step or 0), rec, comm))
    out += _split_coalesced(coalesced, launched, host, kt, rank)
    _share_index_pieces(out)
    if with_rf and (missing + renamed) > MISMATCH_FRACTION * with_rf:
        raise CalibError(f"{host.path} and {kt.path} do not match: {missing} of {with_rf} launching ops have no host op "
                         f"with their record function id and {renamed} have another name (traces of different runs or ranks)")
    return out


def _share_index_pieces(ops: list[LinkedOp]) -> None:
    """An elementwise op too large for 32-bit indexing runs as pieces, kernels of one name
    (calib.ops.index_pieces): each piece gets its share of the op's bytes, so that a kernel row's
    bytes are what that kernel moved. Other ops launching several kernels of one name (an embedding
    backward's passes, multi_tensor_apply's chunks) keep the op's bytes on each."""
    groups: dict[tuple[int, str], list[LinkedOp]] = {}
    for o in ops:
        if o.host is not None and o.comm is None and o.act.kind == "kernel" and o.record.op_class == "memory":
            groups.setdefault((o.host.id, o.act.name), []).append(o)
    for same in groups.values():
        if len(same) < 2:
            continue
        h = same[0].host
        assert h is not None
        largest = largest_operand_bytes(h.inputs.get("shapes", []), h.inputs.get("types", []),
                                        h.outputs.get("shapes"), h.outputs.get("types"))
        if index_pieces(largest) == len(same):
            for o in same:
                o.record.bytes /= len(same)
                o.record.flops /= len(same)


def _split_coalesced(coalesced: list[LinkedOp], launched: set[int], host: HostTrace, kt: KinetoTrace,
                     rank: int) -> list[LinkedOp]:
    """One LinkedOp per call of each coalesced kernel (batched send/recv, coalesced collectives).

    The calls (record_param_comms ops that launched no kernel of their own) precede their
    endCoalescing in the host trace, whose node ids follow execution order: a coalesced kernel
    takes the unclaimed calls issued before its launching op. Part 0 carries the kernel; the other
    parts are copies with the same start and duration (the calls ran together in that kernel).
    A call on a group of one rank (megatron's loss all-reduce over a data-parallel group of one on
    the last pipeline stage) moves nothing and launches no kernel: it is no part of any.
    """
    if not coalesced:
        return []
    pool = sorted((o for o in host.ops_by_id.values() if o.comm is not None and o.id not in launched
                   and o.comm.collective_name not in ("wait", "coalesced") and o.comm.group_size != 1),
                  key=lambda o: o.id)
    out: list[LinkedOp] = []
    taken = 0
    for lk in sorted(coalesced, key=lambda lk: (lk.host.id if lk.host is not None else -1, lk.act.start_ns)):
        if lk.host is None:
            raise CalibError(f"{where(kt, lk.act)} is coalesced and links to no host op; its Kineto args do not "
                             "say which calls it ran")
        parts: list[HostOp] = []
        while taken < len(pool) and pool[taken].id < lk.host.id:
            parts.append(pool[taken])
            taken += 1
        if not parts:
            raise CalibError(f"{host.path}: coalesced NCCL kernel (host op {lk.host.id}) has no send/recv or "
                             "collective calls before it in the host trace")
        for i, call in enumerate(parts):
            act = lk.act if i == 0 else _copy(lk.act)
            assert call.comm is not None
            info = _comm_info(call, act, host, kt, rank, call_override=call.comm)
            out.append(LinkedOp(act, lk.launch if i == 0 else None, lk.host, lk.aten_op, lk.step, lk.record, info, i))
    return out


def _copy(act: GpuActivity) -> GpuActivity:
    return GpuActivity(act.kind, act.name, act.stream, act.start_ns, act.dur_ns, act.correlation, act.args)


def _is_batched_p2p(a: dict[str, object]) -> bool:
    """Kineto args naming both a source and a destination: one launch that sends and receives."""
    return "Src Rank" in a and "Dst Rank" in a and str(a.get("Collective name", "")).lower() not in ("send", "recv")


def _kineto_batched_p2p(act: GpuActivity, host: HostTrace, kt: KinetoTrace) -> list[CommInfo]:
    """The send (to Dst Rank, In msg nelems) and the recv (from Src Rank, Out msg nelems) of a fused launch."""
    a = act.args
    dtype = str(a.get("dtype", ""))
    if dtype not in COMM_DTYPE_BYTES:
        raise CalibError(f"{where(kt, act)} sends and receives but has unknown dtype {dtype!r}; cannot compute its bytes")
    eb = COMM_DTYPE_BYTES[dtype]
    pg_name = str(a.get("Process Group Name", "0"))
    pg_desc = str(a.get("Process Group Description", ""))
    size = int(a.get("Group size", 0) or 0)
    ranks = _group_ranks(host, kt, pg_name, act, size)
    out: list[CommInfo] = []
    for kind, key, nkey in (("send", "Dst Rank", "In msg nelems"), ("recv", "Src Rank", "Out msg nelems")):
        local = int(a[key])  # type: ignore[call-overload]
        n = int(a.get(nkey, 0) or 0)  # type: ignore[call-overload]
        if n <= 0:
            raise CalibError(f"{where(kt, act)} sends and receives but its args give no {nkey!r}")
        peer = ranks[local] if 0 <= local < len(ranks) else local
        out.append(CommInfo(kind, None, pg_name, pg_desc, None, size or len(ranks), ranks, n * eb, n * eb, peer))
    return out
