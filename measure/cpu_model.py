"""The CPU (gloo) training path: a small torch transformer-shaped model under DDP, no megatron.

It exists so that the measure -> bundle -> ET chain runs in CI without a GPU; its step times are
never calibration data (bundles it makes live under tests/, not traces/).
"""

from __future__ import annotations

from collections.abc import Callable

from calib.workload.models import ModelSpec
from measure.request import TrainRequest

# CPU cap on the width so a test step takes milliseconds whatever preset is named.
MAX_HIDDEN = 64
MAX_SEQ = 32
MAX_VOCAB = 256


def build_training(req: TrainRequest, model: ModelSpec) -> tuple[Callable[[], None], dict]:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.manual_seed(req.seed)
    h = min(model.hidden, MAX_HIDDEN)
    seq = min(model.seq_length, MAX_SEQ)
    vocab = min(model.vocab, MAX_VOCAB)
    heads = 4
    flash = req.par.attention == "flash"

    class FusedAttention(nn.Module):
        """Causal attention through torch's fused SDPA, as `--attention flash` runs it on GPUs."""

        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(out.transpose(1, 2).reshape(b, s, h))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(h)
            self.attn = FusedAttention() if flash else nn.MultiheadAttention(h, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(h)
            self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.norm1(x)
            x = x + (self.attn(y) if flash else self.attn(y, y, y, need_weights=False)[0])
            return x + self.mlp(self.norm2(x))

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, h)
            self.blocks = nn.Sequential(*[Block() for _ in range(model.layers)])
            self.head = nn.Linear(h, vocab)

        def forward(self, tok: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(self.emb(tok)))

    net = nn.parallel.DistributedDataParallel(Tiny()) if dist.get_world_size() > 1 else Tiny()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    mbs = req.par.micro_batch
    nmb = req.par.num_microbatches

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for i in range(nmb):
            tok = torch.randint(0, vocab, (mbs, seq))
            ctx = net.no_sync() if (i < nmb - 1 and hasattr(net, "no_sync")) else _null()
            with ctx:
                loss = loss_fn(net(tok).reshape(-1, vocab), tok.reshape(-1)) / nmb
                loss.backward()
        opt.step()

    info = {"backend": "cpu-gloo", "hidden": h, "seq_length": seq, "vocab": vocab, "microbatches": nmb}
    return step, info


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None
