"""What one transformer layer (and the embedding, output layer and optimizer) runs, as templates.

A template is the ordered list of one pass's work on one GPU: compute ops (the OpRecord fields of
calib.ops: op_class, m, n, k, batch, flops, bytes, dtype, aten_op) and collectives. The ops are
those of megatron-core's local layer (no Transformer Engine, no Apex) as the measured runs were
configured (measure/mcore.py: dropout 0, biases only without SwiGLU, softmax in fp32), kernel by
kernel as a profiled megatron-core step shows them (../shared/samples/h200x2-mcore-tp2):
- linear layers: `aten::mm` of [tokens, in] x [in, out] (m = tokens, n = out, k = in); backward
  dgrad (tokens, in, out) and wgrad (out, in, tokens) as the weight is stored [out, in];
- core attention: `baddbmm` Q K^T over b x heads/TP, the scores copied to fp32, a causal mask
  built (fill_, triu, copy_) and applied (masked_fill_), softmax, copied back to bf16, `bmm` with V,
  the context made contiguous; backward mirrors it (softmax backward is a mul and a
  _softmax_backward_data in fp32; Q and K gradients scaled; Q/K/V gradients concatenated); with
  `attention: flash` torch's fused flash kernels instead (flash_core_fwd, flash_core_bwd);
- memory-op bytes follow calib.ops as the converter records them, since the kernel model is fitted on
  those records: every input tensor plus the output (an in-place op counts its tensor twice), a
  device-to-device memcpy its bytes once, a foreach (multi_tensor_apply) op its whole tensor lists on
  every one of its kernels;
- megatron's DDP adds each parameter's gradient into its fp32 main_grad after its backward;
- per micro-batch also the small kernels of the vocab-parallel embedding and cross entropy (id
  masks, target-logit gather, loss averaging), the embedding backward's sort path above 3,072 tokens,
  and megatron-core's MoE routing and token permutation (MOE_ROUTING);
- the optimizer step as megatron-core runs it without Apex (optimizer_ops): per-tensor gradient norm
  and clipping, torch's foreach Adam per parameter group, per-tensor copy into the model weights.
Checked against every profiled H200 step by benchmarks/gen_vs_profile.py: kernel counts within a few
percent except cuBLAS's own memsets before some GEMMs (they follow cuBLAS's kernel choice, not the
op), GPU time per op class as close as the kernel model allows.
Tensor parallelism follows Shoeybi et al. 2019 (column- then row-parallel linears, one all-reduce per
block in each direction) and sequence parallelism Korthikanti et al. 2022 (all-gather before and
reduce-scatter after each block; in backward the layer input is gathered again for the wgrad).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from calib.chakra.model import CommType
from calib.ops import EMBEDDING_BWD, FLOP_CLASSES, classify, in_place_pieces
from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int64": 8, "bool": 1}
RECORD_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int64": "int64", "bool": "bool"}  # calib.ops


@dataclass(frozen=True, slots=True)
class Op:
    """One compute kernel: the OpRecord fields the kernel model predicts from."""

    name: str
    op_class: str  # gemm | attention | memory | other
    flops: float
    bytes: float
    dtype: str
    aten_op: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 0
    repeat: int = 1  # kernels of this shape run back to back (a foreach op's chunks); not an OpRecord field
    # Kernels one instance launches, timed together: the kernel model is fitted on op instances
    # (calib.models.kernel.op_instances sums a norm backward's input- and weight-gradient kernels),
    # so such an op is one record with its kernel count, not one record per kernel.
    kernels: int = 1
    layout: str = ""  # a memory op's operand layout (calib.ops.kernel_layout); "" where unknown

    @property
    def reduced(self) -> bool:
        """A memory-bound op whose shape is known: a reduction (`reduction`: m outputs, k reduced into
        each) or the embedding backward (m indices of k features, `_embedding_grad`)."""
        return self.op_class == "memory" and self.k > 0

    def record(self) -> dict:
        """The calib.ops OpRecord fields as calib.ops.classify records a measured kernel: dtype spelled as
        it writes it, NaN shapes for memory-bound ops but a reduction's m and k, and no FLOPs for memory-bound
        ops (`flops` here counts their elements for the ET; the kernel model never saw them on one)."""
        shaped = self.op_class in FLOP_CLASSES
        nan = float("nan")
        return {
            "op_class": self.op_class, "aten_op": self.aten_op, "m": self.m if shaped or self.reduced else nan,
            "n": self.n if shaped else nan, "k": self.k if shaped or self.reduced else nan,
            "batch": self.batch if shaped else nan,
            "flops": self.flops if self.op_class in FLOP_CLASSES else 0.0, "bytes": self.bytes,
            "dtype": RECORD_DTYPE[self.dtype], "layout": self.layout,
        }


@dataclass(frozen=True, slots=True)
class Coll:
    """A collective on one of the rank's groups; `size_bytes` follows ASTRA-sim's comm_size convention
    (all-gather: the per-rank shard; all-reduce, reduce-scatter, all-to-all: the rank's whole buffer)."""

    name: str
    comm_type: CommType
    size_bytes: int
    group: str  # tp | dp | ep | edp (expert data-parallel)
    asynchronous: bool = False  # compute goes on; a later Wait(name) joins it


@dataclass(frozen=True, slots=True)
class Wait:
    name: str


Item = Op | Coll | Wait

# The kernel layout (calib.ops.kernel_layout) each memory op's role ran with in the profiled H200 steps,
# keyed by role (the template's op name, digits as #): benchmarks/memop_layouts.py matches every
# generated memory op to the profiled kernels of its stage with the same aten op and bytes and counts
# their layouts; a role is listed with its most frequent one. Roles no profiled kernel matched (MoE
# expert ops, whose token counts differ per step, or ops whose broadcast operand the converter sizes
# otherwise) are matched on the aten op alone where the sizes agree within 1.5x. The MoE router's
# small ops (one role for several ops) and ops whose kernels name no layout are not listed.
MEMOP_LAYOUT: dict[str, str] = {
    "attn.context": "strided", "attn.flash.bwd.grad_out": "strided", "attn.flash.bwd.out": "strided",
    "attn.flash.bwd.gqa.k": "reduce128x4", "attn.flash.bwd.gqa.v": "reduce128x4", "attn.gqa.bwd.k": "reduce128x4", "attn.gqa.bwd.v": "reduce512x1",
    "attn.gqa.k": "strided", "attn.gqa.v": "strided", "attn.mask.bool": "unrolled", "attn.mask.fill": "contiguous",
    "attn.masked_fill": "strided", "attn.masked_fill.bwd": "strided", "attn.masked_fill.bwd.copy": "memcpy",
    "attn.norm.bwd.main_grad#": "unrolled", "attn.proj.bias": "strided", "attn.proj.bias.bwd": "reduce128x4",
    "attn.proj.bias.bwd.memset": "memset", "attn.proj.main_grad#": "unrolled", "attn.qk.scale_k": "contiguous",
    "attn.qk.scale_q": "contiguous", "attn.qkv.bias": "contiguous", "attn.qkv.bias.bwd": "reduce128x4",
    "attn.qkv.contiguous": "strided", "attn.qkv.main_grad#": "unrolled", "attn.recompute.context": "strided",
    "attn.recompute.mask.bool": "unrolled", "attn.recompute.mask.fill": "contiguous",
    "attn.recompute.masked_fill": "strided", "attn.recompute.to_bf#": "contiguous",
    "attn.recompute.to_fp#": "unrolled", "attn.residual": "contiguous", "attn.residual.bwd": "contiguous",
    "attn.rope.bwd.k.accumulate": "contiguous", "attn.rope.bwd.k.add": "contiguous",
    "attn.rope.bwd.k.neg": "strided", "attn.rope.bwd.k.rotate": "strided", "attn.rope.bwd.k.zero": "contiguous",
    "attn.rope.bwd.q.accumulate": "contiguous", "attn.rope.bwd.q.add": "strided", "attn.rope.bwd.q.neg": "strided",
    "attn.rope.bwd.q.rotate": "strided", "attn.rope.bwd.q.zero": "contiguous", "attn.rope.k.add": "contiguous",
    "attn.rope.k.cat": "contiguous", "attn.rope.k.cos": "contiguous", "attn.rope.k.cos.cast": "contiguous",
    "attn.rope.k.cos.scale": "contiguous", "attn.rope.k.mul_cos": "strided", "attn.rope.k.mul_sin": "strided",
    "attn.rope.k.neg": "strided", "attn.rope.k.rotate": "strided", "attn.rope.k.sin": "contiguous",
    "attn.rope.k.sin.cast": "contiguous", "attn.rope.k.sin.scale": "contiguous", "attn.rope.q.add": "contiguous",
    "attn.rope.q.cat": "contiguous", "attn.rope.q.cos": "contiguous", "attn.rope.q.cos.cast": "contiguous",
    "attn.rope.q.cos.scale": "contiguous", "attn.rope.q.mul_cos": "strided", "attn.rope.q.mul_sin": "strided",
    "attn.rope.q.neg": "strided", "attn.rope.q.rotate": "strided", "attn.rope.q.sin": "contiguous",
    "attn.rope.q.sin.cast": "contiguous", "attn.rope.q.sin.scale": "contiguous",
    "attn.softmax.bwd.mul": "contiguous", "attn.to_bf#": "contiguous", "attn.to_bf#.bwd": "contiguous",
    "attn.to_fp#": "unrolled", "attn.to_fp#.bwd": "unrolled", "dp.grad_scale.stage#": "contiguous",
    "embedding.add": "contiguous", "embedding.grad#.position_ids": "strided", "embedding.grad#.sort": "sort",
    "embedding.grad#.transpose": "strided", "embedding.grad#.zero": "contiguous", "embedding.grad.copy": "memcpy",
    "embedding.grad.mask": "strided", "embedding.ids.copy": "memcpy", "embedding.ids.ge": "contiguous",
    "embedding.ids.lt": "contiguous", "embedding.ids.masked_fill": "contiguous", "embedding.ids.or": "contiguous",
    "embedding.ids.sub": "contiguous", "embedding.main_grad#": "unrolled", "embedding.mask": "strided",
    "embedding.position_ids": "strided", "embedding.transpose": "strided", "final.norm.bwd.main_grad#": "unrolled",
    "loss.div": "strided", "loss.exp": "contiguous", "loss.grad.scale": "strided", "loss.grad.target": "contiguous",
    "loss.grad.target.copy": "unrolled", "loss.grad.target.sub": "contiguous", "loss.grad.to_bf#": "contiguous",
    "loss.log": "contiguous", "loss.max": "reduce512x1", "loss.mean": "reduce512x1",
    "loss.scalar.#.add_": "contiguous", "loss.scalar.#.div": "contiguous", "loss.scalar.#.div_": "contiguous",
    "loss.scalar.#.fill_": "contiguous", "loss.scalar.#.mul": "contiguous", "loss.scalar.#.mul_": "contiguous",
    "loss.scalar.#.sum": "reduce512x1", "loss.sub": "strided", "loss.sub_target": "contiguous",
    "loss.sum": "reduce512x1", "loss.target.copy": "memcpy", "loss.target.ge": "contiguous",
    "loss.target.lt": "contiguous", "loss.target.masked_fill": "contiguous", "loss.target.or": "contiguous",
    "loss.target.sub": "contiguous", "loss.target_logit.copy": "memcpy", "loss.target_logit.mask": "contiguous",
    "loss.to_fp#": "unrolled", "mlp.chunk.bwd": "contiguous", "mlp.fc#.bias": "strided",
    "mlp.fc#.bias.bwd": "reduce128x4", "mlp.fc#.bias.bwd.memset": "memset", "mlp.fc#.main_grad#": "unrolled",
    "mlp.gate": "contiguous", "mlp.gate.bwd.a": "contiguous", "mlp.gate.bwd.b": "contiguous",
    "mlp.gelu": "contiguous", "mlp.gelu.bwd": "contiguous", "mlp.norm.bwd.main_grad#": "unrolled",
    "mlp.residual": "contiguous", "mlp.residual.bwd": "contiguous", "mlp.silu": "strided",
    "mlp.silu.add": "strided", "mlp.silu.bwd": "strided", "moe.expert#.chunk.bwd": "contiguous",
    "moe.expert#.fc#.main_grad#": "unrolled", "moe.expert#.gate": "contiguous",
    "moe.expert#.gate.bwd.a": "contiguous", "moe.expert#.gate.bwd.b": "contiguous", "moe.expert#.scale": "strided",
    "moe.expert#.scale.bwd": "contiguous", "moe.expert#.scale.bwd.probs": "strided",
    "moe.expert#.scale.bwd.sum": "reduce512x1", "moe.expert#.silu": "strided", "moe.expert#.silu.add": "strided",
    "moe.expert#.silu.bwd": "strided", "moe.permute.bwd.zero": "contiguous", "moe.permute.cat": "contiguous",
    "moe.router.bookkeeping": "dtoh", "moe.router.main_grad#": "unrolled", "moe.unpermute.bwd.cat": "contiguous",
    "moe.unpermute.cat": "contiguous", "moe.unpermute.cat#": "contiguous", "moe.unpermute.zero": "contiguous",
    "optimizer.clip.copy.#": "memcpy", "optimizer.clip.mul.#": "contiguous",
    "optimizer.copy_to_model.#": "contiguous", "optimizer.expert_grad_norm": "dtoh",
    "optimizer.expert_grad_norm.pow": "contiguous", "optimizer.expert_grad_norm.read": "dtoh",
    "optimizer.expert_grad_norm.total": "htod", "optimizer.grad_norm": "dtoh",
    "optimizer.grad_norm.memset": "memset", "optimizer.grad_norm.pow": "contiguous",
    "optimizer.grad_norm.read": "dtoh", "optimizer.grad_norm.tensor.#": "reduce512x1",
    "optimizer.grad_norm.total": "htod", "optimizer.zero_grad": "contiguous",
    "output.logits.main_grad#": "unrolled",
}

CATEGORY = {"tp": "tp", "dp": "dp", "edp": "dp", "ep": "ep", "pp": "pp"}


def gemm(name: str, m: int, n: int, k: int, dtype: str, batch: int = 1, aten_op: str = "aten::mm") -> Op:
    e = DTYPE_BYTES[dtype]
    return Op(name, "gemm", 2.0 * m * n * k * batch, float(e * batch * (m * k + k * n + m * n)), dtype,
              aten_op, m, n, k, batch)


def memop(name: str, bytes_: float, dtype: str, aten_op: str, flops: float = 0.0) -> Op:
    return in_pieces(Op(name, "memory", flops, float(bytes_), dtype, aten_op, layout=memop_layout(name)))


def reduction(name: str, outputs: int, length: int, dtype: str, aten_op: str = "aten::sum") -> Op:
    """A memory-bound reduction of `outputs` rows of `length` elements each (calib.ops.reduction_shape):
    its bytes are the input's and the output's, as the converter records them."""
    return dataclasses.replace(memop(name, outputs * (length + 1) * DTYPE_BYTES[dtype], dtype, aten_op,
                                     outputs * length), m=outputs, k=length)


ROUTED = "moe.expert"  # the ops of one expert: their rows are the tokens routed to it


@dataclass(frozen=True)
class KnownReduction:
    """A generated reduction as a measured kernel row would show it (calib.fit.reduction_shapes)."""

    key: str  # "aten op|dtype", the dtype as calib.ops records it
    outputs: int
    length: int
    element_bytes: int
    routed: bool  # an expert's: a measured step routes its own number of rows to it

    @classmethod
    def of(cls, item: object) -> KnownReduction | None:
        if not isinstance(item, Op) or not item.reduced or item.aten_op == EMBEDDING_BWD:
            return None
        return cls(f"{item.aten_op}|{RECORD_DTYPE[item.dtype]}", item.m, item.k, DTYPE_BYTES[item.dtype],
                   role_of(item.name).startswith(ROUTED))

    def rows_of(self, nbytes: float) -> tuple[int, int] | None:
        """(outputs, length) of a measured row of `nbytes` that is this reduction, else None."""
        per = self.element_bytes * (self.length + 1)
        if self.routed:
            rows = nbytes / per
            return (int(rows), self.length) if rows >= 1 and rows == int(rows) else None
        return (self.outputs, self.length) if nbytes == self.outputs * per else None


def in_pieces(op: Op) -> Op:
    """An in-place op on a tensor past 32-bit indexing (a whole fp32 gradient buffer zeroed or scaled)
    runs as calib.ops.in_place_pieces kernels, each with its share of the bytes, as the converter
    records them."""
    if not op.aten_op.endswith("_") or op.aten_op.startswith("aten::_foreach_"):
        return op
    k = in_place_pieces(op.bytes)
    return op if k == 1 else dataclasses.replace(op, bytes=op.bytes / k, flops=op.flops / k, repeat=op.repeat * k)


def role_of(name: str) -> str:
    """An op's role, the key of MEMOP_LAYOUT: its template name with digits as # and without the
    `recompute.` prefix of a recomputed forward ("recompute.attn.to_fp32" -> "attn.to_fp#")."""
    return re.sub(r"\d+", "#", name.removeprefix("recompute."))


def memop_layout(name: str) -> str:
    """The operand layout a memory op's role ran with in the profiled steps (MEMOP_LAYOUT)."""
    return MEMOP_LAYOUT.get(role_of(name), "")


def padded_vocab(model: ModelSpec, tp: int) -> ModelSpec:
    """Megatron pads the vocabulary to a multiple of 128 x TP (make-vocab-size-divisible-by 128)."""
    mult = 128 * tp
    v = -(-model.vocab // mult) * mult
    return model if v == model.vocab else dataclasses.replace(model, vocab=v)


@dataclass(frozen=True)
class Shapes:
    """Per-GPU sizes of one micro-batch."""

    s: int
    b: int
    h: int
    heads: int  # local heads (heads / TP)
    kv: int  # local K/V width (kv_groups * head_dim / TP)
    d: int
    f: int  # local ffn width (ffn_hidden / TP)
    f1: int  # local fc1 output width (2f for SwiGLU)
    t: int
    sp: bool
    e: int  # bytes per element
    dtype: str
    bias: bool  # linear layers have biases (megatron add_bias_linear; the measured runs: not with SwiGLU)
    gqa: bool  # K/V heads are repeated to the query heads (grouped-query attention)
    rope: bool
    flash: bool = False  # core attention as torch's fused flash kernels (ParallelConfig.attention)

    @property
    def tokens(self) -> int:
        return self.s * self.b

    @property
    def local_tokens(self) -> int:
        """Tokens each TP rank holds outside the TP blocks (split by TP with sequence parallel)."""
        return self.tokens // self.t if self.sp else self.tokens

    @property
    def act_bytes(self) -> int:
        return self.tokens * self.h * self.e

    @property
    def qkv(self) -> int:
        """Local width of the fused QKV projection."""
        return self.heads * self.d + 2 * self.kv

    @property
    def scores(self) -> int:
        """Elements of the local attention scores: b x heads/TP x s x s."""
        return self.b * self.heads * self.s * self.s


def shapes(model: ModelSpec, par: ParallelConfig) -> Shapes:
    t = par.tp
    f = model.ffn_hidden // t
    return Shapes(
        s=model.seq_length, b=par.micro_batch, h=model.hidden, heads=model.heads // t,
        kv=model.kv_groups * model.head_dim // t, d=model.head_dim, f=f,
        f1=2 * f if model.activation == "swiglu" else f, t=t, sp=par.sequence_parallel,
        e=DTYPE_BYTES[par.dtype], dtype=par.dtype, bias=model.activation != "swiglu",
        gqa=model.kv_groups < model.heads, rope=model.position == "rope", flash=par.attention == "flash",
    )


def _norm(name: str, model: ModelSpec, sh: Shapes, backward: bool = False) -> list[Op]:
    """A norm over the local tokens; its backward is one op of two kernels (input and weight
    gradients) and adds the weight gradients into their main_grad."""
    aten = "aten::native_layer_norm" if model.norm == "layernorm" else "aten::_fused_rms_norm"
    n = sh.local_tokens * sh.h
    if not backward:
        return [memop(name, 2 * n * sh.e, sh.dtype, aten, 5.0 * n)]
    weights = [sh.h] * (2 if model.norm == "layernorm" else 1)
    grads = dataclasses.replace(memop(name, 3 * n * sh.e, sh.dtype, aten + "_backward", 7.0 * n), kernels=2)
    return [grads, *main_grad_accumulation(weights, name, sh.dtype)]


def _bias(name: str, tokens: int, width: int, sh: Shapes) -> list[Op]:
    return [memop(name, 2 * tokens * width * sh.e, sh.dtype, "aten::add", tokens * width)] if sh.bias else []


def _bias_grad(name: str, tokens: int, width: int, sh: Shapes) -> list[Op]:
    """A bias gradient: the sum over tokens, a split reduction whose output is zeroed first (a memset
    recorded under aten::sum before every bias-gradient sum in traces/h200/gpt1.3b-dp2-mbs4)."""
    if not sh.bias:
        return []
    return [memop(f"{name}.memset", 64, "fp32", "aten::sum"),
            memop(name, tokens * width * sh.e, sh.dtype, "aten::sum", tokens * width)]


def _residual(name: str, sh: Shapes, backward: bool = False) -> Op:
    n = sh.local_tokens * sh.h
    return memop(name, 3 * n * sh.e, sh.dtype, "aten::add_" if backward else "aten::add", n)


def _enter_block(name: str, sh: Shapes) -> list[Item]:
    """Forward entry to a TP block: all-gather of the sequence shards with SP, identity without."""
    if sh.t == 1 or not sh.sp:
        return []
    return [Coll(name, CommType.ALL_GATHER, sh.act_bytes // sh.t, "tp")]


def _leave_block(name: str, sh: Shapes) -> list[Item]:
    """Forward exit of a TP block: all-reduce, or reduce-scatter with SP."""
    if sh.t == 1:
        return []
    kind = CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE
    return [Coll(name, kind, sh.act_bytes, "tp")]


def _rope(tag: str, sh: Shapes, backward: bool = False) -> list[Op]:
    """megatron's unfused rotary embedding on Q and K: cos and sin of the frequencies (computed in
    fp32 and cast, per tensor), t*cos + rotate_half(t)*sin with rotate_half = cat(-x2, x1), then cat
    with the (empty) pass-through part. Backward: the two products, the rotation, and the gradient
    accumulated into a zeroed buffer."""
    out: list[Op] = []
    freq = 2 * sh.s * sh.d * 4  # the [s, 1, 1, d] fp32 frequencies read and written
    for which, heads in (("q", sh.heads), ("k", sh.kv // sh.d)):
        x = sh.tokens * heads * sh.d * sh.e
        n = x // sh.e
        if not backward:
            for f in ("cos", "sin"):
                out += [memop(f"{tag}.{which}.{f}", freq, "fp32", f"aten::{f}"),
                        memop(f"{tag}.{which}.{f}.scale", freq, "fp32", "aten::mul"),
                        memop(f"{tag}.{which}.{f}.cast", freq, sh.dtype, "aten::copy_")]
        out += [memop(f"{tag}.{which}.mul_cos", 2 * x, sh.dtype, "aten::mul", n),
                memop(f"{tag}.{which}.neg", x, sh.dtype, "aten::neg", n / 2),
                memop(f"{tag}.{which}.rotate", 2 * x, sh.dtype, "aten::cat"),
                memop(f"{tag}.{which}.mul_sin", 2 * x, sh.dtype, "aten::mul", n)]
        if backward:
            out += [memop(f"{tag}.{which}.add", 3 * x, sh.dtype, "aten::add_", n),
                    memop(f"{tag}.{which}.zero", 2 * x, sh.dtype, "aten::fill_"),
                    memop(f"{tag}.{which}.accumulate", 3 * x, sh.dtype, "aten::add_", n)]
        else:
            out += [memop(f"{tag}.{which}.add", 3 * x, sh.dtype, "aten::add", n),
                    memop(f"{tag}.{which}.cat", 2 * x, sh.dtype, "aten::cat")]
    return out


def _gqa_expand(tag: str, sh: Shapes, backward: bool = False) -> list[Op]:
    """K and V repeated from kv_groups to the query heads (an expand made contiguous: a copy_ into
    the new tensor); backward sums the repeats."""
    if not sh.gqa:
        return []
    out = sh.tokens * sh.heads * sh.d * sh.e
    if backward:  # each query group's gradients summed back into its K/V head
        return [reduction(f"{tag}.{w}", sh.tokens * sh.kv, sh.heads * sh.d // sh.kv, sh.dtype) for w in ("k", "v")]
    return [memop(f"{tag}.{w}", 3 * out, sh.dtype, "aten::copy_") for w in ("k", "v")]


def attention_core_fwd(sh: Shapes, tag: str) -> list[Item]:
    bh, S2, ss = sh.b * sh.heads, sh.scores, sh.s * sh.s
    return [
        gemm(f"{tag}.qk", sh.s, sh.s, sh.d, sh.dtype, bh, "aten::baddbmm"),
        memop(f"{tag}.to_fp32", 10 * S2, "fp32", "aten::copy_"),
        memop(f"{tag}.mask.fill", 8 * ss, "fp32", "aten::fill_"),
        memop(f"{tag}.mask.triu", 8 * ss, "fp32", "aten::triu"),
        memop(f"{tag}.mask.bool", 6 * ss, "fp32", "aten::copy_"),
        memop(f"{tag}.masked_fill", 8 * S2 + ss, "fp32", "aten::masked_fill_"),
        memop(f"{tag}.softmax", 8 * S2, "fp32", "aten::_softmax", 5.0 * S2),
        memop(f"{tag}.to_bf16", 8 * S2, sh.dtype, "aten::copy_"),
        gemm(f"{tag}.av", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
        memop(f"{tag}.context", 3 * sh.tokens * sh.heads * sh.d * sh.e, sh.dtype, "aten::copy_"),
    ]


# Type names as the host trace spells them for the flash ops' tensors (calib.ops.classify reads them).
_BF16, _FP32, _U64, _UNSET = ("Tensor(c10::BFloat16)", "Tensor(float)", "Tensor(long unsigned int)",
                              "Tensor(nullptr (uninitialized))")


def flash_attention(name: str, sh: Shapes, backward: bool = False) -> Op:
    """torch's causal flash attention on the local heads (measure/mcore.py: FlashCoreAttention), one op
    with the inputs and outputs its host op records (traces/h100/*-flash: q, k, v in [b, s, heads, d],
    the fp32 log-sum-exp and the RNG state; backward: dq, dk, dv at the K/V heads, three kernels),
    classified by calib.ops as the converter classifies the measured one."""
    q, kv = [sh.b, sh.s, sh.heads, sh.d], [sh.b, sh.s, sh.kv // sh.d, sh.d]
    lse = [sh.b, sh.heads, sh.s]
    if backward:
        aten = "aten::_flash_attention_backward"
        ins = ([q, q, kv, kv, q, lse, [], [], [2], []], [_BF16] * 5 + [_FP32, _UNSET, _UNSET, _U64, _U64])
        outs = ([q, kv, kv], [_BF16] * 3)
    else:
        aten = "aten::_flash_attention_forward"
        ins = ([q, kv, kv], [_BF16] * 3)
        outs = ([q, lse, [2], [], [0]], [_BF16, _FP32, _U64, _U64, _BF16])
    rec = classify(aten, *ins, *outs, causal=True)
    return Op(name, "attention", rec.flops, rec.bytes, sh.dtype, aten, int(rec.m), int(rec.n), int(rec.k),
              int(rec.batch), kernels=3 if backward else 1)


def flash_core_fwd(sh: Shapes, tag: str) -> list[Item]:
    """The flash forward reads Q, K and V as the QKV split leaves them ([s, b, heads, d] views) and
    writes its output in that layout, so neither the local attention's K/V expansion for grouped-query
    attention nor its context copy runs."""
    return [flash_attention(f"{tag}.flash", sh)]


def flash_core_bwd(sh: Shapes, tag: str) -> list[Item]:
    """The output gradient and the output made contiguous for the flash backward, the backward itself,
    and with grouped-query attention the K and V gradients summed over each group's query heads into
    the K/V heads' gradients (a reduction written into them: their bytes count once more). The two
    copies run only for more than one sequence per micro-batch: the backward takes both as [b, s,
    heads, d], and tensors laid out [s, b, heads, d] are that already when b is 1 (no copy in the
    profiled micro-batch-1 steps, llama8b-1gpu-rcsel-flash and mixtral-1gpu-flash)."""
    q = sh.tokens * sh.heads * sh.d * sh.e
    items: list[Item] = [memop(f"{tag}.flash.bwd.{w}", 3 * q, sh.dtype, "aten::copy_")
                         for w in ("grad_out", "out") if sh.b > 1]
    items.append(flash_attention(f"{tag}.flash.bwd", sh, backward=True))
    if sh.gqa:
        outputs, group = sh.tokens * sh.kv, sh.heads * sh.d // sh.kv
        items += [dataclasses.replace(memop(f"{tag}.flash.bwd.gqa.{w}", outputs * (group + 2) * sh.e, sh.dtype,
                                            "aten::sum", outputs * group), m=outputs, k=group) for w in ("k", "v")]
    return items


def attention_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    T = sh.tokens
    items: list[Item] = [*_norm("attn.norm", model, sh)]
    items += _enter_block("attn.ag", sh)
    items.append(gemm("attn.qkv", T, sh.qkv, sh.h, sh.dtype))
    items += _bias("attn.qkv.bias", T, sh.qkv, sh)
    if not sh.bias:  # the QKV output made contiguous for the split (the bias add writes a new tensor)
        items.append(memop("attn.qkv.contiguous", 2 * T * sh.qkv * sh.e, sh.dtype, "aten::copy_"))
    if sh.rope:
        items += _rope("attn.rope", sh)
    if sh.flash:
        items += flash_core_fwd(sh, "attn")
    else:
        items += _gqa_expand("attn.gqa", sh)
        items += attention_core_fwd(sh, "attn")
    items.append(gemm("attn.proj", T, sh.h, sh.heads * sh.d, sh.dtype))
    items += _leave_block("attn.tp", sh)
    items += _bias("attn.proj.bias", sh.local_tokens, sh.h, sh)
    items.append(_residual("attn.residual", sh))
    return items


def _mlp_body_fwd(model: ModelSpec, sh: Shapes, tokens: int, tag: str) -> list[Item]:
    items: list[Item] = [gemm(f"{tag}.fc1", tokens, sh.f1, sh.h, sh.dtype)]
    items += _bias(f"{tag}.fc1.bias", tokens, sh.f1, sh)
    n = tokens * sh.f
    if model.activation == "swiglu":
        items += [memop(f"{tag}.silu", 2 * n * sh.e, sh.dtype, "aten::silu", 4.0 * n),
                  memop(f"{tag}.silu.add", 2 * n * sh.e, sh.dtype, "aten::add", n),
                  memop(f"{tag}.gate", 3 * n * sh.e, sh.dtype, "aten::mul", n)]
    else:
        items.append(memop(f"{tag}.gelu", 2 * n * sh.e, sh.dtype, "aten::gelu", 8.0 * n))
    items.append(gemm(f"{tag}.fc2", tokens, sh.h, sh.f, sh.dtype))
    return items


def moe_tokens(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> tuple[int, int]:
    """(tokens each rank routes, tokens each local expert computes) with balanced routing."""
    routed = sh.local_tokens * model.top_k
    local_experts = model.experts // par.ep
    per_expert = routed * par.ep // model.experts * (sh.t if sh.sp else 1)
    return routed, max(per_expert, 1) if local_experts else 0


# megatron-core's top-k router and alltoall token dispatcher between the router GEMMs and the token
# gather, kernel by kernel in every MoE layer's forward of the profiled Mixtral steps (traces/h200/
# mixtral-ep4, -ep2-mbs2, -tp2ep2-sp, -tp2-sp-rcsel: the same 56 kernels, a few more copies with TP):
# softmax and top-k twice (scores and the aux-loss probabilities), scatters into the routing map, the
# aux-loss sums, the token counts per expert (copied to the host: the sync point) and the sort of the
# token indices by expert. (aten op, op class, kernels); tiny tensors over tokens x experts.
MOE_ROUTING = (("aten::topk", "other", 4), ("aten::_softmax", "memory", 2), ("aten::fill_", "memory", 3),
               ("aten::scatter", "memory", 3), ("aten::sum", "memory", 9), ("aten::mul", "memory", 2),
               ("aten::div", "memory", 1), ("aten::add_", "memory", 1), ("aten::copy_", "memory", 10))
# Device-to-host copies of the routing counts per MoE layer forward (`moe.router.bookkeeping`), as every
# micro-batch of the profiled steps shows them (Memcpy DtoH nodes between the aux-loss sums and the sorts):
# 2 on one GPU (mixtral-1gpu: the tokens per expert and the output token count), 5 with EP or TP
# (mixtral-ep4, -ep2-mbs2, -tp2ep2-sp, -tp2-sp-rcsel: also the input/output splits of the token exchange
# and the tokens per local expert). The host issues them together on a side stream and waits once for
# all of them (calib.workload.host.GROUPED_SYNCS); a replay waits once per group (converted_sync_points).
MOE_DTOH_SINGLE = 2
MOE_DTOH_PARALLEL = 5
MOE_ROUTING_AFTER_SYNC = (("aten::copy_", "memory", 6), ("aten::sort", "other", 4), ("aten::sort", "memory", 3),
                          ("aten::remainder", "memory", 1), ("aten::index", "memory", 1))
# Its backward (the same steps): the permutation's index_add_, the aux loss and the two softmaxes
# differentiated, the routing map's index_put_s, before the router GEMMs' backward.
MOE_ROUTING_BWD = (("aten::fill_", "memory", 3), ("aten::remainder", "memory", 1), ("aten::mul", "memory", 6),
                   ("aten::div_", "memory", 1), ("aten::arange", "memory", 1), ("aten::_index_put_impl_", "memory", 2),
                   ("aten::sum", "memory", 1), ("aten::_softmax_backward_data", "memory", 2),
                   ("aten::copy_", "memory", 3), ("aten::gather", "memory", 1), ("aten::scatter_", "memory", 1),
                   ("aten::add_", "memory", 1))


# The routing map's index_put_ backward ran 2 kernels per layer with 1,024 local tokens (mixtral-tp2-sp-rcsel,
# mixtral-tp2ep2-sp) and 9 with 2,048 or 4,096 (mixtral-ep4, mixtral-ep2-mbs2): 7 more above 1,024.
MOE_INDEX_PUT_FEW_TOKENS = 1024
MOE_INDEX_PUT_MORE = 7


def _small(tag: str, table: tuple, n: int) -> list[Op]:
    """Tiny kernels over n fp32 values (tokens x experts), as many of each aten op as `table` says."""
    return [dataclasses.replace(Op(f"{tag}.{i}", cls, 0.0, float(8 * n), "fp32", aten), repeat=k)
            for i, (aten, cls, k) in enumerate(table)]


def moe_dtoh_reads(par: ParallelConfig) -> int:
    """Device-to-host copies (host syncs) of megatron's alltoall token dispatcher per MoE layer forward."""
    return MOE_DTOH_PARALLEL if par.ep > 1 or par.tp > 1 else MOE_DTOH_SINGLE


def _router(model: ModelSpec, sh: Shapes, reads: int = MOE_DTOH_PARALLEL) -> list[Op]:
    """Router GEMM (run twice in the profiled steps), then megatron's routing bookkeeping (MOE_ROUTING);
    the op named `moe.router.bookkeeping` is where the host reads the token counts: `reads` device-to-host
    copies of per-expert counts (int64), one host sync after them all."""
    n = sh.local_tokens * model.experts
    router = dataclasses.replace(gemm("moe.router", sh.local_tokens, model.experts, sh.h, sh.dtype), repeat=2)
    small = _small("moe.router.routing", MOE_ROUTING, n)
    sync = dataclasses.replace(memop("moe.router.bookkeeping", 8 * model.experts, "int64", "aten::copy_"), repeat=reads)
    return [router, *small, sync, *_small("moe.router.sort", MOE_ROUTING_AFTER_SYNC, n)]


def _permute(sh: Shapes, routed: int) -> list[Op]:
    """Tokens gathered into expert order (alltoall dispatcher): gather with int64 indices, then two cats."""
    x = routed * sh.h * sh.e
    return [memop("moe.permute.gather", x + sh.local_tokens * sh.h * sh.e + routed * sh.h * 8, sh.dtype,
                  "aten::gather"),
            memop("moe.permute.cat", 2 * x, sh.dtype, "aten::cat"),
            memop("moe.permute.cat2", 2 * x, sh.dtype, "aten::cat")]


def _unpermute(sh: Shapes, routed: int) -> list[Op]:
    """Expert outputs back to token order: two cats, a zeroed output and a scatter-add."""
    x = routed * sh.h * sh.e
    return [memop("moe.unpermute.cat", 2 * x, sh.dtype, "aten::cat"),
            memop("moe.unpermute.cat2", 2 * x, sh.dtype, "aten::cat"),
            memop("moe.unpermute.zero", 2 * sh.local_tokens * sh.h * sh.e, sh.dtype, "aten::fill_"),
            memop("moe.unpermute.scatter_add", 6 * x, sh.dtype, "aten::scatter_add_", routed * sh.h)]


def mlp_fwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    items: list[Item] = [*_norm("mlp.norm", model, sh)]
    if not model.is_moe:
        items += _enter_block("mlp.ag", sh)
        items += _mlp_body_fwd(model, sh, sh.tokens, "mlp")
        items += _leave_block("mlp.tp", sh)
        items += _bias("mlp.fc2.bias", sh.local_tokens, sh.h, sh)
    else:
        routed, per_expert = moe_tokens(model, par, sh)
        items += _router(model, sh, moe_dtoh_reads(par))
        items += _permute(sh, routed)
        if par.ep > 1:
            items.append(Coll("moe.dispatch", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        if sh.t > 1:
            items.append(Coll("moe.tp_ag", CommType.ALL_GATHER, routed * sh.h * sh.e, "tp"))
        for x in range(model.experts // par.ep):
            items += _mlp_body_fwd(model, sh, per_expert, f"moe.expert{x}")
            n = per_expert * sh.f  # the expert's activation scaled (a further elementwise pass)
            items.insert(-1, memop(f"moe.expert{x}.scale", 2 * n * sh.e, sh.dtype, "aten::mul", n))
        if sh.t > 1:
            items.append(Coll("moe.tp_rs", CommType.REDUCE_SCATTER, routed * sh.t * sh.h * sh.e, "tp"))
        if par.ep > 1:
            items.append(Coll("moe.combine", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        items += _unpermute(sh, routed)
    items.append(_residual("mlp.residual", sh))
    return items


def layer_fwd(model: ModelSpec, par: ParallelConfig) -> list[Item]:
    sh = shapes(model, par)
    return attention_fwd(model, sh) + mlp_fwd(model, par, sh)


# --- backward ---------------------------------------------------------------------------------


def _linear_bwd(tag: str, m: int, n: int, k: int, sh: Shapes, grad_comm: Coll | None,
                regather: Coll | None = None, bias: bool = False) -> list[Item]:
    """Backward of y[m,n] = x[m,k] W^T (W stored [n,k]): input gradient (dgrad, m x k x n) then
    weight gradient (wgrad, n x k x m), added into the fp32 main_grad (megatron DDP).

    Megatron starts the input-gradient collective asynchronously right after dgrad so that it
    overlaps wgrad; with SP the layer input is all-gathered again (also overlapped) for wgrad."""
    items: list[Item] = []
    if regather is not None:
        items.append(regather)
    items.append(gemm(f"{tag}.dgrad", m, k, n, sh.dtype))
    if grad_comm is not None:
        items.append(grad_comm)
    if regather is not None:
        items.append(Wait(regather.name))
    items.append(gemm(f"{tag}.wgrad", n, k, m, sh.dtype))
    items += main_grad_accumulation([n * k] + ([n] if bias else []), tag, sh.dtype)
    if grad_comm is not None:
        items.append(Wait(grad_comm.name))
    return items


def _grad_in_block(name: str, sh: Shapes) -> list[Item]:
    """Backward of the block exit: the gradient is all-gathered with SP (backward of reduce-scatter)."""
    if sh.t > 1 and sh.sp:
        return [Coll(name, CommType.ALL_GATHER, sh.act_bytes // sh.t, "tp")]
    return []


def _grad_out_block(name: str, sh: Shapes) -> Coll | None:
    """Backward of the block entry: all-reduce of the input gradient, or reduce-scatter with SP."""
    if sh.t == 1:
        return None
    kind = CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE
    return Coll(name, kind, sh.act_bytes, "tp", asynchronous=True)


def _regather(name: str, sh: Shapes) -> Coll | None:
    if sh.t > 1 and sh.sp:
        return Coll(name, CommType.ALL_GATHER, sh.act_bytes // sh.t, "tp", asynchronous=True)
    return None


def attention_core_bwd(sh: Shapes, tag: str) -> list[Item]:
    bh, S2, ss = sh.b * sh.heads, sh.scores, sh.s * sh.s
    q = sh.tokens * sh.heads * sh.d
    return [
        gemm(f"{tag}.av.dgrad_v", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
        gemm(f"{tag}.av.dgrad_probs", sh.s, sh.s, sh.d, sh.dtype, bh, "aten::bmm"),
        memop(f"{tag}.to_fp32.bwd", 10 * S2, "fp32", "aten::copy_"),
        memop(f"{tag}.softmax.bwd.mul", 12 * S2, "fp32", "aten::mul", S2),
        memop(f"{tag}.softmax.bwd", 12 * S2, "fp32", "aten::_softmax_backward_data", 3.0 * S2),
        memop(f"{tag}.masked_fill.bwd.copy", 4 * S2, "fp32", "aten::copy_"),
        memop(f"{tag}.masked_fill.bwd", 8 * S2 + ss, "fp32", "aten::masked_fill_"),
        memop(f"{tag}.to_bf16.bwd", 8 * S2, sh.dtype, "aten::copy_"),
        gemm(f"{tag}.qk.dgrad_q", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
        memop(f"{tag}.qk.scale_q", 2 * q * sh.e, sh.dtype, "aten::mul", q),
        gemm(f"{tag}.qk.dgrad_k", sh.d, sh.s, sh.s, sh.dtype, bh, "aten::bmm"),
        memop(f"{tag}.qk.scale_k", 2 * q * sh.e, sh.dtype, "aten::mul", q),
    ]


# Roles whose layout depends on the configuration, not listed in MEMOP_LAYOUT: attn.qkv.cat
# (qkv_cat_layout), embedding.grad# (its path by the number of indices, _embedding_grad).
LAYOUT_BY_CONFIG = frozenset({"attn.qkv.cat", "embedding.grad#"})


def qkv_cat_layout(sh: Shapes, par: ParallelConfig) -> str:
    """The layout of the Q, K and V gradients' concatenation. With one K/V head per query head
    (GPT-3) torch takes its generic, element-indexed copy (CatArrayBatchedCopy, ~0.9 TB/s in the H200
    steps), except under selective recomputation, whose recomputed core attention hands back
    gradients it copies vectorized (~4x faster), as it always does those of grouped-query attention
    and those the flash backward hands back (every profiled step: benchmarks/memop_layouts.py;
    traces/h100/*-flash)."""
    return "contiguous" if sh.gqa or sh.flash or par.recompute == "selective" else "strided"


def attention_bwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    T = sh.tokens
    items: list[Item] = list(_grad_in_block("attn.tp.bwd", sh))
    items += _bias_grad("attn.proj.bias.bwd", sh.local_tokens, sh.h, sh)
    items += _linear_bwd("attn.proj", T, sh.h, sh.heads * sh.d, sh, None, bias=sh.bias)
    if sh.flash:
        if par.recompute == "selective":
            items += flash_core_fwd(sh, "attn.recompute")
        items += flash_core_bwd(sh, "attn")
    else:
        if par.recompute == "selective":  # megatron's selective recomputation: the core attention forward
            items += attention_core_fwd(sh, "attn.recompute")
        items += attention_core_bwd(sh, "attn")
        items += _gqa_expand("attn.gqa.bwd", sh, backward=True)
    if sh.rope:
        items += _rope("attn.rope.bwd", sh, backward=True)
    items.append(dataclasses.replace(memop("attn.qkv.cat", 2 * T * sh.qkv * sh.e, sh.dtype, "aten::cat"),
                                     layout=qkv_cat_layout(sh, par)))
    items += _bias_grad("attn.qkv.bias.bwd", T, sh.qkv, sh)
    items += _linear_bwd("attn.qkv", T, sh.qkv, sh.h, sh, _grad_out_block("attn.ag.bwd", sh),
                         _regather("attn.ag.again", sh), bias=sh.bias)
    items += _norm("attn.norm.bwd", model, sh, backward=True)
    items.append(_residual("attn.residual.bwd", sh, backward=True))
    return items


def _mlp_body_bwd(model: ModelSpec, sh: Shapes, tokens: int, tag: str, grad_comm: Coll | None,
                  regather: Coll | None) -> list[Item]:
    items = _linear_bwd(f"{tag}.fc2", tokens, sh.h, sh.f, sh, None, bias=sh.bias)
    n = tokens * sh.f
    if model.activation == "swiglu":
        items += [memop(f"{tag}.gate.bwd.a", 3 * n * sh.e, sh.dtype, "aten::mul", n),
                  memop(f"{tag}.gate.bwd.b", 3 * n * sh.e, sh.dtype, "aten::mul", n),
                  memop(f"{tag}.silu.bwd", 3 * n * sh.e, sh.dtype, "aten::silu_backward", 6.0 * n),
                  memop(f"{tag}.chunk.bwd", 4 * n * sh.e, sh.dtype, "aten::cat")]
    else:
        items.append(memop(f"{tag}.gelu.bwd", 3 * n * sh.e, sh.dtype, "aten::gelu_backward", 10.0 * n))
    items += _bias_grad(f"{tag}.fc1.bias.bwd", tokens, sh.f1, sh)
    items += _linear_bwd(f"{tag}.fc1", tokens, sh.f1, sh.h, sh, grad_comm, regather, bias=sh.bias)
    return items


def mlp_bwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    items: list[Item] = []
    if not model.is_moe:
        items += _grad_in_block("mlp.tp.bwd", sh)
        items += _bias_grad("mlp.fc2.bias.bwd", sh.local_tokens, sh.h, sh)
        items += _mlp_body_bwd(model, sh, sh.tokens, "mlp", _grad_out_block("mlp.ag.bwd", sh),
                               _regather("mlp.ag.again", sh))
    else:
        routed, per_expert = moe_tokens(model, par, sh)
        x = routed * sh.h * sh.e
        items += [memop("moe.unpermute.bwd.gather", x + sh.local_tokens * sh.h * sh.e + routed * sh.h * 8, sh.dtype,
                        "aten::gather"),
                  memop("moe.unpermute.bwd.cat", 2 * x, sh.dtype, "aten::cat")]
        if par.ep > 1:
            items.append(Coll("moe.combine.bwd", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        if sh.t > 1:
            items.append(Coll("moe.tp_rs.bwd", CommType.ALL_GATHER, routed * sh.h * sh.e, "tp"))
        for x in range(model.experts // par.ep):
            n = per_expert * sh.f
            # the scaling by the routing probability differentiated: both inputs' gradients and a sum
            items += [memop(f"moe.expert{x}.scale.bwd", 3 * n * sh.e, sh.dtype, "aten::mul", n),
                      memop(f"moe.expert{x}.scale.bwd.probs", 3 * n * sh.e, sh.dtype, "aten::mul", n),
                      reduction(f"moe.expert{x}.scale.bwd.sum", per_expert, sh.f, sh.dtype)]
            items += _mlp_body_bwd(model, sh, per_expert, f"moe.expert{x}", None, None)
        if sh.t > 1:
            items.append(Coll("moe.tp_ag.bwd", CommType.REDUCE_SCATTER, routed * sh.t * sh.h * sh.e, "tp"))
        if par.ep > 1:
            items.append(Coll("moe.dispatch.bwd", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        cat = memop("moe.permute.bwd.cat", 2 * x, sh.dtype, "aten::cat")
        items += [dataclasses.replace(cat, repeat=4),
                  memop("moe.permute.bwd.zero", 2 * sh.local_tokens * sh.h * sh.e, sh.dtype, "aten::fill_"),
                  memop("moe.permute.bwd.index_add", 6 * routed * sh.h * sh.e, sh.dtype, "aten::index_add_",
                        routed * sh.h)]
        items += _small("moe.router.routing.bwd", MOE_ROUTING_BWD, sh.local_tokens * model.experts)
        if sh.local_tokens > MOE_INDEX_PUT_FEW_TOKENS:
            n = sh.local_tokens * model.experts
            items.append(dataclasses.replace(memop("moe.router.routing.bwd.index_put", 8 * n, "fp32",
                                                   "aten::_index_put_impl_"), repeat=MOE_INDEX_PUT_MORE))
        items += _linear_bwd("moe.router", sh.local_tokens, model.experts, sh.h, sh, None)
        items.append(memop("moe.router.grad_add", 3 * sh.local_tokens * sh.h * sh.e, sh.dtype, "aten::add",
                           sh.local_tokens * sh.h))
    items += _norm("mlp.norm.bwd", model, sh, backward=True)
    items.append(_residual("mlp.residual.bwd", sh, backward=True))
    return items


def main_grad_accumulation(tensors: list[int], tag: str, dtype: str) -> list[Op]:
    """megatron DDP: param.main_grad (fp32) += param.grad after each parameter's backward."""
    e = DTYPE_BYTES[dtype]
    return [memop(f"{tag}.main_grad{i}", n * (4 + e + 4), "fp32", "aten::add_", n) for i, n in enumerate(tensors)]


def layer_bwd(model: ModelSpec, par: ParallelConfig) -> list[Item]:
    """Backward of one layer; with full recomputation its forward (collectives included) runs first."""
    sh = shapes(model, par)
    pre: list[Item] = []
    if par.recompute == "full":
        pre = [_renamed(i, "recompute.") for i in layer_fwd(model, par)]
    return pre + mlp_bwd(model, par, sh) + attention_bwd(model, par, sh)


def _renamed(item: Item, prefix: str) -> Item:
    if isinstance(item, Op):
        return dataclasses.replace(item, name=prefix + item.name)
    if isinstance(item, Coll):
        return Coll(prefix + item.name, item.comm_type, item.size_bytes, item.group, item.asynchronous)
    return Wait(prefix + item.name)


# --- embedding, output layer and loss, optimizer ------------------------------------------------


def _vocab_mask(tag: str, T: int) -> list[Op]:
    """megatron's vocabulary-range mask of the token ids (vocab-parallel embedding and cross entropy):
    (id < start) | (id >= end), the ids copied and shifted by start, the out-of-range ones zeroed;
    int64 ids, T tokens (bytes as calib.ops records them, a device copy's once)."""
    return [memop(f"{tag}.lt", 9 * T, "int64", "aten::lt"), memop(f"{tag}.ge", 9 * T, "int64", "aten::ge"),
            memop(f"{tag}.or", 3 * T, "bool", "aten::bitwise_or"), memop(f"{tag}.copy", 8 * T, "int64", "aten::copy_"),
            memop(f"{tag}.sub", 16 * T + 8, "int64", "aten::sub"),
            memop(f"{tag}.masked_fill", 17 * T, "int64", "aten::masked_fill_")]


def embedding_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    """The micro-batch's token ids drawn (the measurement harness's synthetic data), then the
    vocab-parallel embedding: with TP each rank masks the ids outside its vocabulary slice, looks
    up its slice (a gather with the ids expanded to [tokens, hidden]) and zeroes the masked rows; the
    partial embeddings are summed (all-reduce, or reduce-scatter into sequence shards with SP);
    learned positions are added and the result transposed to [s, b, h]."""
    x = sh.act_bytes
    T = sh.tokens
    table = model.vocab // sh.t * sh.h * sh.e
    items: list[Item] = [memop("data.tokens", 16 * T, "int64", "aten::random_")]
    if sh.t > 1:
        items += _vocab_mask("embedding.ids", T)
    items.append(memop("embedding.lookup", table + T * sh.h * (8 + 2 * sh.e), sh.dtype, "aten::gather"))
    if sh.t > 1:
        items.append(memop("embedding.mask", 2 * x + T, sh.dtype, "aten::masked_fill_"))
    items += _leave_block("embedding.tp", sh)
    if model.position == "learned":
        if sh.b > 1:  # the position ids expanded over the batch made contiguous
            items.append(memop("embedding.position_ids", 24 * T, "int64", "aten::copy_"))
        items.append(memop("embedding.position", model.seq_length * sh.h * sh.e + T * sh.h * (8 + 2 * sh.e), sh.dtype,
                           "aten::gather"))
        items.append(memop("embedding.add", 3 * x // (sh.t if sh.sp else 1), sh.dtype, "aten::add"))
    if sh.b > 1:  # [b, s, h] -> [s, b, h] made contiguous (a view when b = 1: no kernel in the profiled steps)
        items.append(memop("embedding.transpose", 3 * x // (sh.t if sh.sp else 1), sh.dtype, "aten::copy_"))
    return items


# torch's embedding_dense_backward (aten/src/ATen/native/cuda/Embedding.cu) takes a one-kernel path
# for at most 3,072 indices and otherwise sorts the indices: 29 kernels in traces/h200 (llama8b-1gpu-mbs2,
# gpt1.3b-dp2-mbs4), for the 2,048-row position table as for the word table: 20 (radix-sort passes with
# their memsets) before the table's gradient is zeroed, 9 (unique-by-key, scans, compute_grad_weight,
# sum_and_scatter) after. The fit takes each of the three as one op instance labelled by its path
# (calib.ops.call_layout), timed by its token gradients (m indices of k features).
EMBEDDING_BWD_FEATURE_MAX_INDICES = 3072
EMBEDDING_BWD_SORT_KERNELS = 20
EMBEDDING_BWD_SEGMENT_KERNELS = 9


def _embedding_grad(tag: str, rows: int, sh: Shapes) -> list[Op]:
    """The gradient of one embedding table of `rows` rows: zeroed, then the token gradients summed
    into it (record bytes: table, token gradients and int64 indices, as calib.ops records them; m the
    indices, k the features of each)."""
    table = rows * sh.h * sh.e
    T = sh.tokens
    zero = memop(f"{tag}.zero", 2 * table, sh.dtype, "aten::fill_")
    grad = dataclasses.replace(memop(f"{tag}", table + sh.act_bytes + 8 * T, sh.dtype, EMBEDDING_BWD), m=T, k=sh.h)
    if T <= EMBEDDING_BWD_FEATURE_MAX_INDICES:
        return [zero, dataclasses.replace(grad, layout="feature")]
    return [memop(f"{tag}.arange", 8 * T, "int64", "aten::arange"),
            dataclasses.replace(grad, name=f"{tag}.sort", layout=memop_layout(f"{tag}.sort"),
                                kernels=EMBEDDING_BWD_SORT_KERNELS), zero,
            dataclasses.replace(grad, layout="segments", kernels=EMBEDDING_BWD_SEGMENT_KERNELS)]


def embedding_bwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    """Backward of embedding_fwd as profiled: with TP the gradient copied (a device copy: its bytes once)
    and its masked rows zeroed; with micro-batches of more than one sequence the [s, b, h] gradient
    made contiguous in [b, s, h] order for each table (the position ids too); each table's gradient
    (`_embedding_grad`, the position table's first) added into its main_grad."""
    items: list[Item] = list(_grad_in_block("embedding.tp.bwd", sh))
    x = sh.act_bytes
    if sh.t > 1:
        items += [memop("embedding.grad.copy", x, sh.dtype, "aten::copy_"),
                  memop("embedding.grad.mask", 2 * x + sh.tokens, sh.dtype, "aten::masked_fill_")]
    rows = [model.vocab // sh.t] + ([model.seq_length] if model.position == "learned" else [])
    for i, r in enumerate(reversed(rows)):
        if sh.b > 1:
            if r == model.seq_length and model.position == "learned":
                items.append(memop(f"embedding.grad{i}.position_ids", 24 * sh.tokens, "int64", "aten::copy_"))
            items.append(memop(f"embedding.grad{i}.transpose", 3 * x, sh.dtype, "aten::copy_"))
        items += _embedding_grad(f"embedding.grad{i}", r, sh)
    items += main_grad_accumulation([r * sh.h for r in rows], "embedding", sh.dtype)
    return items


def output_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    """Final norm, vocab-parallel output GEMM and megatron's vocab-parallel cross entropy in fp32
    (logits copied to fp32, max, subtract, exp, sum, divide; 3 all-reduces of one fp32 value per
    token over TP: max logit, sum of exponentials, target logit)."""
    T = sh.tokens
    v = model.vocab // sh.t
    n = T * v
    items: list[Item] = [*_norm("final.norm", model, sh)]
    items += _enter_block("output.ag", sh)
    items.append(gemm("output.logits", T, v, sh.h, sh.dtype))
    items += [
        memop("loss.to_fp32", n * (sh.e + 8), "fp32", "aten::copy_"),
        memop("loss.max", 4 * n, "fp32", "aten::max", n),
        memop("loss.sub", 8 * n, "fp32", "aten::sub_", n),
        *_vocab_mask("loss.target", T),
        memop("loss.arange", 8 * T, "int64", "aten::arange"),
        memop("loss.target_logit", 4 * n + 8 * T, "fp32", "aten::index"),
        memop("loss.target_logit.copy", 4 * T, "fp32", "aten::copy_"),
        memop("loss.target_logit.mask", 9 * T, "fp32", "aten::masked_fill_"),
        memop("loss.exp", 12 * n, "fp32", "aten::exp", n),
        memop("loss.sum", 4 * n, "fp32", "aten::sum", n),
        memop("loss.log", 8 * T, "fp32", "aten::log", T),
        memop("loss.sub_target", 12 * T, "fp32", "aten::sub", T),
        memop("loss.div", 8 * n, "fp32", "aten::div_", n),
        memop("loss.mean", 4 * T + 4, "fp32", "aten::mean", T),
    ]
    # The loss scaled and averaged for the backward pass and the log: scalar kernels (a profiled step:
    # mul_, div_, add_, mul, fill_, mul, sum, div, mul after the mean, in every micro-batch).
    items += [memop(f"loss.scalar.{i}.{a}", b, "fp32", f"aten::{a}") for i, (a, b) in enumerate(
        (("mul_", 16), ("div_", 16), ("add_", 12), ("mul", 12), ("fill_", 8), ("mul", 12), ("sum", 8), ("div", 16),
         ("mul", 16)))]
    if sh.t > 1:
        items += [Coll(f"loss.tp{i}", CommType.ALL_REDUCE, T * 4, "tp") for i in range(3)]
    return items


def output_bwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    T = sh.tokens
    v = model.vocab // sh.t
    n = T * v
    items: list[Item] = [
        memop("loss.grad.mean", 4 * T + 8, "fp32", "aten::div", T),
        memop("loss.grad.arange", 8 * T, "int64", "aten::arange"),
        memop("loss.grad.target.copy", 9 * T, "int64", "aten::copy_"),
        memop("loss.grad.target.sub", 8 * T + 8, "fp32", "aten::sub", T),
        memop("loss.grad.index", 4 * n + 8 * T, "fp32", "aten::index"),
        memop("loss.grad.target", 12 * T, "fp32", "aten::sub_", T),
        memop("loss.grad.index_put", 8 * n + 16 * T, "fp32", "aten::_index_put_impl_"),
        memop("loss.grad.scale", 8 * n, "fp32", "aten::mul_", n),
        memop("loss.grad.to_bf16", n * (4 + 2 * sh.e), sh.dtype, "aten::copy_"),
    ]
    items += _linear_bwd("output.logits", T, v, sh.h, sh, _grad_out_block("output.ag.bwd", sh),
                         _regather("output.ag.again", sh))
    items += _norm("final.norm.bwd", model, sh, backward=True)
    return items


def param_tensors(model: ModelSpec, par: ParallelConfig, layers: int, first: bool,
                  last: bool) -> list[tuple[int, bool, bool]]:
    """(elements, is a matrix, is an expert's) of every parameter tensor on one GPU of a pipeline stage
    holding `layers` layers (the embedding on the first stage, final norm and output layer on the
    last), in megatron-core's registration order; `model` with its vocabulary padded (padded_vocab).
    Matrices are split by TP; norms, and the biases of row-parallel layers, are whole. Experts are
    separate tensors (experts / EP on a GPU)."""
    t = par.tp
    h, f = model.hidden, model.ffn_hidden // t
    f1 = 2 * f if model.activation == "swiglu" else f
    bias = model.activation != "swiglu"
    qkv = (model.heads * model.head_dim + 2 * model.kv_groups * model.head_dim) // t
    norm = [(h, False, False)] * (2 if model.norm == "layernorm" else 1)

    def mlp(b: bool, expert: bool) -> list[tuple[int, bool, bool]]:
        return ([(f1 * h, True, expert)] + ([(f1, False, expert)] if b else []) + [(h * f, True, expert)]
                + ([(h, False, expert)] if b else []))

    layer = [*norm, (qkv * h, True, False)] + ([(qkv, False, False)] if bias else [])
    layer += [(h * model.heads * model.head_dim // t, True, False)] + ([(h, False, False)] if bias else []) + norm
    if model.is_moe:
        layer.append((model.experts * h, True, False))
        for _ in range(model.experts // par.ep):
            layer += mlp(False, True)
    else:
        layer += mlp(bias, False)
    out: list[tuple[int, bool, bool]] = []
    if first:
        out.append((model.vocab // t * h, True, False))
        if model.position == "learned":
            out.append((model.seq_length * h, True, False))
    out += layer * layers
    if last:
        out += norm
        if not (model.tied_embeddings and first):
            out.append((model.vocab // t * h, True, False))
    return out


# torch's foreach Adam(W) (torch.optim.adam._multi_tensor_adam) on the fp32 master weights, op by op as
# the profiled steps run it: weight-decay mul_, exp_avg lerp_, exp_avg_sq mul_ and addcmul_, sqrt,
# div_ and add_ of the denominator, addcdiv_ of the update. Per op: (name, bytes per parameter of the
# record as calib.ops writes it: every input tensor list plus the output list, an in-place op's
# list once, e.g. 12 for addcmul_(exp_avg_sq, grad, grad) = 11,538,530,304 bytes on 961,581,056
# parameters in traces/h200/llama8b-tp2; tensor lists the kernel reads (multi_tensor_apply depth);
# the scalar argument is a list (ScalarList variant)).
ADAM_FOREACH = (("mul_", 4, 1, False), ("lerp_", 8, 2, False), ("mul_", 4, 1, False), ("addcmul_", 12, 3, False),
                ("sqrt", 8, 2, False), ("div_", 4, 1, True), ("add_", 4, 1, False), ("addcdiv_", 12, 3, True))
# torch's multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh): chunks of kChunkSize
# elements, one block each; a kernel is launched when depth_to_max_blocks (320) blocks or
# depth_to_max_tensors tensors (a tensor's last chunk) are filled, and once more for what is left.
FOREACH_CHUNK = 65536
FOREACH_MAX_BLOCKS = 320
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)
FOREACH_MAX_TENSORS_SCALARLIST = (96, 64, 48, 36, 30)
FOREACH_CHUNK_ELEMENTS = FOREACH_MAX_BLOCKS * FOREACH_CHUNK  # elements of one full kernel


def foreach_launches(numels: list[int], depth: int, scalar_list: bool = False) -> int:
    """Kernels torch's multi_tensor_apply launches for one foreach op over tensors of `numels` elements."""
    max_tensors = (FOREACH_MAX_TENSORS_SCALARLIST if scalar_list else FOREACH_MAX_TENSORS)[depth - 1]
    launches = blocks = tensors = 0
    for n in numels:
        if n <= 0:
            continue
        tensors += 1
        left = -(-n // FOREACH_CHUNK)
        while left:
            take = min(left, FOREACH_MAX_BLOCKS - blocks)
            blocks += take
            left -= take
            if blocks == FOREACH_MAX_BLOCKS:  # the current tensor goes on in the next kernel unless it ended
                launches += 1
                blocks, tensors = 0, (0 if left == 0 else 1)
        if tensors == max_tensors:
            launches += 1
            blocks = tensors = 0
    return launches + (1 if blocks else 0)


def _per_tensor(name: str, sizes: list[int], per_elem: int, extra: int, dtype: str, aten: str,
                flops: bool = False) -> list[Op]:
    """One kernel per tensor (a Python loop over the parameters), grouped by size: an Op per size
    with `repeat` the number of tensors of that size."""
    counts: dict[int, int] = {}
    for n in sizes:
        counts[n] = counts.get(n, 0) + 1
    return [dataclasses.replace(memop(f"{name}.{n}", per_elem * n + extra, dtype, aten, float(n) if flops else 0.0),
                                repeat=c) for n, c in counts.items()]


def optimizer_ops(local_params: float, tensors: list[tuple[int, bool]], dtype: str,
                  expert_tensors: int = 0) -> list[Op]:
    """One optimizer step of megatron-core's mixed-precision optimizer (no Apex, no Transformer Engine)
    on one GPU whose optimizer updates the fp32 master tensors `tensors` ((elements, is a matrix): all
    local parameters, or the pieces in this GPU's shard with the distributed optimizer), kernel by
    kernel as traces/h200/llama8b-tp2 and gpt1.3b-dp2-mbs4 show it:
    - the fp32 gradient buffer of all local parameters zeroed;
    - the gradient norm for clipping tensor by tensor: a norm reduction each (matrices: a memset of
      its output first), each read by the host (a device-to-host copy and a host sync each,
      `optimizer.grad_norm.read`: megatron-core without Apex builds a host tensor of the per-tensor
      norms), the total copied back, squared, and read by the host (the sync point `optimizer.grad_norm`).
      With EP the expert parameters (the last `expert_tensors` of `tensors` in count) have an optimizer
      of their own: their norms are read and totalled separately (`optimizer.expert_grad_norm.read`,
      `optimizer.expert_grad_norm`), as traces/h200/mixtral-ep2-mbs2, -ep4 and -tp2ep2-sp show (13 + 1
      dense and 16 + 1 or 8 + 1 expert device-to-host reads);
    - clipping tensor by tensor: the gradient times the clip factor, copied back;
    - Adam as torch's foreach ops, once per parameter group (with weight decay: the matrices; without:
      norms and biases), each op as multi_tensor_apply launches it (`foreach_launches`), every kernel
      with the whole op's record (as the converter records them and the kernel model times them);
    - the updated master weights copied into the bf16/fp16 model weights, tensor by tensor."""
    sizes = [n for n, _ in tensors]
    ops = [memop("optimizer.zero_grad", 8 * local_params, "fp32", "aten::fill_")]
    mats = [n for n, m in tensors if m]
    if mats:
        ops.append(dataclasses.replace(memop("optimizer.grad_norm.memset", 4, "fp32", "aten::linalg_vector_norm"),
                                       repeat=len(mats)))
    ops += _per_tensor("optimizer.grad_norm.tensor", sizes, 4, 4, "fp32", "aten::linalg_vector_norm", True)
    expert_tensors = min(max(expert_tensors, 0), len(sizes))
    for tag, count in (("grad_norm", len(sizes) - expert_tensors), ("expert_grad_norm", expert_tensors)):
        if not count:
            continue
        ops.append(dataclasses.replace(memop(f"optimizer.{tag}.read", 4, "fp32", "aten::_local_scalar_dense"),
                                       repeat=count))
        ops += [memop(f"optimizer.{tag}.total", 4, "fp32", "aten::copy_"),
                memop(f"optimizer.{tag}.pow", 8, "fp32", "aten::pow", 1.0),
                memop(f"optimizer.{tag}", 4, "fp32", "aten::_local_scalar_dense")]
    ops += _per_tensor("optimizer.clip.mul", sizes, 8, 8, "fp32", "aten::mul", True)
    ops += _per_tensor("optimizer.clip.copy", sizes, 4, 0, "fp32", "aten::copy_")  # a DtoD memcpy: its bytes once
    for g, group in enumerate((mats, [n for n, m in tensors if not m])):
        if not group:
            continue
        total = float(sum(group))
        for i, (name, b, depth, scalar_list) in enumerate(ADAM_FOREACH):
            op = memop(f"optimizer.adam.g{g}.{i}.{name}", b * total, "fp32", f"aten::_foreach_{name}", total)
            ops.append(dataclasses.replace(op, repeat=foreach_launches(group, depth, scalar_list)))
    if dtype != "fp32":
        e = DTYPE_BYTES[dtype]
        ops += _per_tensor("optimizer.copy_to_model", sizes, 4 + 2 * e, 0, dtype, "aten::copy_")
    return ops
