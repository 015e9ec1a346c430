"""The software stack a calibration's measurements ran on.

Kernel times, host costs and so MFU belong to the stack that produced them: the same GPU under
Transformer Engine's fused layers or flash attention runs other kernels. `calib fit` records the
stack of its bundles in the calibration's `software` section, and `calib project` and `calib
validate` print it beside their numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

# What `calib measure` builds (measure/mcore.py): not recorded per bundle because it has no option.
LAYERS = ("megatron-core's local (torch) layers as `calib measure` builds them: no Transformer Engine, "
          "unfused attention (scores materialised, softmax in fp32), no Apex")
VERSION_KEYS = ("torch", "cuda", "nccl", "megatron_core", "python")
LABELS = {"torch": "torch", "cuda": "CUDA", "nccl": "NCCL", "megatron_core": "megatron-core", "python": "Python",
          "driver": "driver"}


def measured_stack(bundles: Sequence[Any]) -> dict:
    """The `software` section: per component the versions seen and how many bundles ran each."""
    versions: dict[str, Counter] = {k: Counter() for k in (*VERSION_KEYS, "driver")}
    compile_: Counter = Counter()
    trained = False
    for b in bundles:
        m = b.manifest
        for key in VERSION_KEYS:
            value = str(getattr(m.software, key, "") or "")
            if value:
                versions[key][value] += 1
        if m.gpu.driver:
            versions["driver"][str(m.gpu.driver)] += 1
        if m.kind == "training":
            trained = True
            compile_[str((m.notes or {}).get("torch_compile", "not recorded"))] += 1
    out: dict = {"bundles": len(bundles),
                 "versions": {k: dict(sorted(c.items())) for k, c in versions.items() if c}}
    if trained:
        out["torch_compile"] = dict(sorted(compile_.items()))
        out["layers"] = LAYERS
    return out


def stack_summary(software: dict | None) -> str:
    """One line: the versions (the most used first, with counts where bundles differ), the layers
    and torch.compile; what a calibration without the section says instead."""
    if not software:
        return "not recorded (a calibration fitted before calib recorded its bundles' software: refit with `calib fit`)"
    parts = []
    for key, seen in (software.get("versions") or {}).items():
        ranked = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ranked[0][0] if len(ranked) == 1 else " / ".join(f"{v} ({n})" for v, n in ranked)
        parts.append(f"{LABELS.get(key, key)} {text}")
    line = ", ".join(parts) or "no versions recorded"
    if software.get("layers"):
        line += "; megatron-core local layers (no Transformer Engine, unfused attention)"
    compiled = software.get("torch_compile") or {}
    if compiled:
        line += "; torch.compile " + " / ".join(f"{v}" if len(compiled) == 1 else f"{v} ({n})"
                                                for v, n in sorted(compiled.items(), key=lambda kv: -kv[1]))
    return line
