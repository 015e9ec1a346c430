"""`calib measure kernels`: GEMM, attention and memory-bound kernel microbenchmarks -> a kernels bundle.

Shapes are those the presets produce per layer under TP 1/2/4/8 (Megatron's column/row-parallel
split): QKV, attention output projection, MLP fc1 (x2 for SwiGLU) and fc2, the output logits, each
forward (Y = X W), data-gradient and weight-gradient GEMM; MoE experts with tokens x top_k / experts
rows; attention as megatron's local attention computes it (baddbmm scores, softmax, bmm with V)
and as fused SDPA (flash) forward; memory-bound copy/add/mul by bytes. Each shape runs `warmup`
untimed then `repeats` timed times with CUDA events; every timed run is one kernels.parquet row
(rank 0, step = repetition) carrying calib.ops' OpRecord fields, so the kernel model fits on them
directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from calib.bundle.schema import KERNEL_COLUMNS, GpuInfo, Manifest, Software
from calib.errors import CalibError
from calib.ops import classify
from calib.workload.models import PRESETS, ModelSpec
from measure.env import host_name
from measure.train import open_writer

TPS = (1, 2, 4, 8)
TOKENS = (2048, 8192)
MEMORY_BYTES = tuple(2**p for p in range(20, 31, 2))  # 1 MiB .. 1 GiB
BF16 = "Tensor(c10::BFloat16)"


@dataclass(frozen=True)
class Case:
    """One benchmark: an aten op over given input shapes (what calib.ops.classify is asked)."""

    aten_op: str
    shapes: tuple[tuple[int, ...], ...]
    label: str  # where the shape comes from (preset/tp/tokens/role), for the reader

    def record(self) -> dict:
        causal = True if "attention" in self.aten_op else None
        rec = classify(self.aten_op, [list(s) for s in self.shapes], [BF16] * len(self.shapes), causal=causal)
        return rec.to_dict()


def _pad(v: int, tp: int) -> int:
    m = 128 * tp
    return (v + m - 1) // m * m


def gemm_cases(models: list[ModelSpec], tps: tuple[int, ...], tokens: tuple[int, ...]) -> list[Case]:
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
                        key = (mm, nn, kk)
                        if key not in seen:
                            seen[key] = Case("aten::mm", ((mm, kk), (kk, nn)), f"{model.name}/tp{tp}/tokens{t}/{role}/{kind}")
    return list(seen.values())


def attention_cases(models: list[ModelSpec], tps: tuple[int, ...], seqs: tuple[int, ...], batch: int = 1) -> list[Case]:
    seen: dict[tuple, Case] = {}
    for model in models:
        for tp in tps:
            if model.heads % tp or model.kv_groups % tp:
                continue
            heads, hd = model.heads // tp, model.head_dim
            for s in seqs:
                bh = batch * heads
                cases = [
                    Case("aten::baddbmm", ((bh, s, s), (bh, s, hd), (bh, hd, s)), f"{model.name}/tp{tp}/seq{s}/scores"),
                    Case("aten::_softmax", ((bh, s, s),), f"{model.name}/tp{tp}/seq{s}/softmax"),
                    Case("aten::bmm", ((bh, s, s), (bh, s, hd)), f"{model.name}/tp{tp}/seq{s}/context"),
                    Case("aten::_scaled_dot_product_flash_attention", ((batch, heads, s, hd),) * 3,
                         f"{model.name}/tp{tp}/seq{s}/sdpa"),
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


def default_cases(quick: bool = False) -> list[Case]:
    if quick:
        models = [PRESETS["llama3-8b"]]
        return gemm_cases(models, (1, 2), (4096,)) + attention_cases(models, (1, 2), (2048,)) + memory_cases((2**20, 2**26))
    models = list(PRESETS.values())
    return gemm_cases(models, TPS, TOKENS) + attention_cases(models, TPS, (2048, 4096)) + memory_cases()


def _runner(case: Case, dev: object) -> Callable[[], object]:
    import torch

    bf = torch.bfloat16
    t = [torch.randn(*s, dtype=bf, device=dev) for s in case.shapes]
    op = case.aten_op
    if op == "aten::mm":
        return lambda: torch.mm(t[0], t[1])
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


def measure_kernels(out: str | Path, quick: bool = False, warmup: int = 3, repeats: int = 10,
                    deadline_s: float | None = None, overwrite: bool = False) -> Path:
    import torch

    from measure.env import apply_safe_env, software_versions

    apply_safe_env()
    if not torch.cuda.is_available():
        raise CalibError("kernel microbenchmarks need a CUDA GPU (none visible to torch)")
    cases = default_cases(quick)
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
        "timing": "CUDA events around each call; one row per timed repetition",
        "shapes": "presets x TP 1/2/4/8 x tokens 2048/8192 (GEMM fwd/dgrad/wgrad), attention at seq 2048/4096, "
                  "memory-bound copy/add/mul 1 MiB-1 GiB" if not quick else "quick subset (llama3-8b, TP 1/2)",
    })
    writer = open_writer(out, manifest, overwrite)
    try:
        df, skipped = run_cases(cases, warmup, repeats, deadline_s)
    except Exception as exc:  # noqa: BLE001 - OOM or a CUDA error: a failed bundle says which
        return writer.fail(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    if skipped:
        manifest.notes["skipped_cases"] = f"{skipped} of {len(cases)} not run: the time limit ({deadline_s} s) was reached"
    if not len(df):
        return writer.fail("no case ran")
    writer.write_table("kernels", df)
    return writer.finish()
