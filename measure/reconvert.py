"""Convert the raw traces a bundle kept (raw/) into ETs later, rewriting the bundle atomically."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from calib.bundle.io import read_bundle, update_notes, write_parquet
from calib.errors import CalibError
from measure.convert import convert_to, raw_paths


def reconvert(path: str | Path, drop_raw: bool = False) -> str:
    src = Path(path)
    bundle = read_bundle(src)
    m = bundle.manifest
    if m.kind != "training" or m.spec is None:
        raise CalibError(f"bundle {src}: only training bundles hold traces")
    world = m.spec.tp * m.spec.pp * m.spec.dp
    host, dev = raw_paths(src / "raw", world)
    if len(host) < world:
        raise CalibError(f"bundle {src}: raw/ lacks traces for rank(s) {sorted(set(range(world)) - set(host))}")
    if not m.steps.profiled:
        raise CalibError(f"bundle {src}: no profiled step recorded")
    tmp = src.with_name(src.name + ".reconvert")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("raw") if drop_raw else None)
    try:
        notes = convert_to(tmp, host, dev, m.steps.profiled[0])
        update_notes(tmp, {**notes, **({"raw": "raw traces dropped after conversion"} if drop_raw else {})})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = src.with_name(src.name + ".old")
    os.replace(src, old)
    os.replace(tmp, src)
    shutil.rmtree(old, ignore_errors=True)
    return f"converted: {src} ({notes['et']})"


def refresh_bandwidths(path: str | Path) -> int:
    """Recompute the derived algbw/busbw columns of a bundle's collectives.parquet from its own
    kind, group_size, bytes and time columns (after a fix to the convention code); measured
    columns are left as they are. Returns the number of rows."""
    import pandas as pd

    from measure.conventions import bandwidths_gbps

    file = Path(path) / "collectives.parquet"
    df = pd.read_parquet(file)
    kind = read_bundle(path).manifest.kind
    time_col = "time_s" if kind == "collectives" else "transfer_s"
    bw = [bandwidths_gbps(str(k), int(n), float(b), float(t)) if pd.notna(n) and pd.notna(b) and pd.notna(t)
          else (float("nan"), float("nan"))
          for k, n, b, t in zip(df["kind"], df["group_size"], df["bytes"], df[time_col], strict=True)]
    df["algbw_gbps"] = [a for a, _ in bw]
    df["busbw_gbps"] = [b for _, b in bw]
    tmp = file.with_name(file.name + ".tmp")
    write_parquet(df, tmp)
    os.replace(tmp, file)
    return len(df)


def redo_p2p_deps(path: str | Path) -> int:
    """Give each send/recv of a bundle's ETs the cross-stream dependencies today's converter gives it,
    for bundles converted before the fix and without raw traces to reconvert (traces/README.md).

    The earlier converter took the op an event recorded from the recording thread's own launches, so a
    pipeline send issued by the main thread after a backward that the autograd engine's thread launched
    depended on the main thread's last forward kernel and could start before the backward it carries.
    megatron-core batches each micro-batch's sends and receives and synchronises after every batch, so
    nothing is launched between a batch and its sync: the op the event captured is the last node of the
    compute stream that started before the transfer, which node ids (GPU start order) give. On the raw
    traces kept for gpt6.7b-pp2-mbs2 (tests/data/h200-pp2-raw) this equals the converter's result for
    every send and recv. Returns the number of send/recv nodes whose dependencies changed."""
    from calib.chakra.codec import read_et, write_et
    from calib.chakra.model import NodeType

    p2p = (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)
    changed = 0
    for file in read_bundle(path).et_files():
        trace = read_et(file)
        stream_of = {n.id: n.attr("stream") for n in trace.nodes}
        last: dict[object, int] = {}  # stream -> its latest node so far, in id order
        edits = 0
        for n in sorted(trace.nodes, key=lambda n: n.id):
            own = stream_of[n.id]
            if n.type in p2p:
                other = {stream_of[d] for d in n.data_deps} - {own}
                deps = [d for d in n.data_deps if stream_of[d] == own] + [last[s] for s in sorted(other, key=str)]
                if sorted(deps) != sorted(n.data_deps):
                    n.data_deps = deps
                    edits += 1
            last[own] = n.id
        if edits:
            write_et(trace, file)
            changed += edits
    if changed:
        update_notes(path, {"et_p2p_deps": f"{changed} send/recv dependencies redone by measure.reconvert.redo_p2p_deps "
                                           "after the converter's event-record fix (traces/README.md)"})
    return changed


# A flash kernel's template arguments after its traits: Is_dropout, Is_causal, ... (pytorch_flash).
_FLASH_MAIN = re.compile(r"flash_(?:fwd_kernel|bwd_dq_dk_dv_loop\w*_kernel)<.*>, (true|false), (true|false),")


def refresh_causal_attention(path: str | Path) -> int:
    """Halve the derived FLOPs of a flash-attention bundle's attention records (kernels.parquet `flops`,
    the ETs' `num_ops`) converted before the converter read `is_causal` from the host trace
    (calib.ops.causal_of); measured columns are left as they are. Such runs are causal by construction
    (measure/mcore.py: FlashCoreAttention), which the main kernels' names confirm (their Is_causal
    template argument); a bundle whose kernels say otherwise is refused. On the two round-16 bundles
    whose raw traces came back, this equals a full reconversion (traces/README.md). Returns the number
    of kernel rows changed (0 when already causal)."""
    import pandas as pd

    from calib.chakra.codec import read_et, write_et

    bundle = read_bundle(path)
    spec = bundle.manifest.spec
    if spec is None or spec.attention != "flash":
        raise CalibError(f"bundle {path}: not a flash-attention run (spec.attention is not 'flash')")
    file = Path(path) / "kernels.parquet"
    df = pd.read_parquet(file)
    att = df["op_class"] == "attention"
    flags = {m.group(2) for m in (_FLASH_MAIN.search(str(n)) for n in df.loc[att, "name"]) if m}
    if flags != {"true"}:
        raise CalibError(f"bundle {path}: its flash kernels' Is_causal arguments are {sorted(flags) or 'absent'}")
    backward = df["aten_op"].str.contains("backward", regex=False)
    full = 4.0 * df["batch"] * df["m"] * df["n"] * df["k"] * backward.map({True: 2.5, False: 1.0})
    todo = att & (df["flops"] == full)
    if not todo.any():
        return 0
    df.loc[todo, "flops"] = full[todo] / 2
    tmp = file.with_name(file.name + ".tmp")
    write_parquet(df, tmp)
    os.replace(tmp, file)
    for et in bundle.et_files():
        trace = read_et(et)
        for n in trace.nodes:
            if n.attr("op_class") == "attention" and n.attr("num_ops"):
                n.set_attr("num_ops", int(n.attr("num_ops")) // 2)
        write_et(trace, et)
    update_notes(path, {"attention_causal": f"{int(todo.sum())} attention records' FLOPs halved by "
                                            "measure.reconvert.refresh_causal_attention (causal flash attention, "
                                            "converted before the converter read is_causal; traces/README.md)"})
    return int(todo.sum())
