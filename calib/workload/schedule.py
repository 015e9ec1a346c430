"""Pipeline schedules: the order in which one pipeline rank runs its forward and backward passes.

Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py, described in Narayanan et
al. 2021, section 2.2):
- no pipelining (PP 1): forward then backward of each micro-batch in turn;
- 1F1B: stage p runs min(PP - p - 1, m) warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards;
- interleaved 1F1B (VPP chunks per rank): micro-batches go through the chunks in groups of PP;
  warm-up is (PP - p - 1) * 2 + (VPP - 1) * PP virtual forwards.
A pass is (kind, micro-batch, chunk). Virtual stage v = chunk * PP + p holds layers
[v * L/(PP*VPP), (v + 1) * L/(PP*VPP)).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pass:
    kind: str  # "F" | "B"
    micro_batch: int
    chunk: int


def _interleaved_index(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Virtual micro-batch k -> (micro_batch, chunk), Megatron's grouping of PP micro-batches per chunk."""
    group = k // (pp * vpp)
    in_group = k % (pp * vpp)
    chunk = in_group // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return group * pp + in_group % pp, chunk


def stage_schedule(stage: int, pp: int, micro_batches: int, vpp: int = 1) -> list[Pass]:
    """The passes pipeline rank `stage` runs in one step, in order."""
    m = micro_batches
    if vpp == 1:
        warmup = min(pp - stage - 1, m)
        out = [Pass("F", i, 0) for i in range(warmup)]
        for i in range(m - warmup):
            out.append(Pass("F", warmup + i, 0))
            out.append(Pass("B", i, 0))
        out.extend(Pass("B", i, 0) for i in range(m - warmup, m))
        return out
    total = m * vpp
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)

    def fwd(k: int) -> Pass:
        mb, c = _interleaved_index(k, pp, vpp, True)
        return Pass("F", mb, c)

    def bwd(k: int) -> Pass:
        mb, c = _interleaved_index(k, pp, vpp, False)
        return Pass("B", mb, c)

    out = [fwd(k) for k in range(warmup)]
    for j in range(total - warmup):
        out.append(fwd(warmup + j))
        out.append(bwd(j))
    out.extend(bwd(k) for k in range(total - warmup, total))
    return out


def max_in_flight(schedule: list[Pass]) -> int:
    """Most forward passes whose backward has not run yet (activations held at once)."""
    held = peak = 0
    for p in schedule:
        held += 1 if p.kind == "F" else -1
        peak = max(peak, held)
    return peak
