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

# What `calib measure` builds (measure/mcore.py): not recorded per bundle because it has no option. The
# core attention has one (`--attention`): the bundles' specs say which, counted under `attention`.
LAYERS = ("megatron-core's local (torch) layers as `calib measure` builds them: no Transformer Engine, no Apex; "
          "core attention megatron-core's unfused one (scores materialised, softmax in fp32) or, in runs whose "
          "spec says attention: flash, torch's fused flash SDPA")
VERSION_KEYS = ("torch", "cuda", "nccl", "megatron_core", "python")
LABELS = {"torch": "torch", "cuda": "CUDA", "nccl": "NCCL", "megatron_core": "megatron-core", "python": "Python",
          "driver": "driver"}


ATTENTION_LABEL = {"local": "unfused", "flash": "flash SDPA"}


def flash_runs(software: dict | None) -> int:
    """Training runs of a calibration's bundles that ran flash attention (0 when not recorded)."""
    return int(((software or {}).get("attention") or {}).get("flash", 0))


def measured_stack(bundles: Sequence[Any]) -> dict:
    """The `software` section: per component the versions seen and how many bundles ran each."""
    versions: dict[str, Counter] = {k: Counter() for k in (*VERSION_KEYS, "driver")}
    compile_: Counter = Counter()
    attention: Counter = Counter()
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
            attention[m.spec.attention if m.spec is not None else "local"] += 1
    out: dict = {"bundles": len(bundles),
                 "versions": {k: dict(sorted(c.items())) for k, c in versions.items() if c}}
    if trained:
        out["torch_compile"] = dict(sorted(compile_.items()))
        out["attention"] = dict(sorted(attention.items()))
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
        line += "; megatron-core local layers (no Transformer Engine)"
        attention = software.get("attention") or {"local": software.get("bundles", 0)}
        line += "; attention " + " / ".join(f"{ATTENTION_LABEL.get(k, k)} ({n})" for k, n in sorted(attention.items()))
    compiled = software.get("torch_compile") or {}
    if compiled:
        line += "; torch.compile " + " / ".join(f"{v}" if len(compiled) == 1 else f"{v} ({n})"
                                                for v, n in sorted(compiled.items(), key=lambda kv: -kv[1]))
    return line
