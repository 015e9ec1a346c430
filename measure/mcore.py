"""The GPU training path: a megatron-core GPTModel built as the H200 hosts showed works.

Recipe (../shared/reference/gpu-machines.md): megatron-core without Transformer Engine or Apex, the
local layer spec (torch norms, megatron's own tensor-parallel linears and attention), Float16Module
for bf16, megatron's DistributedDataParallel (fp32 grad reduction), finalize_model_grads, 1F1B (or
interleaved) through get_forward_backward_func, and megatron's optimizer (torch AdamW underneath).
Tokens are random: step time does not depend on their values. With `--attention flash` the core
attention is torch's fused SDPA on its flash kernels (FlashCoreAttention) instead of megatron-core's
unfused one; everything else is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calib.workload.models import ModelSpec
from measure.request import TrainRequest

VOCAB_MULTIPLE = 128  # Megatron pads the vocabulary to a multiple of 128 x TP


def padded_vocab(vocab: int, tp: int) -> int:
    m = VOCAB_MULTIPLE * tp
    return ((vocab + m - 1) // m) * m


def sequence_parallel_norm(norm: str) -> type:
    """A torch norm whose parameters are marked sequence-parallel.

    megatron-core's torch-norm wrapper refuses sequence parallel without Transformer Engine. With
    sequence parallel each TP rank normalises its own slice of the sequence, so its norm weights see
    a partial gradient; Megatron all-reduces grads of parameters with `sequence_parallel = True`
    across the TP group (finalize_model_grads), which is all such a norm needs.
    """
    import torch

    base = torch.nn.RMSNorm if norm == "rmsnorm" else torch.nn.LayerNorm

    class SequenceParallelNorm(base):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__(hidden_size, eps=eps)
            for p in self.parameters():
                p.sequence_parallel = bool(config.sequence_parallel)

    return SequenceParallelNorm


def flash_core_attention() -> type:
    """A core attention for megatron-core's local layer spec that runs torch's fused SDPA, forced onto
    its flash kernels (an unsupported shape fails the run instead of falling back to the math path).

    megatron-core's own DotProductAttention materialises the scores (baddbmm, fp32 softmax, bmm), and
    Transformer Engine, which would give it fused attention, is not on the measured hosts. This takes
    the same inputs ([s, b, heads, d] queries, [s, b, groups, d] keys and values, causal) and returns
    the same [s, b, heads x d] context. Grouped-query attention goes in unexpanded (enable_gqa).
    """
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.module import MegatronModule
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class FlashCoreAttention(MegatronModule):
        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     softmax_scale: float | None = None, **_: Any) -> None:
            super().__init__(config=config)
            if attn_mask_type != AttnMaskType.causal:
                raise ValueError(f"FlashCoreAttention runs causal attention only, not {attn_mask_type}")
            self.softmax_scale = softmax_scale  # None: 1/sqrt(head dim), as megatron-core's default

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any = None, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None, **_: Any) -> Any:
            # [s, b, n, d] -> [b, n, s, d] as views: the flash kernel takes the strides as they are.
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                     enable_gqa=k.shape[1] != q.shape[1])
            s, b = query.shape[0], query.shape[1]
            return out.permute(2, 0, 1, 3).contiguous().view(s, b, -1)

    return FlashCoreAttention


def transformer_config(req: TrainRequest, model: ModelSpec) -> Any:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    p = req.par
    swiglu = model.activation == "swiglu"
    kw: dict[str, Any] = dict(
        num_layers=model.layers, hidden_size=model.hidden, ffn_hidden_size=model.ffn_hidden,
        num_attention_heads=model.heads, num_query_groups=model.kv_groups, kv_channels=model.head_dim,
        normalization="RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else F.gelu,
        add_bias_linear=not swiglu,  # GPT-3 has biases; Llama and Mixtral have none
        hidden_dropout=0.0, attention_dropout=0.0,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
        expert_model_parallel_size=p.ep, sequence_parallel=p.sequence_parallel,
    )
    if model.is_moe:
        kw.update(
            num_moe_experts=model.experts, moe_router_topk=model.top_k, moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=False, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
        )
    if p.recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif p.recompute == "selective":
        kw.update(recompute_granularity="selective")
    return TransformerConfig(**kw)


def layer_spec(req: TrainRequest, model: ModelSpec) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=model.experts or None, moe_grouped_gemm=False,
        normalization="RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
    )
    if req.par.sequence_parallel:
        import megatron.core.transformer.transformer_block as block

        norm = sequence_parallel_norm(model.norm)
        spec.submodules.input_layernorm = norm
        spec.submodules.pre_mlp_layernorm = norm
        block.LayerNormImpl = norm  # the final norm of the block
    if req.par.attention == "flash":
        spec.submodules.self_attention.submodules.core_attention = flash_core_attention()
    return spec


@dataclass
class StepParts:
    """One training iteration in its three host phases, in the order step() runs them."""

    zero: Callable[[], None]
    forward_backward: Callable[[], None]
    optimizer_step: Callable[[], None]

    def step(self) -> None:
        self.zero()
        self.forward_backward()
        self.optimizer_step()


@dataclass
class Training:
    """A built megatron-core training: what probes instrument (measure.probes.host_phases)."""

    parts: StepParts
    chunks: list
    optimizer: Any
    config: Any
    info: dict


def build_training(req: TrainRequest, model: ModelSpec) -> tuple[Callable[[], None], dict]:
    """Initialise megatron's parallel state, build model + optimizer, return one-iteration step()."""
    training = build_parts(req, model)
    return training.parts.step, training.info


def build_parts(req: TrainRequest, model: ModelSpec) -> Training:
    """build_training's work, with the model chunks, optimizer and config kept."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    p = req.par
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None, expert_model_parallel_size=p.ep,
    )
    model_parallel_cuda_manual_seed(req.seed)
    config = transformer_config(req, model)
    spec = layer_spec(req, model)
    vocab = padded_vocab(model.vocab, p.tp)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=p.overlap_grad_reduce,
        use_distributed_optimizer=p.distributed_optimizer, overlap_param_gather=p.overlap_param_gather,
        bucket_size=40_000_000 if p.overlap_grad_reduce else None,
    )
    chunks = []
    for v in range(p.vpp):
        vp = v if p.vpp > 1 else None
        gpt = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=model.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=model.tied_embeddings,
            position_embedding_type="rope" if model.position == "rope" else "learned_absolute",
            vp_stage=vp,
        )
        gpt.cuda(torch.cuda.current_device())
        chunk = Float16Module(config, gpt)
        chunks.append(DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=v > 0))
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-5, weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16,
            use_distributed_optimizer=p.distributed_optimizer, clip_grad=1.0,
        ),
        chunks,
    )
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = opt.scale_loss
    if p.overlap_grad_reduce:
        no_sync = [c.no_sync for c in chunks]
        grad_sync = [c.start_grad_sync for c in chunks]
        config.no_sync_func = no_sync[0] if len(chunks) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(chunks) == 1 else grad_sync
    if p.overlap_param_gather:
        param_sync = [c.start_param_sync for c in chunks]
        config.param_sync_func = param_sync[0] if len(chunks) == 1 else param_sync

    mbs, seq = p.micro_batch, model.seq_length
    nmb = p.num_microbatches
    device = torch.device("cuda", torch.cuda.current_device())
    positions = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, -1)

    def forward_step(data_iterator: Any, chunk: Any) -> tuple[Any, Callable]:
        tokens = torch.randint(0, model.vocab, (mbs, seq), device=device)
        output = chunk(tokens, positions, None, labels=tokens)

        def loss_func(out: Any) -> tuple[Any, dict]:
            loss = out.float().mean()
            return loss, {"loss": loss.detach()}

        return output, loss_func

    fb = get_forward_backward_func()

    def zero() -> None:
        for c in chunks:
            c.zero_grad_buffer()
        opt.zero_grad()

    def forward_backward() -> None:
        fb(
            forward_step_func=forward_step, data_iterator=[None] * len(chunks), model=chunks,
            num_microbatches=nmb, seq_length=seq, micro_batch_size=mbs, forward_only=False,
        )

    params = sum(x.numel() for c in chunks for x in c.parameters())
    info = {
        "backend": "megatron-core", "vocab_padded": vocab, "optimizer": type(opt).__name__,
        "microbatches": nmb, "params_on_rank": int(params),
        "sequence_parallel_norm": "calib SequenceParallelNorm (torch norm, params marked sequence_parallel)"
        if p.sequence_parallel else "",
    }
    return Training(StepParts(zero, forward_backward, opt.step), chunks, opt, config, info)
