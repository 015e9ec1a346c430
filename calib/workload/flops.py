"""Model FLOPs of one training step, for TFLOP/s per GPU and MFU.

The dense-GPT count is Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", eq. 3): F = 72 B s L h^2 (1 + s/(6h) + V/(12hL)), i.e. three
passes (forward, and a backward of twice the forward) of 2 FLOPs per multiply-add. Here it is
written per GEMM so that grouped-query attention (narrower K/V projections), SwiGLU (three MLP
matrices), a non-4h MLP and mixture-of-experts (top_k experts per token plus the router) are
counted as they run. Model FLOPs exclude recomputation (MFU's convention); hardware FLOPs include it.
"""

from __future__ import annotations

from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig


def forward_flops_per_token_layer(model: ModelSpec) -> float:
    """Forward FLOPs of one transformer layer for one token (full-sequence attention, as the paper)."""
    h, s = model.hidden, model.seq_length
    kv = model.kv_groups * model.head_dim
    qkv_proj = 2 * h * (h + 2 * kv) + 2 * h * h
    attention = 2 * 2 * s * h  # QK^T and attention x V, each s x h multiply-adds per token
    mats = 3 if model.activation == "swiglu" else 2
    mlp = 2 * mats * h * model.ffn_hidden * max(model.top_k, 1)
    router = 2 * h * model.experts
    return float(qkv_proj + attention + mlp + router)


def forward_flops_per_token_logits(model: ModelSpec) -> float:
    return float(2 * model.hidden * model.vocab)


def model_flops_per_step(model: ModelSpec, par: ParallelConfig) -> float:
    """FLOPs of one optimizer step for the whole model and global batch, without recomputation."""
    tokens = par.global_batch * model.seq_length
    fwd = model.layers * forward_flops_per_token_layer(model) + forward_flops_per_token_logits(model)
    return 3.0 * fwd * tokens


def hardware_flops_per_step(model: ModelSpec, par: ParallelConfig) -> float:
    """Model FLOPs plus what recomputation adds (full: one more layer forward; selective: attention core)."""
    tokens = par.global_batch * model.seq_length
    extra = 0.0
    if par.recompute == "full":
        extra = model.layers * forward_flops_per_token_layer(model)
    elif par.recompute == "selective":
        extra = model.layers * 4.0 * model.seq_length * model.hidden
    return model_flops_per_step(model, par) + extra * tokens


def narayanan_flops_per_step(model: ModelSpec, par: ParallelConfig) -> float:
    """The paper's closed form (dense GPT with MHA and a 4h GELU MLP), kept to check the general count."""
    b, s, layers, h, v = par.global_batch, model.seq_length, model.layers, model.hidden, model.vocab
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers))
