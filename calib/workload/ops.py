"""What one transformer layer (and the embedding, output layer and optimizer) runs, as templates.

A template is the ordered list of one pass's work on one GPU: compute ops (the OpRecord fields of
calib.ops: op_class, m, n, k, batch, flops, bytes, dtype, aten_op) and collectives. Shapes are those
of megatron-core's local (non Transformer-Engine) layer, the one the measured runs used: the
linear layers run as `aten::mm` on [tokens, in] x [in, out] (m = tokens, n = out, k = in); attention
is core attention as `aten::baddbmm` / `aten::bmm` over b x heads/TP matrices with the s x s scores,
a fused softmax and dropout in between. Tensor parallelism follows Shoeybi et al. 2019 (column-
then row-parallel linears, one all-reduce per block in each direction) and sequence parallelism
Korthikanti et al. 2022 (all-gather before and reduce-scatter after each block; in backward the
layer input is gathered again for the weight gradient).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from calib.chakra.model import CommType
from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECORD_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # calib.ops spelling


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

    def record(self) -> dict:
        """The calib.ops OpRecord fields (dtype spelled as calib.ops writes it; NaN shapes for non-GEMMs)."""
        gemm = self.op_class == "gemm"
        nan = float("nan")
        return {
            "op_class": self.op_class, "aten_op": self.aten_op, "m": self.m if gemm else nan,
            "n": self.n if gemm else nan, "k": self.k if gemm else nan, "batch": self.batch if gemm else nan,
            "flops": self.flops, "bytes": self.bytes, "dtype": RECORD_DTYPE[self.dtype],
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

CATEGORY = {"tp": "tp", "dp": "dp", "edp": "dp", "ep": "ep", "pp": "pp"}


def gemm(name: str, m: int, n: int, k: int, dtype: str, batch: int = 1, aten_op: str = "aten::mm") -> Op:
    e = DTYPE_BYTES[dtype]
    return Op(name, "gemm", 2.0 * m * n * k * batch, float(e * batch * (m * k + k * n + m * n)), dtype,
              aten_op, m, n, k, batch)


def memop(name: str, bytes_: float, dtype: str, aten_op: str, flops: float = 0.0) -> Op:
    return Op(name, "memory", flops, float(bytes_), dtype, aten_op)


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


def shapes(model: ModelSpec, par: ParallelConfig) -> Shapes:
    t = par.tp
    f = model.ffn_hidden // t
    return Shapes(
        s=model.seq_length, b=par.micro_batch, h=model.hidden, heads=model.heads // t,
        kv=model.kv_groups * model.head_dim // t, d=model.head_dim, f=f,
        f1=2 * f if model.activation == "swiglu" else f, t=t, sp=par.sequence_parallel,
        e=DTYPE_BYTES[par.dtype], dtype=par.dtype,
    )


def _norm(name: str, model: ModelSpec, sh: Shapes, backward: bool = False) -> Op:
    aten = "aten::native_layer_norm" if model.norm == "layernorm" else "aten::rms_norm"
    n = sh.local_tokens * sh.h
    return memop(name, (3 if backward else 2) * n * sh.e, sh.dtype, aten + ("_backward" if backward else ""), 5.0 * n)


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


def attention_core_fwd(sh: Shapes, tag: str) -> list[Item]:
    bh = sh.b * sh.heads
    scores = bh * sh.s * sh.s
    return [
        gemm(f"{tag}.qk", sh.s, sh.s, sh.d, sh.dtype, bh, "aten::baddbmm"),
        memop(f"{tag}.softmax_dropout", 3 * scores * sh.e + scores, sh.dtype, "aten::_softmax", 5.0 * scores),
        gemm(f"{tag}.av", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
    ]


def attention_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    T = sh.tokens
    items: list[Item] = [_norm("attn.norm", model, sh)]
    items += _enter_block("attn.ag", sh)
    items.append(gemm("attn.qkv", T, sh.heads * sh.d + 2 * sh.kv, sh.h, sh.dtype))
    if model.position == "rope":
        n = T * (sh.heads * sh.d + sh.kv)
        items.append(memop("attn.rope", 2 * n * sh.e, sh.dtype, "aten::mul", 3.0 * n))
    items += attention_core_fwd(sh, "attn")
    items.append(gemm("attn.proj", T, sh.h, sh.heads * sh.d, sh.dtype))
    items += _leave_block("attn.tp", sh)
    n = sh.local_tokens * sh.h
    items.append(memop("attn.residual", 3 * n * sh.e + n, sh.dtype, "aten::add", 2.0 * n))
    return items


def _mlp_body_fwd(model: ModelSpec, sh: Shapes, tokens: int, tag: str) -> list[Item]:
    items: list[Item] = [gemm(f"{tag}.fc1", tokens, sh.f1, sh.h, sh.dtype)]
    n = tokens * sh.f
    act_bytes = (3 if model.activation == "swiglu" else 2) * n * sh.e
    aten = "aten::silu" if model.activation == "swiglu" else "aten::gelu"
    items.append(memop(f"{tag}.act", act_bytes, sh.dtype, aten, 8.0 * n))
    items.append(gemm(f"{tag}.fc2", tokens, sh.h, sh.f, sh.dtype))
    return items


def moe_tokens(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> tuple[int, int]:
    """(tokens each rank routes, tokens each local expert computes) with balanced routing."""
    routed = sh.local_tokens * model.top_k
    local_experts = model.experts // par.ep
    per_expert = routed * par.ep // model.experts * (sh.t if sh.sp else 1)
    return routed, max(per_expert, 1) if local_experts else 0


def mlp_fwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    items: list[Item] = [_norm("mlp.norm", model, sh)]
    if not model.is_moe:
        items += _enter_block("mlp.ag", sh)
        items += _mlp_body_fwd(model, sh, sh.tokens, "mlp")
        items += _leave_block("mlp.tp", sh)
    else:
        routed, per_expert = moe_tokens(model, par, sh)
        items.append(gemm("moe.router", sh.local_tokens, model.experts, sh.h, sh.dtype))
        items.append(memop("moe.permute", 2 * routed * sh.h * sh.e, sh.dtype, "aten::index_select"))
        if par.ep > 1:
            items.append(Coll("moe.dispatch", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        if sh.t > 1:
            items.append(Coll("moe.tp_ag", CommType.ALL_GATHER, routed * sh.h * sh.e, "tp"))
        for x in range(model.experts // par.ep):
            items += _mlp_body_fwd(model, sh, per_expert, f"moe.expert{x}")
        if sh.t > 1:
            items.append(Coll("moe.tp_rs", CommType.REDUCE_SCATTER, routed * sh.t * sh.h * sh.e, "tp"))
        if par.ep > 1:
            items.append(Coll("moe.combine", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        items.append(memop("moe.unpermute", 3 * routed * sh.h * sh.e, sh.dtype, "aten::index_add"))
    n = sh.local_tokens * sh.h
    items.append(memop("mlp.residual", 3 * n * sh.e + n, sh.dtype, "aten::add", 2.0 * n))
    return items


def layer_fwd(model: ModelSpec, par: ParallelConfig) -> list[Item]:
    sh = shapes(model, par)
    return attention_fwd(model, sh) + mlp_fwd(model, par, sh)


# --- backward ---------------------------------------------------------------------------------


def _linear_bwd(tag: str, m: int, n: int, k: int, sh: Shapes, grad_comm: Coll | None,
                regather: Coll | None = None) -> list[Item]:
    """Backward of y[m,n] = x[m,k] W[k,n]: input gradient (dgrad) then weight gradient (wgrad).

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
    items.append(gemm(f"{tag}.wgrad", k, n, m, sh.dtype))
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
    bh = sh.b * sh.heads
    scores = bh * sh.s * sh.s
    return [
        gemm(f"{tag}.av.dgrad_a", sh.s, sh.s, sh.d, sh.dtype, bh, "aten::bmm"),
        gemm(f"{tag}.av.dgrad_v", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
        memop(f"{tag}.softmax_dropout.bwd", 4 * scores * sh.e + scores, sh.dtype, "aten::_softmax_backward_data",
              4.0 * scores),
        gemm(f"{tag}.qk.dgrad_q", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
        gemm(f"{tag}.qk.dgrad_k", sh.s, sh.d, sh.s, sh.dtype, bh, "aten::bmm"),
    ]


def attention_bwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    T = sh.tokens
    n = sh.local_tokens * sh.h
    items: list[Item] = [memop("attn.residual.bwd", 2 * n * sh.e + n, sh.dtype, "aten::mul", n)]
    items += _grad_in_block("attn.tp.bwd", sh)
    items += _linear_bwd("attn.proj", T, sh.h, sh.heads * sh.d, sh, None)
    if par.recompute == "selective":
        items += [op for op in attention_core_fwd(sh, "attn.recompute")]
    items += attention_core_bwd(sh, "attn")
    if model.position == "rope":
        r = T * (sh.heads * sh.d + sh.kv)
        items.append(memop("attn.rope.bwd", 2 * r * sh.e, sh.dtype, "aten::mul", 3.0 * r))
    items += _linear_bwd("attn.qkv", T, sh.heads * sh.d + 2 * sh.kv, sh.h, sh,
                         _grad_out_block("attn.ag.bwd", sh), _regather("attn.ag.again", sh))
    items.append(_norm("attn.norm.bwd", model, sh, backward=True))
    return items


def _mlp_body_bwd(model: ModelSpec, sh: Shapes, tokens: int, tag: str, grad_comm: Coll | None,
                  regather: Coll | None) -> list[Item]:
    items = _linear_bwd(f"{tag}.fc2", tokens, sh.h, sh.f, sh, None)
    n = tokens * sh.f
    act_bytes = (5 if model.activation == "swiglu" else 3) * n * sh.e
    aten = "aten::silu_backward" if model.activation == "swiglu" else "aten::gelu_backward"
    items.append(memop(f"{tag}.act.bwd", act_bytes, sh.dtype, aten, 10.0 * n))
    items += _linear_bwd(f"{tag}.fc1", tokens, sh.f1, sh.h, sh, grad_comm, regather)
    return items


def mlp_bwd(model: ModelSpec, par: ParallelConfig, sh: Shapes) -> list[Item]:
    n = sh.local_tokens * sh.h
    items: list[Item] = [memop("mlp.residual.bwd", 2 * n * sh.e + n, sh.dtype, "aten::mul", n)]
    if not model.is_moe:
        items += _grad_in_block("mlp.tp.bwd", sh)
        items += _mlp_body_bwd(model, sh, sh.tokens, "mlp", _grad_out_block("mlp.ag.bwd", sh),
                               _regather("mlp.ag.again", sh))
    else:
        routed, per_expert = moe_tokens(model, par, sh)
        items.append(memop("moe.unpermute.bwd", 3 * routed * sh.h * sh.e, sh.dtype, "aten::index_select"))
        if par.ep > 1:
            items.append(Coll("moe.combine.bwd", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        if sh.t > 1:
            items.append(Coll("moe.tp_rs.bwd", CommType.ALL_GATHER, routed * sh.h * sh.e, "tp"))
        for x in range(model.experts // par.ep):
            items += _mlp_body_bwd(model, sh, per_expert, f"moe.expert{x}", None, None)
        if sh.t > 1:
            items.append(Coll("moe.tp_ag.bwd", CommType.REDUCE_SCATTER, routed * sh.t * sh.h * sh.e, "tp"))
        if par.ep > 1:
            items.append(Coll("moe.dispatch.bwd", CommType.ALL_TO_ALL, routed * sh.h * sh.e, "ep"))
        items.append(memop("moe.permute.bwd", 3 * routed * sh.h * sh.e, sh.dtype, "aten::index_add"))
        items += _linear_bwd("moe.router", sh.local_tokens, model.experts, sh.h, sh, None)
    items.append(_norm("mlp.norm.bwd", model, sh, backward=True))
    return items


def layer_bwd(model: ModelSpec, par: ParallelConfig) -> list[Item]:
    """Backward of one layer; with full recomputation its forward (collectives included) runs first."""
    sh = shapes(model, par)
    pre: list[Item] = []
    if par.recompute == "full":
        pre = [_renamed(i, "recompute.") for i in layer_fwd(model, par)]
    return pre + mlp_bwd(model, par, sh) + attention_bwd(model, par, sh)


def _renamed(item: Item, prefix: str) -> Item:
    if isinstance(item, Op):
        return Op(prefix + item.name, item.op_class, item.flops, item.bytes, item.dtype, item.aten_op,
                  item.m, item.n, item.k, item.batch)
    if isinstance(item, Coll):
        return Coll(prefix + item.name, item.comm_type, item.size_bytes, item.group, item.asynchronous)
    return Wait(prefix + item.name)


# --- embedding, output layer and loss, optimizer ------------------------------------------------


def embedding_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    """Vocab-parallel embedding: each TP rank looks up its vocabulary slice, then the partial
    embeddings are summed (all-reduce, or reduce-scatter into sequence shards with SP)."""
    items: list[Item] = [memop("embedding.lookup", 2 * sh.act_bytes, sh.dtype, "aten::embedding")]
    items += _leave_block("embedding.tp", sh)
    return items


def embedding_bwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    items: list[Item] = list(_grad_in_block("embedding.tp.bwd", sh))
    items.append(memop("embedding.grad", 3 * sh.act_bytes, sh.dtype, "aten::embedding_dense_backward"))
    return items


def output_fwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    """Final norm, vocab-parallel output GEMM and vocab-parallel cross entropy (3 all-reduces of
    one fp32 value per token: max logit, sum of exponentials, target logit)."""
    T = sh.tokens
    v = model.vocab // sh.t
    items: list[Item] = [_norm("final.norm", model, sh)]
    items += _enter_block("output.ag", sh)
    items.append(gemm("output.logits", T, v, sh.h, sh.dtype))
    items.append(memop("loss.cross_entropy", 3 * T * v * 4, "fp32", "aten::_log_softmax", 5.0 * T * v))
    if sh.t > 1:
        items += [Coll(f"loss.tp{i}", CommType.ALL_REDUCE, T * 4, "tp") for i in range(3)]
    return items


def output_bwd(model: ModelSpec, sh: Shapes) -> list[Item]:
    T = sh.tokens
    v = model.vocab // sh.t
    items: list[Item] = [memop("loss.cross_entropy.bwd", 2 * T * v * 4 + T * v * sh.e, "fp32",
                               "aten::_log_softmax_backward_data", 3.0 * T * v)]
    items += _linear_bwd("output.logits", T, v, sh.h, sh, _grad_out_block("output.ag.bwd", sh),
                         _regather("output.ag.again", sh))
    items.append(_norm("final.norm.bwd", model, sh, backward=True))
    return items


def optimizer_op(params: float, dtype: str) -> Op:
    """Adam with fp32 master weights: reads grad, master, exp_avg, exp_avg_sq (4 x 4 B), writes the
    three fp32 states and the low-precision weight copy."""
    write_low = DTYPE_BYTES[dtype] if dtype != "fp32" else 0
    return memop("optimizer.adam", params * (16 + 12 + write_low), "fp32", "aten::_fused_adam_", 10.0 * params)
