"""Parallel configuration, its validity rules, and Megatron's rank layout (one place for both).

Rank layout follows megatron-core's default order "tp-cp-ep-dp-pp" (without context parallel):
tensor-parallel ranks vary fastest, then data-parallel, then pipeline stage:
    rank = tp_rank + tp * (dp_rank + dp * pp_rank)
Expert-parallel groups are carved out of the data-parallel dimension (EP divides DP): the ep
ranks of one EP group are consecutive dp ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from calib.errors import CalibError
from calib.workload.models import ModelSpec

RECOMPUTE = ("none", "selective", "full")
# Core attention as megatron-core runs it: "local" is its own unfused attention (scores materialised,
# softmax in fp32), "flash" torch's fused SDPA flash kernels (measure/mcore.py: FlashCoreAttention).
ATTENTION = ("local", "flash")


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B when > 1)
    sequence_parallel: bool = False
    micro_batch: int = 1
    global_batch: int = 1
    recompute: str = "none"
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    distributed_optimizer: bool = False
    dtype: str = "bf16"
    attention: str = "local"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check(self, model: ModelSpec, gpus: int | None = None) -> None:
        """Raise CalibError (one line, naming the rule) if this config cannot run `model`."""
        for key in ("tp", "pp", "dp", "ep", "vpp", "micro_batch", "global_batch"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise CalibError(f"{key} must be a positive integer, got {value!r}")
        if gpus is not None and gpus != self.gpus:
            raise CalibError(f"GPUs ({gpus}) must equal TP x PP x DP = {self.tp} x {self.pp} x {self.dp} = {self.gpus}")
        if model.heads % self.tp:
            raise CalibError(f"TP {self.tp} does not divide the {model.heads} attention heads of {model.name}")
        if model.kv_groups % self.tp:
            raise CalibError(f"TP {self.tp} does not divide the {model.kv_groups} KV groups of {model.name}")
        if model.ffn_hidden % self.tp:
            raise CalibError(f"TP {self.tp} does not divide ffn_hidden {model.ffn_hidden} of {model.name}")
        if model.layers % (self.pp * self.vpp):
            stages = f"PP {self.pp}" + (f" x VPP {self.vpp}" if self.vpp > 1 else "")
            raise CalibError(f"{stages} does not divide the {model.layers} layers of {model.name}")
        if self.ep > 1 and not model.is_moe:
            raise CalibError(f"EP {self.ep} needs a mixture-of-experts model; {model.name} is dense")
        if self.dp % self.ep:
            raise CalibError(f"EP {self.ep} must divide DP {self.dp} (Megatron's convention)")
        if model.is_moe and model.experts % self.ep:
            raise CalibError(f"EP {self.ep} does not divide the {model.experts} experts of {model.name}")
        if self.sequence_parallel and self.tp == 1:
            raise CalibError("sequence parallel needs TP > 1")
        if self.global_batch % (self.micro_batch * self.dp):
            raise CalibError(
                f"global batch {self.global_batch} is not a multiple of micro-batch x DP = {self.micro_batch * self.dp}"
            )
        if self.vpp > 1 and (self.pp == 1 or self.num_microbatches % self.pp):
            raise CalibError(
                f"interleaved pipeline (VPP {self.vpp}) needs PP > 1 and micro-batches ({self.num_microbatches}) divisible by PP {self.pp}"
            )
        if self.recompute not in RECOMPUTE:
            raise CalibError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise CalibError("overlap_param_gather needs the distributed optimizer")
        if self.attention not in ATTENTION:
            raise CalibError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise CalibError(f"dtype must be bf16, fp16 or fp32, got {self.dtype!r}")


# --- rank layout -------------------------------------------------------------------------------


def coords(rank: int, cfg: ParallelConfig) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank."""
    return rank % cfg.tp, (rank // cfg.tp) % cfg.dp, rank // (cfg.tp * cfg.dp)


def rank_of(tp_rank: int, dp_rank: int, pp_rank: int, cfg: ParallelConfig) -> int:
    return tp_rank + cfg.tp * (dp_rank + cfg.dp * pp_rank)


def tp_group(rank: int, cfg: ParallelConfig) -> list[int]:
    _, d, p = coords(rank, cfg)
    return [rank_of(t, d, p, cfg) for t in range(cfg.tp)]


def dp_group(rank: int, cfg: ParallelConfig) -> list[int]:
    t, _, p = coords(rank, cfg)
    return [rank_of(t, d, p, cfg) for d in range(cfg.dp)]


def ep_group(rank: int, cfg: ParallelConfig) -> list[int]:
    t, d, p = coords(rank, cfg)
    first = d - d % cfg.ep
    return [rank_of(t, first + i, p, cfg) for i in range(cfg.ep)]


def expert_dp_group(rank: int, cfg: ParallelConfig) -> list[int]:
    """Ranks holding the same experts: the data-parallel group of expert weights (DP / EP ranks)."""
    t, d, p = coords(rank, cfg)
    return [rank_of(t, e, p, cfg) for e in range(d % cfg.ep, cfg.dp, cfg.ep)]


def pp_group(rank: int, cfg: ParallelConfig) -> list[int]:
    t, d, _ = coords(rank, cfg)
    return [rank_of(t, d, p, cfg) for p in range(cfg.pp)]
