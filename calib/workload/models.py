"""Model architectures: the presets shared by `calib measure` and `calib project`, YAML models, and
the scaling-down rule used to fit a full-size model's layers on 1-8 GPUs.

Scaling-down rule (documented in README.md, "Scaled-down models"): keep every per-layer shape
(hidden, ffn_hidden, heads, kv_groups, experts, top_k, norm, activation) and the vocabulary, and
take fewer layers; where a single GPU cannot hold the activations, the sequence length may be
shortened too, and the model's name then says so (`llama3-70b@L2,S2048`). A measured layer is
then a layer of the full model, so its kernels are the full model's kernels at that TP degree.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from calib.errors import CalibError
from calib.yamlio import load_yaml

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Sizes are element counts; `experts == 0` means a dense model."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int = 0  # 0: 4 x hidden
    kv_groups: int = 0  # 0: heads (multi-head attention)
    seq_length: int = 2048
    vocab: int = 50257
    experts: int = 0
    top_k: int = 0  # 0: 2 for MoE models
    norm: str = "layernorm"
    activation: str = "gelu"
    position: str = "learned"  # learned | rope
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_groups == 0:
            object.__setattr__(self, "kv_groups", self.heads)
        if self.experts and self.top_k == 0:
            object.__setattr__(self, "top_k", 2)
        self.check()

    def check(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn_hidden", "kv_groups", "seq_length", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise CalibError(f"model {self.name}: {key} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise CalibError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_groups:
            raise CalibError(f"model {self.name}: heads {self.heads} not divisible by kv_groups {self.kv_groups}")
        if self.norm not in NORMS:
            raise CalibError(f"model {self.name}: norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise CalibError(
                f"model {self.name}: activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.experts < 0 or (self.experts and not 0 < self.top_k <= self.experts):
            raise CalibError(f"model {self.name}: need 0 < top_k <= experts, got top_k {self.top_k}, experts {self.experts}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def layer_params(self) -> int:
        """Parameters of one transformer layer (all experts counted)."""
        h, f = self.hidden, self.ffn_hidden
        kv = self.kv_groups * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # q, k, v, output projection
        mlp_mats = 3 if self.activation == "swiglu" else 2
        mlp = mlp_mats * h * f * max(self.experts, 1)
        router = h * self.experts
        norms = 2 * h * (1 if self.norm == "rmsnorm" else 2)
        return attn + mlp + router + norms

    def embedding_params(self) -> int:
        pos = self.seq_length * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos

    def param_count(self) -> int:
        out = 0 if self.tied_embeddings else self.vocab * self.hidden
        final_norm = self.hidden * (1 if self.norm == "rmsnorm" else 2)
        return self.layers * self.layer_params() + self.embedding_params() + out + final_norm

    def scaled_down(self, layers: int, seq_length: int | None = None) -> ModelSpec:
        """Same per-layer shapes, fewer layers (and optionally a shorter sequence)."""
        if not 0 < layers <= self.layers:
            raise CalibError(f"model {self.name}: cannot scale to {layers} layers (it has {self.layers})")
        seq = seq_length or self.seq_length
        base = self.name.split("@")[0]
        suffix = f"@L{layers}" + (f",S{seq}" if seq != self.seq_length else "")
        return dataclasses.replace(self, name=base + suffix, layers=layers, seq_length=seq)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _preset(**kw: object) -> ModelSpec:
    return ModelSpec(**kw)  # type: ignore[arg-type]


# Published shapes. GPT-3: Brown et al. 2020, Table 2.1. Llama-3: Meta's model cards / params.json.
# Mixtral: Mistral AI's config.json for each release. Training sequence lengths for Mixtral are the
# 4096 commonly used in Megatron recipes; their context windows are longer.
PRESETS: dict[str, ModelSpec] = {
    p.name: p
    for p in [
        _preset(name="gpt3-175b", layers=96, hidden=12288, heads=96, seq_length=2048, vocab=50257),
        _preset(name="gpt3-13b", layers=40, hidden=5120, heads=40, seq_length=2048, vocab=50257),
        _preset(name="gpt3-6.7b", layers=32, hidden=4096, heads=32, seq_length=2048, vocab=50257),
        _preset(name="gpt3-1.3b", layers=24, hidden=2048, heads=16, seq_length=2048, vocab=50257),
        _preset(
            name="llama3-70b", layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_groups=8,
            seq_length=8192, vocab=128256, norm="rmsnorm", activation="swiglu", position="rope",
        ),
        _preset(
            name="llama3-8b", layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_groups=8,
            seq_length=8192, vocab=128256, norm="rmsnorm", activation="swiglu", position="rope",
        ),
        _preset(
            name="mixtral-8x7b", layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_groups=8,
            seq_length=4096, vocab=32000, experts=8, top_k=2, norm="rmsnorm", activation="swiglu",
            position="rope",
        ),
        _preset(
            name="mixtral-8x22b", layers=56, hidden=6144, ffn_hidden=16384, heads=48, kv_groups=8,
            seq_length=4096, vocab=32768, experts=8, top_k=2, norm="rmsnorm", activation="swiglu",
            position="rope",
        ),
    ]
}

_SCALED = re.compile(r"^(?P<base>[^@]+)@L(?P<layers>\d+)(?:,S(?P<seq>\d+))?$")
_KEYS = {f.name for f in dataclasses.fields(ModelSpec)}


def model_from_dict(data: dict, source: str = "model") -> ModelSpec:
    unknown = set(data) - _KEYS
    if unknown:
        raise CalibError(f"{source}: unknown model key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}")
    missing = {"name", "layers", "hidden", "heads"} - set(data)
    if missing:
        raise CalibError(f"{source}: missing model key(s) {', '.join(sorted(missing))}")
    try:
        return ModelSpec(**data)
    except TypeError as exc:
        raise CalibError(f"{source}: {exc}") from None


def resolve_model(name_or_path: str | dict, layers: int | None = None, seq_length: int | None = None) -> ModelSpec:
    """A preset name (`llama3-8b`, `llama3-8b@L4,S2048`), a YAML file, or an architecture dict."""
    if isinstance(name_or_path, dict):
        spec = model_from_dict(name_or_path)
    elif name_or_path in PRESETS:
        spec = PRESETS[name_or_path]
    elif m := _SCALED.match(name_or_path):
        if m["base"] not in PRESETS:
            raise CalibError(f"unknown model {m['base']!r}; presets: {', '.join(PRESETS)}")
        base = PRESETS[m["base"]]
        spec = base.scaled_down(int(m["layers"]), int(m["seq"]) if m["seq"] else None)
    elif name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CalibError(f"model file {path} does not exist")
        data = load_yaml(path, "model file")
        if not isinstance(data, dict):
            raise CalibError(f"model file {path}: expected a mapping of architecture keys")
        spec = model_from_dict(data, source=str(path))
    else:
        raise CalibError(f"unknown model {name_or_path!r}; presets: {', '.join(PRESETS)} (or a YAML file)")
    if layers is not None or seq_length is not None:
        spec = spec.scaled_down(layers or spec.layers, seq_length)
    return spec
