"""`calib measure kernels`: GEMM, attention and memory-bound kernel microbenchmarks -> a kernels bundle.

Shapes are those the presets produce per layer under TP 1/2/4/8 (Megatron's column/row-parallel
split): QKV, attention output projection, MLP fc1 (x2 for SwiGLU) and fc2, the output logits, each
forward (Y = X W), data-gradient and weight-gradient GEMM; MoE experts with tokens x top_k / experts
rows; attention as megatron's local attention computes it (baddbmm scores, softmax, bmm with V)
and as fused SDPA (flash); memory-bound copy/add/mul by bytes. Each shape runs `warmup` untimed
then `repeats` timed times, timed one of two ways (manifest notes.timing_method):

- "kernel" (the default): all cases run under one PyTorch host execution trace + Kineto profile, as a
  profiled training step does, and calib's converter (calib.convert) turns them into kernels.parquet:
  one row per kernel with its own GPU duration, kernel name (operand layout, split-K reductions) and
  the record the converter gives its aten op, exactly as a training bundle's rows. Each case's timed
  calls run inside an annotation between two device synchronizations (its set-up and warm-up before
  it, dropped), each after IDLE_GAP_S of GPU idle; column `case` names the case. GEMM operands are laid
  out per pass (PASS_LAYOUTS). Attention runs forward and backward here (flash SDPA:
  _flash_attention_forward and _flash_attention_backward, as in the training steps), at sequence
  2048, 4096 and 8192.
- "events" (the first bundles): CUDA events around each call, one row per call carrying the case's
  record (calib.ops.classify of the op and its input shapes). An event pair around one call on an
  idle GPU also times the host's dispatch of it: small kernels read 30-70 us whatever their work
  (H200, flash SDPA forward at 2-16 heads). calib fits that floor apart (source "bench").
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calib.bundle.schema import KERNEL_BENCH_METHODS, KERNEL_COLUMNS, GpuInfo, Manifest, Software
from calib.errors import CalibError
from calib.ops import classify
from calib.workload.models import PRESETS, ModelSpec
from measure.env import host_name
from measure.train import open_writer

TPS = (1, 2, 4, 8)
TOKENS = (2048, 8192)
EVENT_SEQS = (2048, 4096)
KERNEL_SEQS = (2048, 4096, 8192)
MEMORY_BYTES = tuple(2**p for p in range(20, 31, 2))  # 1 MiB .. 1 GiB
BF16 = "Tensor(c10::BFloat16)"
# Megatron-core's local linear layers (no Transformer Engine): forward X W^T, data gradient dY W, weight gradient
# dY^T X, the transposed operand a view. cuBLAS picks its kernel by the layout: the H200 steps' GEMM kernels end in
# NNT, NTN and TNT about equally, where contiguous operands gave only NNT and NNN (round 45).
PASS_LAYOUTS = {"fwd": "nt", "dgrad": "nn", "wgrad": "tn"}
# The kernel-timed mode idles the GPU this long before each timed call. Back to back on random inputs, GEMMs hold
# the H200 at its 700 W cap (clock-event reason 4, SM clock 1.47-1.72 GHz of 1.98) and ran a median 8.6 % (up to
# 30 %) longer than the same kernels in the training steps, whose GEMMs alternate with memory-bound kernels; with
# 1 ms idle before each call the clock stays at 1.86-1.98 GHz (measure/probes/gemm_conditions.py,
# traces/h200/_probes/gemm-conditions-1) and the shapes shared with the steps run a median 1.2 % under theirs.
IDLE_GAP_S = 0.001


@dataclass(frozen=True)
class Case:
    """One benchmark: an aten op over given input shapes (what calib.ops.classify is asked)."""

    aten_op: str
    shapes: tuple[tuple[int, ...], ...]
    label: str  # where the shape comes from (preset/tp/tokens/role), for the reader
    # A GEMM's operands as the training's linear layers pass them (PASS_LAYOUTS): "nt" the second a transposed
    # view, "tn" the first; "" both contiguous (the event-timed bundles').
    layout: str = ""

    def record(self) -> dict:
        causal = True if "attention" in self.aten_op else None
        rec = classify(self.aten_op, [list(s) for s in self.shapes], [BF16] * len(self.shapes), causal=causal)
        return rec.to_dict()


def _pad(v: int, tp: int) -> int:
    m = 128 * tp
    return (v + m - 1) // m * m


def gemm_cases(models: list[ModelSpec], tps: tuple[int, ...], tokens: tuple[int, ...], layouts: bool = False) -> list[Case]:
    """Each layer GEMM per preset, TP and token count, forward, data- and weight-gradient; `layouts`: with the
    training's operand layout per pass (PASS_LAYOUTS), a shape timed once per layout it comes in."""
    seen: dict[tuple, Case] = {}
    for model in models:
        h, hd = model.hidden, model.head_dim
        kv = model.kv_groups * hd
        fc1 = model.ffn_hidden * (2 if model.activation == "swiglu" else 1)
        for tp in tps:
            if model.heads % tp or model.kv_groups % tp:
                continue
            for t in tokens:
                fwd = [
                    ("qkv", t, (h + 2 * kv) // tp, h), ("proj", t, h, h // tp),
                    ("logits", t, _pad(model.vocab, tp) // tp, h),
                ]
                if model.is_moe:
                    te = t * model.top_k // model.experts
                    fwd += [("expert_fc1", te, fc1 // tp, h), ("expert_fc2", te, h, model.ffn_hidden // tp)]
                else:
                    fwd += [("fc1", t, fc1 // tp, h), ("fc2", t, h, model.ffn_hidden // tp)]
                for role, m, n, k in fwd:
                    for kind, (mm, nn, kk) in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (n, k, m))):
                        layout = PASS_LAYOUTS[kind] if layouts else ""
                        key = (mm, nn, kk, layout)
                        if key not in seen:
                            seen[key] = Case("aten::mm", ((mm, kk), (kk, nn)), f"{model.name}/tp{tp}/tokens{t}/{role}/{kind}",
                                             layout)
    return list(seen.values())


def attention_cases(models: list[ModelSpec], tps: tuple[int, ...], seqs: tuple[int, ...], batch: int = 1,
                    gqa: bool = False) -> list[Case]:
    """Megatron's local attention (scores, softmax, context) and SDPA per preset, TP and sequence; `gqa`: the
    SDPA keys and values with the layer's KV groups per rank (as the training's flash path passes them, unexpanded),
    else with every head (the event-timed bundles')."""
    seen: dict[tuple, Case] = {}
    for model in models:
        for tp in tps:
            if model.heads % tp or model.kv_groups % tp:
                continue
            heads, hd = model.heads // tp, model.head_dim
            kv = model.kv_groups // tp if gqa else heads
            for s in seqs:
                bh = batch * heads
                cases = [
                    Case("aten::baddbmm", ((bh, s, s), (bh, s, hd), (bh, hd, s)), f"{model.name}/tp{tp}/seq{s}/scores"),
                    Case("aten::_softmax", ((bh, s, s),), f"{model.name}/tp{tp}/seq{s}/softmax"),
                    Case("aten::bmm", ((bh, s, s), (bh, s, hd)), f"{model.name}/tp{tp}/seq{s}/context"),
                    Case("aten::_scaled_dot_product_flash_attention",
                         ((batch, heads, s, hd), (batch, kv, s, hd), (batch, kv, s, hd)), f"{model.name}/tp{tp}/seq{s}/sdpa"),
                ]
                for c in cases:
                    seen.setdefault((c.aten_op, c.shapes), c)
    return list(seen.values())


def memory_cases(sizes: tuple[int, ...] = MEMORY_BYTES) -> list[Case]:
    out = []
    for b in sizes:
        n = b // 2
        out += [Case("aten::copy_", ((n,), (n,)), f"copy/{b}"), Case("aten::add", ((n,), (n,)), f"add/{b}"),
                Case("aten::mul", ((n,), (n,)), f"mul/{b}")]
    return out


def default_cases(quick: bool = False, seqs: tuple[int, ...] = EVENT_SEQS, training_like: bool = False) -> list[Case]:
    """The cases of a kernels bundle; `training_like` (the kernel-timed mode): GEMM operands laid out per pass and
    SDPA keys/values with their KV groups, as the training steps run them."""
    if quick:
        models = [PRESETS["llama3-8b"]]
        return (gemm_cases(models, (1, 2), (4096,), training_like)
                + attention_cases(models, (1, 2), (2048,), gqa=training_like) + memory_cases((2**20, 2**26)))
    models = list(PRESETS.values())
    return (gemm_cases(models, TPS, TOKENS, training_like) + attention_cases(models, TPS, seqs, gqa=training_like)
            + memory_cases())


def gemm_operands(torch: Any, m: int, n: int, k: int, layout: str, dev: object,
                  make: Callable[..., Any] | None = None) -> tuple[Any, Any]:
    """A [m, k] x [k, n] bf16 GEMM's operands laid out as `layout` (PASS_LAYOUTS: "nt" B stored [n, k], "tn" A stored
    [k, m], else both as shaped), drawn by `make` (torch.randn unless given)."""
    make = make or torch.randn
    bf = torch.bfloat16
    a = make(k, m, dtype=bf, device=dev).t() if layout == "tn" else make(m, k, dtype=bf, device=dev)
    b = make(n, k, dtype=bf, device=dev).t() if layout == "nt" else make(k, n, dtype=bf, device=dev)
    return a, b


def flash_forward_backward(torch: Any, seq: int, batch: int, heads: int, kv: int, hd: int,
                           dev: object) -> Callable[[], object]:
    """Causal flash attention forward + backward as measure/mcore.py runs it: [s, b, n, d] tensors viewed as
    [b, n, s, d], keys and values with their KV groups unexpanded, the flash backend forced (torch would pick
    cuDNN's kernels here otherwise)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bf = torch.bfloat16
    leaves = [torch.randn(seq, batch, n, hd, dtype=bf, device=dev, requires_grad=True) for n in (heads, kv, kv)]
    q, k, v = (x.permute(1, 2, 0, 3) for x in leaves)
    grad = torch.randn(batch, heads, seq, hd, dtype=bf, device=dev)

    def call() -> object:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
            # autograd.grad, not .backward(): the gradients are returned, never accumulated into .grad
            # (which would add a kernel per call that a training step's attention does not launch).
            return torch.autograd.grad(out, leaves, grad)

    return call


def _runner(case: Case, dev: object, backward: bool = False) -> Callable[[], object]:
    """The call a case times; `backward`: attention also runs its backward (the kernel-timed mode)."""
    import torch

    op = case.aten_op
    if op == "aten::mm":
        (m, k), (_, n) = case.shapes
        a, b = gemm_operands(torch, m, n, k, case.layout, dev)
        return lambda: torch.mm(a, b)
    if op == "aten::_scaled_dot_product_flash_attention" and backward:
        (batch, heads, seq, hd), (_, kv, _, _) = case.shapes[:2]
        return flash_forward_backward(torch, seq, batch, heads, kv, hd, dev)
    t = [torch.randn(*s, dtype=torch.bfloat16, device=dev) for s in case.shapes]
    if op == "aten::baddbmm":
        return lambda: torch.baddbmm(t[0], t[1], t[2], beta=0.0, alpha=0.125)
    if op == "aten::bmm":
        return lambda: torch.bmm(t[0], t[1])
    if op == "aten::_softmax":
        return lambda: torch.softmax(t[0], dim=-1)
    if op == "aten::_scaled_dot_product_flash_attention":
        import torch.nn.functional as F

        return lambda: F.scaled_dot_product_attention(t[0], t[1], t[2], is_causal=True)
    if op == "aten::copy_":
        return lambda: t[0].copy_(t[1])
    if op == "aten::add":
        return lambda: torch.add(t[0], t[1])
    if op == "aten::mul":
        return lambda: torch.mul(t[0], t[1])
    raise CalibError(f"no benchmark for {op}")


def run_cases(cases: list[Case], warmup: int = 3, repeats: int = 10, deadline_s: float | None = None) -> tuple[pd.DataFrame, int]:
    """Time every case on the current CUDA device; stop early at deadline (rows so far, cases skipped)."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    t0 = time.monotonic()
    rows = []
    skipped = 0
    for i, case in enumerate(cases):
        if deadline_s is not None and time.monotonic() - t0 > deadline_s:
            skipped = len(cases) - i
            break
        fn = _runner(case, dev)
        for _ in range(warmup):
            fn()
        rec = case.record()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        starts = []
        torch.cuda.synchronize()
        for a, b in evs:
            starts.append(time.monotonic() - t0)
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        for rep, ((a, b), st) in enumerate(zip(evs, starts, strict=True)):
            rows.append({"rank": 0, "step": rep, "stream": 0, "name": case.label, "start_s": st,
                         "time_s": a.elapsed_time(b) * 1e-3, **rec})
        del fn
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    if len(df):
        df = df[KERNEL_COLUMNS + [c for c in df.columns if c not in KERNEL_COLUMNS]]
    return df, skipped


CASE_MARK = "calib.case#"  # the annotation around one case's timed calls in the kernel-timed profile


def case_windows(trace: dict) -> dict[int, tuple[float, float]]:
    """Case index -> (start, end) in seconds on the kernel table's clock, from the CASE_MARK annotations of a
    Kineto trace (its events' `ts`/`dur` in us from `baseTimeNanoseconds`, as calib.convert reads them)."""
    base_s = int(trace.get("baseTimeNanoseconds", 0) or 0) * 1e-9
    out = {}
    for e in trace.get("traceEvents", []):
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith(CASE_MARK) and name[len(CASE_MARK):].isdigit():
            start = base_s + float(e["ts"]) * 1e-6
            out[int(name[len(CASE_MARK):])] = (start, start + float(e["dur"]) * 1e-6)
    return out


def timed_windows(kernels: pd.DataFrame, windows: dict[int, tuple[float, float]], labels: list[str]) -> pd.DataFrame:
    """The converter's kernel table of a kernel-timed run -> the timed calls' rows, each with its `case` label and
    `step` the case index. Case i's timed calls ran inside its annotation (`windows[i]`) between two device
    synchronizations, so its kernels, and only its, start on the GPU inside that window; the set-up and warm-up
    kernels between the windows are dropped."""
    if kernels.empty:
        raise CalibError("the kernel-timed run's profile holds no kernels")
    missing = [labels[i] for i in range(len(labels)) if i not in windows]
    if missing:
        raise CalibError(f"the profile lacks the timed-window annotation of {len(missing)} case(s) (first: {missing[0]})")
    start = pd.to_numeric(kernels["start_s"], errors="coerce").to_numpy(float)
    case = np.full(len(kernels), -1)
    for i in range(len(labels)):
        lo, hi = windows[i]
        case[(start >= lo) & (start <= hi)] = i
    timed = kernels[case >= 0].copy()
    timed["step"] = case[case >= 0]
    silent = [labels[i] for i in range(len(labels)) if i not in set(timed["step"].tolist())]
    if silent:
        raise CalibError(f"{len(silent)} case(s) launched no kernel in their timed window (first: {silent[0]})")
    timed["case"] = [labels[i] for i in timed["step"]]
    return timed.sort_values(["step", "start_s"]).reset_index(drop=True)


def run_profiled(cases: list[Case], work: Path, warmup: int = 3, repeats: int = 10,
                 deadline_s: float | None = None) -> tuple[pd.DataFrame, int]:
    """Time every case's kernels under one host execution trace + Kineto profile, converted by calib's
    converter (module docstring, "kernel"); stop early at the deadline (rows so far, cases skipped)."""
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    from calib.convert import convert_traces

    dev = torch.device("cuda", torch.cuda.current_device())
    host, device = work / "host.0.json", work / "device.0.json"
    et = ExecutionTraceObserver()
    et.register_callback(str(host))
    t0 = time.monotonic()
    labels: list[str] = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 execution_trace_observer=et) as prof:
        for i, case in enumerate(cases):
            if deadline_s is not None and time.monotonic() - t0 > deadline_s:
                break
            fn = _runner(case, dev, backward=True)
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            with record_function(f"{CASE_MARK}{i}"):
                for _ in range(repeats):
                    time.sleep(IDLE_GAP_S)  # the GPU idles before each call: no power cap carried over
                    fn()
                    torch.cuda.synchronize()
            labels.append(case.label)
            del fn
            torch.cuda.empty_cache()
    prof.export_chrome_trace(str(device))
    with contextlib.suppress(Exception):  # already stopped by profile() on some torch versions
        et.unregister_callback()
    conv = convert_traces({0: host}, {0: device})
    windows = case_windows(json.loads(device.read_text()))
    return timed_windows(conv.kernels, windows, labels), len(cases) - len(labels)


def measure_kernels(out: str | Path, quick: bool = False, warmup: int = 3, repeats: int = 10,
                    deadline_s: float | None = None, overwrite: bool = False, timing: str = "kernel") -> Path:
    import torch

    from measure.env import apply_safe_env, software_versions

    if timing not in KERNEL_BENCH_METHODS:
        raise CalibError(f"--timing {timing!r}: expected one of {', '.join(KERNEL_BENCH_METHODS)}")
    apply_safe_env()
    if not torch.cuda.is_available():
        raise CalibError("kernel microbenchmarks need a CUDA GPU (none visible to torch)")
    seqs = KERNEL_SEQS if timing == "kernel" else EVENT_SEQS
    cases = default_cases(quick, seqs, training_like=timing == "kernel")
    manifest = Manifest(kind="kernels", host=host_name())
    sw = software_versions()
    manifest.software = Software(**{k: v for k, v in sw.items() if k in Software.__dataclass_fields__})
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    manifest.gpu = GpuInfo(name=props.name, count=1, memory_bytes=int(props.total_memory))
    try:
        from measure.telemetry import open_backend

        b = open_backend("auto", None)
        phys = int((__import__("os").environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
        info = b.info(phys) if phys in b.gpus else b.info(b.gpus[0])  # type: ignore[attr-defined]
        manifest.gpu = GpuInfo(count=1, **info)
        b.close()
    except CalibError as exc:
        manifest.notes["gpu_info"] = f"NVML unavailable: {exc}"
    manifest.notes.update({
        "cases": len(cases), "warmup": warmup, "repeats": repeats, "quick": quick, "dtype": "bfloat16",
        "timing_method": timing,
        "timing": ("every kernel's own GPU time from one host execution trace + Kineto profile, converted by calib; "
                   "one row per kernel of each timed call" if timing == "kernel"
                   else "CUDA events around each call; one row per timed repetition"),
        "shapes": ("presets x TP 1/2/4/8 x tokens 2048/8192 (GEMM fwd/dgrad/wgrad), attention at seq "
                   f"{'/'.join(map(str, seqs))}{' forward and backward' if timing == 'kernel' else ''}, "
                   "memory-bound copy/add/mul 1 MiB-1 GiB") if not quick else "quick subset (llama3-8b, TP 1/2)",
    })
    writer = open_writer(out, manifest, overwrite)
    try:
        if timing == "kernel":
            with tempfile.TemporaryDirectory() as tmp:
                df, skipped = run_profiled(cases, Path(tmp), warmup, repeats, deadline_s)
        else:
            df, skipped = run_cases(cases, warmup, repeats, deadline_s)
    except Exception as exc:  # noqa: BLE001 - OOM or a CUDA error: a failed bundle says which
        return writer.fail(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    if skipped:
        manifest.notes["skipped_cases"] = f"{skipped} of {len(cases)} not run: the time limit ({deadline_s} s) was reached"
    if not len(df):
        return writer.fail("no case ran")
    writer.write_table("kernels", df)
    return writer.finish()
