"""Peak memory per GPU of a Megatron training step: model state plus stored activations.

Model state (Megatron-LM docs/source/api-guide/dist_optimizer.md, bytes per parameter with bf16/fp16
parameters and fp32 main gradients and Adam): 2 (weights) + 4 (grads) + 12 (fp32 master weights,
exp_avg, exp_avg_sq) = 18 without the distributed optimizer; 6 + 12/DP with it. With fp32
parameters: 4 + 4 + 8, or 8 + 8/DP.

Activations per transformer layer and micro-batch follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4): s b h (34 + 5 a s / h) bytes
without parallelism, with the tensor-parallel and sequence-parallel divisions of its eqs. 2-5; the
term counts are written out per tensor so that grouped-query attention (smaller K/V), SwiGLU (two
fc1 outputs) and a non-4h MLP change them as they should, and so that the measured runs' setting
(no dropout, softmax in fp32: 6 a s^2 b instead of 5) is what is counted by default; selective
recomputation drops the a s^2 b term, full recomputation keeps only the layer input (2 s b h / t
with SP). Check against a measurement (reference/gpu-machines.md): 8 pipeline stages of one
Llama-3-8B layer at sequence 4096 peaked at 42 GiB on the first stage. The stage that
holds the most micro-batches in flight (stage 0 under 1F1B: PP of them) is the peak.

On top of these: the transient of the last layer's attention backward (`layer_working_bytes`) or of
the loss, whichever is larger, and the attention scores' buffer that megatron-core's local attention
(the measured stack: no Transformer Engine, no flash attention) keeps from the first step on
(`attention_buffer_bytes`). Both were read off the allocator's history at the peak
(measure.probes.memory_peak, traces/h200/_probes/memory-peak).
"""

from __future__ import annotations

from dataclasses import dataclass

from calib.units import GIB
from calib.workload.models import ModelSpec
from calib.workload.ops import padded_vocab
from calib.workload.parallel import ParallelConfig
from calib.workload.schedule import max_in_flight, stage_schedule


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes on the most loaded GPU, by part."""

    stage: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float  # kept for backward by the micro-batches in flight
    capacity_bytes: float
    working_bytes: float = 0.0  # transient peak on top of them (loss, or one layer's backward)
    optimizer_step_bytes: float = 0.0  # transient peak of the optimizer step (activations freed by then)
    buffers_bytes: float = 0.0  # held from the first step on besides model state (attention_buffer_bytes)

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return (self.state_bytes + self.buffers_bytes
                + max(self.activations_bytes + self.working_bytes, self.optimizer_step_bytes))

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


def _param_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def stage_params(model: ModelSpec, par: ParallelConfig, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one GPU of pipeline rank `stage` (TP and EP shards; the
    vocabulary padded as Megatron pads it)."""
    model = padded_vocab(model, par.tp)
    layers = model.layers // par.pp
    h, f = model.hidden, model.ffn_hidden
    mats = 3 if model.activation == "swiglu" else 2
    expert_layer = mats * h * f * model.experts if model.is_moe else 0
    dense_layer = model.layer_params() - expert_layer
    dense = layers * dense_layer / par.tp
    expert = layers * expert_layer / (par.tp * par.ep)
    if stage == 0:
        dense += model.vocab * h / par.tp + (model.embedding_params() - model.vocab * h)  # positions replicated
    if stage == par.pp - 1:
        if not model.tied_embeddings or par.pp > 1:
            dense += model.vocab * h / par.tp
        dense += h * (1 if model.norm == "rmsnorm" else 2)
    return dense, expert


def _mlp_split_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """What one layer's MLP keeps for its backward besides its inputs, per micro-batch and before the
    TP division: fc1's output and fc2's input, per routed token for MoE. A gated MLP (SwiGLU) keeps
    two more: megatron-core's glu computes act(x_glu) * (x_linear + glu_linear_offset), and the sum
    is a new tensor the product saves beside the activation's output (measure.probes.memory_peak:
    three fc2-input-sized blocks per Llama-3 layer)."""
    s, b, f = model.seq_length, par.micro_batch, model.ffn_hidden
    gated = model.activation == "swiglu"
    f1 = 2 * f if gated else f
    return (2 * s * b * f1 + 2 * s * b * f + (4 * s * b * f if gated else 0)) * max(model.top_k, 1)


def layer_activation_bytes(model: ModelSpec, par: ParallelConfig, dropout: bool = False,
                           softmax_fp32: bool = True) -> float:
    """Bytes one transformer layer keeps for its backward, per micro-batch (Korthikanti et al. 2022).

    `dropout=True, softmax_fp32=False` is the paper's setting (its 34 s b h + 5 a s^2 b). The
    defaults are megatron-core's local layer as the measured runs were configured (measure/mcore.py):
    no dropout, so no dropout masks; the softmax computed in fp32 keeps its fp32 output (4 bytes per
    score) besides the bf16 probabilities that the attention x V product saves (2 bytes).
    """
    s, b, h, a = model.seq_length, par.micro_batch, model.hidden, model.heads
    t = par.tp
    sp = par.sequence_parallel
    kv = model.kv_groups * model.head_dim
    sbh = s * b * h
    if par.recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    # Tensors replicated across TP ranks unless sequence parallel: the two norm inputs (2 x 2sbh),
    # QKV input 2sbh, fc1 input 2sbh, and with dropout its two masks (sbh each).
    replicated = (4 + 2 + 2 + (2 if dropout else 0)) * sbh
    # Tensors split by TP: Q (2sbh), K and V (2 s b kv each), attention-output projection input (2sbh),
    # the MLP's tensors (_mlp_split_bytes).
    split = 2 * sbh + 4 * s * b * kv + 2 * sbh + _mlp_split_bytes(model, par)
    # Per score: softmax output (2, or 4 in fp32), with dropout its mask (1) and output (2), else the
    # bf16 copy the attention x V product saves (2, only when the softmax ran in fp32).
    per_score = (4 if softmax_fp32 else 2) + (3 if dropout else (2 if softmax_fp32 else 0))
    scores = per_score * a * s * s * b
    if par.attention == "flash":  # no scores kept: the fp32 log-sum-exp of each query row instead
        scores = 4.0 * a * s * b
    if par.recompute == "selective":
        scores = 0.0
    return replicated / (t if sp else 1) + (split + scores) / t


def _layer_parts(model: ModelSpec, par: ParallelConfig) -> tuple[float, float, float]:
    """(attention tensors other than the scores, MLP tensors, attention scores) of one layer and
    micro-batch on one GPU, as `layer_activation_bytes` counts them without recomputation (the
    scores as a count, not bytes)."""
    s, b, h = model.seq_length, par.micro_batch, model.hidden
    t = par.tp
    rep = t if par.sequence_parallel else 1
    kv = model.kv_groups * model.head_dim
    sbh = s * b * h
    # Norm input and QKV input (replicated unless SP); Q, K, V and the output projection's input (split).
    attention = 4.0 * sbh / rep + (4 * sbh + 4 * s * b * kv) / t
    # Norm input and fc1 input (replicated unless SP); the MLP's own tensors (split).
    mlp = 4.0 * sbh / rep + _mlp_split_bytes(model, par) / t
    return attention, mlp, float(model.heads * s * s * b / t)


def attention_buffer_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """The attention scores' buffer megatron-core's local attention keeps for the whole run: one
    layer's pre-softmax scores in the parameters' dtype, taken from its global memory buffer on the
    first forward and never freed (measure.probes.memory_peak found it among the blocks held between
    steps: 1.0 GiB for GPT-3 6.7B at micro-batch 4). Flash attention takes no such buffer."""
    if par.attention == "flash":
        return 0.0
    return _param_bytes(par.dtype) * _layer_parts(model, par)[2]


def layer_working_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """Transient bytes on top of the stored activations while the last layer runs its attention's
    backward, where the step peaks (measure.probes.memory_peak on GPT-3 6.7B, micro-batch 4, no /
    selective / full recomputation: within 0.2 GiB of the allocated peak each).

    The softmax's backward holds 12 bytes per score: the probabilities' gradient in bf16 and fp32,
    the scores' gradient in fp32 and bf16. By then the layer's MLP has run its backward and freed
    its activations, and the bf16 probabilities are spent. Selective recomputation has brought back
    the fp32 softmax output (4 bytes per score); full recomputation that and the attention's other
    tensors (its MLP was recomputed too, and freed by its own backward)."""
    attention, mlp, scores = _layer_parts(model, par)
    if par.attention == "flash":
        return _flash_working_bytes(model, par, attention, mlp)
    grads = 12.0 * scores
    if par.recompute == "full":
        return grads + 4.0 * scores + attention
    if par.recompute == "selective":
        return grads + 4.0 * scores - mlp
    return grads - 2.0 * scores - mlp


def _flash_working_bytes(model: ModelSpec, par: ParallelConfig, attention: float, mlp: float) -> float:
    """The last layer's attention backward under flash attention: the output and its gradient made
    contiguous (2 bytes per query element each, only for micro-batches above 1: see
    calib.workload.ops.flash_core_bwd), the Q, K and V gradients at the query heads (2 bytes each: the
    K and V ones are summed into the K/V heads afterwards) and the fp32 accumulator of the Q gradient
    (4 bytes). Recomputation brings back what the local attention's does, less the scores: the
    flash output (selective), the attention's tensors (full)."""
    q = par.micro_batch * model.seq_length * model.heads * model.head_dim / par.tp
    held = (4.0 * q if par.micro_batch > 1 else 0.0) + 10.0 * q
    if par.recompute == "full":
        return held + attention
    if par.recompute == "selective":
        return held + 2.0 * q - mlp
    return held - mlp


def estimate(model: ModelSpec, par: ParallelConfig, capacity_bytes: float) -> MemoryEstimate:
    """The peak over pipeline stages of model state plus in-flight activations."""
    pbytes = _param_bytes(par.dtype)
    best: MemoryEstimate | None = None
    m = par.num_microbatches
    layer_act = layer_activation_bytes(model, par)
    working_layer = layer_working_bytes(model, par)
    buffer = attention_buffer_bytes(model, par)
    layers_per_chunk = model.layers // (par.pp * par.vpp)
    s, b, h = model.seq_length, par.micro_batch, model.hidden
    for stage in range(par.pp):
        dense, expert = stage_params(model, par, stage)
        params = dense + expert
        weights = pbytes * params
        grads = 4.0 * params  # fp32 main gradients
        opt_per_param = 12.0 if pbytes == 2 else 8.0
        dense_shard = dense / par.dp if par.distributed_optimizer else dense
        expert_shard = expert / max(par.dp // par.ep, 1) if par.distributed_optimizer else expert
        optimizer = opt_per_param * (dense_shard + expert_shard)
        in_flight = max_in_flight(stage_schedule(stage, par.pp, m, par.vpp))
        acts = in_flight * layers_per_chunk * layer_act
        if stage == 0:
            acts += in_flight * 2.0 * s * b * h / (par.tp if par.sequence_parallel else 1)  # embedding output
        loss = 0.0
        if stage == par.pp - 1:
            # Vocab-parallel cross entropy at its peak: the bf16 logits and their fp32 copy (6 B each;
            # measure.probes.memory_peak: the exponentials are taken in place, not beside them).
            loss = 6.0 * s * b * padded_vocab(model, par.tp).vocab / par.tp
        working = max(loss, working_layer)
        # torch's foreach Adam allocates the fp32 denominators (sqrt of exp_avg_sq) of all its parameters. With EP > 1
        # megatron-core marks the experts' parameters as reduced over the expert data-parallel group (`allreduce`
        # False) and gives them an optimizer of their own, which its ChainedOptimizer steps after the dense one: each
        # frees its denominators before the next allocates its own (the EP runs' peaks: the sum over-counted them by
        # 3.3-3.5 %, 1.2 GiB at EP 2; docs/project.md, "Memory verdict").
        step_peak = 4.0 * (max(dense_shard, expert_shard) if par.ep > 1 else dense_shard + expert_shard)
        est = MemoryEstimate(stage, weights, grads, optimizer, acts, capacity_bytes, working, step_peak, buffer)
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None
    return best
