"""The H200 campaign: every run behind traces/h200/, in one command on an 8 x H200 host.

    PYTHONPATH=. python3 -m measure.campaigns.h200 --out /tmp/h200 --budget 480 [--smoke]

Runs collective microbenchmarks on all 8 GPUs, then training runs on 8, 4 and 2 GPUs (4- and 2-GPU
runs concurrently on disjoint GPUs, each with its own CUDA_VISIBLE_DEVICES and master port; the
manifest notes say so), with the kernel microbenchmark on one GPU beside them. Models are presets
scaled down by calib.workload.models' rule (all per-layer shapes, fewer layers, sequence 2048).
Telemetry on/off twins give the telemetry overhead (measure/campaigns/twins.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measure.campaigns.scheduler import Job, run_jobs, write_summary

L8B = "llama3-8b@L4,S2048"
L70B = "llama3-70b@L2,S2048"
G13B = "gpt3-13b@L4"
G67B = "gpt3-6.7b@L4"
G13 = "gpt3-1.3b@L8"
MIX = "mixtral-8x7b@L2,S2048"

# (id, model, tp, pp, dp, ep, mbs, gbs, recompute, extra flags)
TRAININGS: list[tuple] = [
    # 8 GPUs
    ("llama8b-tp2pp2dp2", L8B, 2, 2, 2, 1, 1, 8, "none", []),
    ("mixtral-ep8", MIX, 1, 1, 8, 8, 1, 8, "none", []),
    ("gpt13b-tp8-rcfull", G13B, 8, 1, 1, 1, 2, 8, "full", []),
    ("llama70b-tp4pp2-rcsel", L70B, 4, 2, 1, 1, 1, 4, "selective", []),
    ("llama8b-dp8-distopt", L8B, 1, 1, 8, 1, 2, 16, "none", ["--distributed-optimizer", "--overlap-grad-reduce"]),
    # 4 GPUs
    ("llama8b-tp4-mbs4", L8B, 4, 1, 1, 1, 4, 8, "none", []),
    ("llama8b-tp4-mbs4-notel", L8B, 4, 1, 1, 1, 4, 8, "none", ["--no-telemetry"]),
    ("llama8b-pp4-rcfull", L8B, 1, 4, 1, 1, 1, 8, "full", []),
    ("gpt6.7b-tp2dp2-rcsel", G67B, 2, 1, 2, 1, 2, 8, "selective", []),
    ("mixtral-ep4", MIX, 1, 1, 4, 4, 1, 4, "none", []),
    ("llama8b-tp2dp2-sp", L8B, 2, 1, 2, 1, 1, 8, "none", ["--sequence-parallel"]),
    ("llama8b-pp2vpp2dp2", L8B, 1, 2, 2, 1, 1, 8, "none", ["--vpp", "2"]),
    # 2 GPUs
    ("llama8b-tp2", L8B, 2, 1, 1, 1, 1, 8, "none", []),
    ("llama8b-tp2-notel", L8B, 2, 1, 1, 1, 1, 8, "none", ["--no-telemetry"]),
    ("gpt6.7b-tp2-mbs4-rcsel", G67B, 2, 1, 1, 1, 4, 8, "selective", []),
    ("gpt6.7b-tp2-mbs4-rcsel-notel", G67B, 2, 1, 1, 1, 4, 8, "selective", ["--no-telemetry"]),
    ("gpt13b-pp2-rcfull", G13B, 1, 2, 1, 1, 2, 8, "full", []),
    ("gpt1.3b-dp2-mbs4", G13, 1, 1, 2, 1, 4, 16, "none", []),
    ("mixtral-ep2-mbs2", MIX, 1, 1, 2, 2, 2, 4, "none", []),
    ("llama70b-tp2", L70B, 2, 1, 1, 1, 1, 4, "none", []),
    # 4-GPU stand-ins for the 8-GPU runs, for hosts of 4 GPUs
    ("llama8b-tp2pp2", L8B, 2, 2, 1, 1, 1, 8, "none", []),
    ("llama70b-tp4-rcsel", L70B, 4, 1, 1, 1, 1, 4, "selective", []),
    ("gpt13b-tp4-rcfull", G13B, 4, 1, 1, 1, 2, 8, "full", []),
    ("llama8b-dp4-distopt", L8B, 1, 1, 4, 1, 2, 16, "none", ["--distributed-optimizer", "--overlap-grad-reduce"]),
    # round 3: more shapes and combinations (TP x EP needs sequence parallel in megatron)
    ("llama8b-dp2-mbs2-rcsel", L8B, 1, 1, 2, 1, 2, 8, "selective", []),
    ("gpt13b-tp2", G13B, 2, 1, 1, 1, 1, 8, "none", []),
    ("mixtral-tp2-sp-rcsel", MIX, 2, 1, 1, 1, 1, 4, "selective", ["--sequence-parallel"]),
    ("gpt6.7b-pp2-mbs2", G67B, 1, 2, 1, 1, 2, 8, "none", []),
    ("mixtral-tp2ep2-sp", MIX, 2, 1, 2, 2, 1, 4, "none", ["--sequence-parallel"]),
    ("gpt175b-tp4", "gpt3-175b@L1", 4, 1, 1, 1, 1, 4, "none", []),
    ("llama70b-tp4-rcfull-mbs2", L70B, 4, 1, 1, 1, 2, 8, "full", []),
    # round 4: single-GPU runs (no communication at all: kernels and host only)
    ("llama8b-1gpu-mbs2", L8B, 1, 1, 1, 1, 2, 8, "none", []),
    ("gpt6.7b-1gpu-mbs4-rcfull", G67B, 1, 1, 1, 1, 4, 8, "full", []),
    ("mixtral-1gpu", MIX, 1, 1, 1, 1, 1, 4, "none", []),
    ("gpt13b-1gpu-mbs2", G13B, 1, 1, 1, 1, 2, 8, "none", []),
    ("gpt1.3b-1gpu-mbs4", G13, 1, 1, 1, 1, 4, 16, "none", []),
    ("llama8b-1gpu-rcsel", L8B, 1, 1, 1, 1, 1, 8, "selective", []),
]
ROUND3 = [s[0] for s in TRAININGS[-13:-6]]
ONE_GPU = [s[0] for s in TRAININGS[-6:]]
# Round 4 re-measured these with the converter that keeps pipeline send/recv (the round 1-3 ETs lack them).
PP_RERUN = ["llama8b-pp4-rcfull", "llama8b-pp2vpp2dp2", "llama8b-tp2pp2", "gpt13b-pp2-rcfull", "gpt6.7b-pp2-mbs2"]

# Round 5 (a 2 x H200 lease): the steepest MoE run again with 30 measured steps and its raw traces
# kept, to see its step-to-step spread (10 steps spanned 190-244 ms), and the 2-GPU collectives timed
# nccl-tests' way (back-to-back calls per event pair, measure/collectives.py).
ROUND5_STEPS = {"mixtral-tp2-sp-rcsel-s30": 30}
TRAININGS.append(("mixtral-tp2-sp-rcsel-s30", MIX, 2, 1, 1, 1, 1, 4, "selective", ["--sequence-parallel", "--keep-raw"]))
ROUND5 = ["collectives-2gpu-loop", *ROUND5_STEPS]

# Round 6 (a 2 x H200 lease): two host-bound configurations again with their raw traces kept (the host
# trace's CPU op times, towards a per-configuration host cost: docs/host.md), and two configurations
# no earlier round ran, which nothing in calib was fitted or labelled on (MEMOP_LAYOUT included).
ROUND6 = ["llama8b-tp2-raw", "mixtral-ep2-mbs2-raw", "llama8b-tp2-sp-mbs2", "gpt6.7b-tp2-mbs2"]
TRAININGS += [
    ("llama8b-tp2-raw", L8B, 2, 1, 1, 1, 1, 8, "none", ["--keep-raw"]),
    ("mixtral-ep2-mbs2-raw", MIX, 1, 1, 2, 2, 2, 4, "none", ["--keep-raw"]),
    ("llama8b-tp2-sp-mbs2", L8B, 2, 1, 1, 1, 2, 8, "none", ["--sequence-parallel"]),
    ("gpt6.7b-tp2-mbs2", G67B, 2, 1, 1, 1, 2, 8, "none", []),
]

# Round 7 (a 2 x H200 lease, sixth session): configurations no earlier round ran, predicted with the
# sixth session's calibration before they were measured (traces/README.md, round 7).
ROUND7 = ["gpt13b-tp2-mbs2-rcsel", "llama70b-tp2-mbs2-rcsel", "gpt6.7b-dp2-mbs4", "llama8b-pp2-mbs2", "mixtral-tp2-sp"]
TRAININGS += [
    ("gpt13b-tp2-mbs2-rcsel", G13B, 2, 1, 1, 1, 2, 8, "selective", []),
    ("llama70b-tp2-mbs2-rcsel", L70B, 2, 1, 1, 1, 2, 4, "selective", []),
    ("gpt6.7b-dp2-mbs4", G67B, 1, 1, 2, 1, 4, 16, "none", []),
    ("llama8b-pp2-mbs2", L8B, 1, 2, 1, 1, 2, 8, "none", []),
    ("mixtral-tp2-sp", MIX, 2, 1, 1, 1, 1, 4, "none", ["--sequence-parallel"]),
]

# Round 8 (seventh session, a 2 x H200 lease): five configurations never run, predicted before they
# were measured (traces/README.md): GPT-3 175B layers at TP 2, Llama-3 70B at PP 2, the distributed
# optimizer with overlapped gradient reduction at DP 2, MoE with full recomputation (raw kept), and GPT
# with sequence parallelism (raw kept: host traces for a per-configuration host cost, docs/host.md).
ROUND8 = ["gpt175b-tp2-rcsel", "llama70b-pp2", "gpt13b-dp2-distopt-og", "mixtral-ep2-rcfull-raw", "gpt6.7b-tp2-sp-raw"]
TRAININGS += [
    ("gpt175b-tp2-rcsel", "gpt3-175b@L1", 2, 1, 1, 1, 1, 4, "selective", []),
    ("llama70b-pp2", L70B, 1, 2, 1, 1, 1, 4, "none", []),
    ("gpt13b-dp2-distopt-og", G13B, 1, 1, 2, 1, 2, 8, "none", ["--distributed-optimizer", "--overlap-grad-reduce"]),
    ("mixtral-ep2-rcfull-raw", MIX, 1, 1, 2, 2, 1, 4, "full", ["--keep-raw"]),
    ("gpt6.7b-tp2-sp-raw", G67B, 2, 1, 1, 1, 2, 8, "none", ["--sequence-parallel", "--keep-raw"]),
]

# Round 9 (ninth session, a 2 x H200 lease): the 2-GPU collectives timed by their NCCL kernels (what the
# simulator consumes, no launch floor: measure/collectives.py), and host-bound twins of three
# configurations at sequence 256: the same kernels launched (fewer tokens each), so the GPU waits for
# the host nearly all the step and the step time measures the host's pace per configuration
# (docs/host.md). Predicted before they were measured (traces/README.md, round 9).
L8B_S256 = "llama3-8b@L4,S256"
MIX_S256 = "mixtral-8x7b@L2,S256"
ROUND9 = ["collectives-2gpu-kernel", "llama8b-tp2-s256", "mixtral-tp2-sp-s256", "mixtral-ep2-s256", "llama8b-1gpu-s256"]
TRAININGS += [
    ("llama8b-tp2-s256", L8B_S256, 2, 1, 1, 1, 1, 8, "none", []),
    ("mixtral-tp2-sp-s256", MIX_S256, 2, 1, 1, 1, 1, 4, "none", ["--sequence-parallel"]),
    ("mixtral-ep2-s256", MIX_S256, 1, 1, 2, 2, 2, 4, "none", []),
    ("llama8b-1gpu-s256", L8B_S256, 1, 1, 1, 1, 2, 8, "none", []),
]

# Round 10 (nineteenth session): host-bound one-GPU runs at sequence 256, all three on one H100
# (nvidia-h100-x1), whose six round-4 runs are all GPU-bound (its launch cost rested on mixtral-1gpu
# alone), and the two new ones on one H200 (nvidia-h200); predicted before they were measured
# (traces/README.md, round 10).
G13_S256 = "gpt3-1.3b@L8,S256"
ROUND10 = ["llama8b-1gpu-s256", "mixtral-1gpu-s256", "gpt1.3b-1gpu-s256"]
TRAININGS += [
    ("mixtral-1gpu-s256", MIX_S256, 1, 1, 1, 1, 2, 4, "none", []),
    ("gpt1.3b-1gpu-s256", G13_S256, 1, 1, 1, 1, 4, 16, "none", []),
]

# Round 11 (twenty-third session): round 9's and round 10's host-bound one-GPU configurations again, all three
# on one H200 lease (nvidia-h200): their steps move between runs by more than the held-out goal
# (docs/host.md, "The host-bound runs measured again"); a second run of each gives the validation report
# its repeatability figure where the errors are largest.
ROUND11 = ["gpt1.3b-1gpu-s256-r11", "llama8b-1gpu-s256-r11", "mixtral-1gpu-s256-r11"]
TRAININGS += [
    ("gpt1.3b-1gpu-s256-r11", G13_S256, 1, 1, 1, 1, 4, 16, "none", []),
    ("llama8b-1gpu-s256-r11", L8B_S256, 1, 1, 1, 1, 2, 8, "none", []),
    ("mixtral-1gpu-s256-r11", MIX_S256, 1, 1, 1, 1, 2, 4, "none", []),
]

# Round 12 (twenty-fourth session): does a scaled-down model keep the full model's bottlenecks? The
# one-GPU configurations of rounds 3-4 again with more (and fewer) layers, all else equal, on one H200
# (nvidia-h200): GPT-3 1.3B up to its full 24 layers, Llama-3 8B at 2 / 8 / 16 layers, GPT-3 6.7B at 8 / 16,
# GPT-3 13B at 8, Mixtral at 1 / 3; `calib validate` reports each depth series (docs/validate.md,
# "Scaled-down models").
ROUND12 = ["gpt1.3b-1gpu-mbs4-L24", "gpt1.3b-1gpu-mbs4-L16", "llama8b-1gpu-mbs2-L16", "llama8b-1gpu-mbs2-L8",
           "llama8b-1gpu-mbs2-L2", "gpt6.7b-1gpu-mbs4-rcfull-L16", "gpt6.7b-1gpu-mbs4-rcfull-L8",
           "gpt13b-1gpu-mbs2-L8", "mixtral-1gpu-L3", "mixtral-1gpu-L1"]
TRAININGS += [
    ("gpt1.3b-1gpu-mbs4-L24", "gpt3-1.3b", 1, 1, 1, 1, 4, 16, "none", []),
    ("gpt1.3b-1gpu-mbs4-L16", "gpt3-1.3b@L16", 1, 1, 1, 1, 4, 16, "none", []),
    ("llama8b-1gpu-mbs2-L16", "llama3-8b@L16,S2048", 1, 1, 1, 1, 2, 8, "none", []),
    ("llama8b-1gpu-mbs2-L8", "llama3-8b@L8,S2048", 1, 1, 1, 1, 2, 8, "none", []),
    ("llama8b-1gpu-mbs2-L2", "llama3-8b@L2,S2048", 1, 1, 1, 1, 2, 8, "none", []),
    ("gpt6.7b-1gpu-mbs4-rcfull-L16", "gpt3-6.7b@L16", 1, 1, 1, 1, 4, 8, "full", []),
    ("gpt6.7b-1gpu-mbs4-rcfull-L8", "gpt3-6.7b@L8", 1, 1, 1, 1, 4, 8, "full", []),
    ("gpt13b-1gpu-mbs2-L8", "gpt3-13b@L8", 1, 1, 1, 1, 2, 8, "none", []),
    ("mixtral-1gpu-L3", "mixtral-8x7b@L3,S2048", 1, 1, 1, 1, 1, 4, "none", []),
    ("mixtral-1gpu-L1", "mixtral-8x7b@L1,S2048", 1, 1, 1, 1, 1, 4, "none", []),
]
def repeats(base: list[str], tag: str, *flags: str) -> list[str]:
    """The job specs of `base` once more as `<id>-<tag>` (a run of the same configuration on another
    lease), with `flags` added to their arguments, appended to TRAININGS; their ids, in `base`'s order."""
    TRAININGS.extend([(f"{s[0]}-{tag}", *s[1:-1], [*s[-1], *flags]) for s in TRAININGS if s[0] in base])
    return [f"{rid}-{tag}" for rid in base]


# The series' committed members again on the same lease (`-r12`), so that each series also has one
# machine's runs only.
ROUND12_BASE = ["gpt1.3b-1gpu-mbs4", "llama8b-1gpu-mbs2", "gpt6.7b-1gpu-mbs4-rcfull", "gpt13b-1gpu-mbs2", "mixtral-1gpu"]
ROUND12 += repeats(ROUND12_BASE, "r12")

# Round 13: committed configurations again with the memory probes (measure.worker.memory_probe), for
# the device memory outside torch's allocator that the out-of-memory verdict had not counted.
ROUND13_BASE = ["llama8b-1gpu-mbs2-L8", "gpt6.7b-1gpu-mbs4-rcfull-L16", "gpt13b-1gpu-mbs2-L8", "mixtral-1gpu",
                "gpt1.3b-1gpu-mbs4", "llama8b-1gpu-mbs2-L2", "gpt6.7b-1gpu-mbs4-rcfull-L8", "mixtral-1gpu-L1"]
ROUND13 = repeats(ROUND13_BASE, "r13")

# Round 14: one-GPU depths on the H100 around its memory's edge, each predicted `fits`, `tight` or
# `out of memory` by the memory model before it ran (traces/README.md, round 14).
ROUND14 = ["llama8b-1gpu-mbs2-L6", "llama8b-1gpu-mbs2-L7", "gpt6.7b-1gpu-mbs4-rcfull-L12",
           "gpt6.7b-1gpu-mbs4-rcfull-L14", "gpt1.3b-1gpu-mbs4-L20", "gpt1.3b-1gpu-mbs4-L22", "gpt13b-1gpu-mbs2-L8-r14",
           "mixtral-1gpu-r14"]
TRAININGS += [
    ("llama8b-1gpu-mbs2-L6", "llama3-8b@L6,S2048", 1, 1, 1, 1, 2, 8, "none", []),
    ("llama8b-1gpu-mbs2-L7", "llama3-8b@L7,S2048", 1, 1, 1, 1, 2, 8, "none", []),
    ("gpt6.7b-1gpu-mbs4-rcfull-L12", "gpt3-6.7b@L12", 1, 1, 1, 1, 4, 8, "full", []),
    ("gpt6.7b-1gpu-mbs4-rcfull-L14", "gpt3-6.7b@L14", 1, 1, 1, 1, 4, 8, "full", []),
    ("gpt1.3b-1gpu-mbs4-L20", "gpt3-1.3b@L20", 1, 1, 1, 1, 4, 16, "none", []),
    ("gpt1.3b-1gpu-mbs4-L22", "gpt3-1.3b@L22", 1, 1, 1, 1, 4, 16, "none", []),
]
repeats(["gpt13b-1gpu-mbs2-L8", "mixtral-1gpu"], "r14")

# Round 15: the H100's memory edge again, each verdict given before the run by the estimate that
# measure.probes.memory_peak corrected (attention buffer, attention-backward transient, loss, gated
# MLP): one configuration it calls out of memory that the old estimate called tight (GPT-3 6.7B, full
# recomputation, 15 layers) and tight ones of each recomputation mode (traces/README.md, round 15).
ROUND15 = ["gpt6.7b-1gpu-mbs4-rcsel-L10", "gpt6.7b-1gpu-mbs4-L7", "llama8b-1gpu-mbs2-rcsel-L10", "gpt13b-1gpu-mbs2-L7",
           "gpt1.3b-1gpu-mbs4-L21", "gpt6.7b-1gpu-mbs4-rcfull-L15"]
TRAININGS += [
    ("gpt6.7b-1gpu-mbs4-rcsel-L10", "gpt3-6.7b@L10", 1, 1, 1, 1, 4, 8, "selective", []),
    ("gpt6.7b-1gpu-mbs4-L7", "gpt3-6.7b@L7", 1, 1, 1, 1, 4, 8, "none", []),
    ("llama8b-1gpu-mbs2-rcsel-L10", "llama3-8b@L10,S2048", 1, 1, 1, 1, 2, 8, "selective", []),
    ("gpt13b-1gpu-mbs2-L7", "gpt3-13b@L7", 1, 1, 1, 1, 2, 8, "none", []),
    ("gpt1.3b-1gpu-mbs4-L21", "gpt3-1.3b@L21", 1, 1, 1, 1, 4, 16, "none", []),
    ("gpt6.7b-1gpu-mbs4-rcfull-L15", "gpt3-6.7b@L15", 1, 1, 1, 1, 4, 8, "full", []),
]

# Round 16: megatron-core with torch's fused flash attention (--attention flash, measure/mcore.py) on one
# GPU: flash twins of committed one-GPU configurations, and Llama-3 8B at its own sequence of 8192 with
# either attention, where the unfused attention's scores dominate (traces/README.md, round 16).
FLASH = ["--attention", "flash"]
FLASH_RAW = [*FLASH, "--keep-raw"]  # raw traces to check the converter on the flash ops
ROUND16 = ["llama8b-1gpu-mbs2-flash", "gpt1.3b-1gpu-mbs4-flash", "gpt6.7b-1gpu-mbs4-rcfull-flash",
           "gpt13b-1gpu-mbs2-flash", "mixtral-1gpu-flash", "llama8b-1gpu-rcsel-flash", "llama8b-1gpu-s8192-flash",
           "llama8b-1gpu-s8192", "llama8b-1gpu-mbs2-L8-flash", "gpt6.7b-1gpu-mbs4-rcsel-flash"]
TRAININGS += [
    ("llama8b-1gpu-mbs2-flash", L8B, 1, 1, 1, 1, 2, 8, "none", FLASH_RAW),
    ("gpt1.3b-1gpu-mbs4-flash", G13, 1, 1, 1, 1, 4, 16, "none", FLASH_RAW),
    ("gpt6.7b-1gpu-mbs4-rcfull-flash", G67B, 1, 1, 1, 1, 4, 8, "full", FLASH),
    ("gpt13b-1gpu-mbs2-flash", G13B, 1, 1, 1, 1, 2, 8, "none", FLASH),
    ("mixtral-1gpu-flash", MIX, 1, 1, 1, 1, 1, 4, "none", FLASH),
    ("llama8b-1gpu-rcsel-flash", L8B, 1, 1, 1, 1, 1, 8, "selective", FLASH),
    ("llama8b-1gpu-s8192-flash", "llama3-8b@L4", 1, 1, 1, 1, 1, 4, "none", FLASH),
    ("llama8b-1gpu-s8192", "llama3-8b@L4", 1, 1, 1, 1, 1, 4, "none", []),
    ("llama8b-1gpu-mbs2-L8-flash", "llama3-8b@L8,S2048", 1, 1, 1, 1, 2, 8, "none", FLASH),
    ("gpt6.7b-1gpu-mbs4-rcsel-flash", G67B, 1, 1, 1, 1, 4, 8, "selective", FLASH),
]

# Round 17: flash-attention configurations none of round 16 had, each predicted before it ran by the H100
# calibration refitted with round 16 (h100/_campaigns/x1-round17/predictions.json), and round 16's Llama-3
# 8B flash run once more (its repeatability).
ROUND17 = ["gpt6.7b-1gpu-mbs2-s4096-flash", "llama8b-1gpu-mbs4-flash", "llama8b-1gpu-s8192-mbs2-L2-flash",
           "gpt13b-1gpu-mbs4-rcsel-flash", "mixtral-1gpu-L1-mbs2-flash", "gpt1.3b-1gpu-s256-flash", "gpt6.7b-1gpu-mbs4-flash",
           "llama8b-1gpu-mbs2-flash-r17"]
TRAININGS += [
    ("gpt6.7b-1gpu-mbs2-s4096-flash", "gpt3-6.7b@L4,S4096", 1, 1, 1, 1, 2, 8, "none", FLASH),
    ("llama8b-1gpu-mbs4-flash", L8B, 1, 1, 1, 1, 4, 8, "none", FLASH),
    ("llama8b-1gpu-s8192-mbs2-L2-flash", "llama3-8b@L2", 1, 1, 1, 1, 2, 4, "none", FLASH),
    ("gpt13b-1gpu-mbs4-rcsel-flash", G13B, 1, 1, 1, 1, 4, 8, "selective", FLASH),
    ("mixtral-1gpu-L1-mbs2-flash", "mixtral-8x7b@L1,S2048", 1, 1, 1, 1, 2, 4, "none", FLASH),
    ("gpt1.3b-1gpu-s256-flash", "gpt3-1.3b@L8,S256", 1, 1, 1, 1, 4, 16, "none", FLASH),
    ("gpt6.7b-1gpu-mbs4-flash", G67B, 1, 1, 1, 1, 4, 8, "none", FLASH),
    ("llama8b-1gpu-mbs2-flash-r17", L8B, 1, 1, 1, 1, 2, 8, "none", FLASH),
]

# Round 18 (one H200): Llama-3 8B at sequence 8192 with the unfused attention, which needs more than an
# H100's 80 GB (it ran out of memory in round 16), beside its flash twin, and H200 flash twins of the
# round-16 configurations; predicted before they ran by the H200 calibration, which had no flash run.
ROUND18 = ["llama8b-1gpu-s8192", "llama8b-1gpu-s8192-flash", "llama8b-1gpu-mbs2-flash", "gpt1.3b-1gpu-mbs4-flash",
           "gpt6.7b-1gpu-mbs4-rcfull-flash", "gpt13b-1gpu-mbs2-flash", "mixtral-1gpu-flash", "gpt6.7b-1gpu-mbs4-flash",
           "llama8b-1gpu-s8192-mbs2-L2-flash"]

# Round 19 (one H200): one full-width layer of Llama-3 70B at sequences 6144 and 8192 with the unfused
# attention, which need more than an H100 holds, beside its flash twin at 8192; one layer of GPT-3 175B
# with either attention; H200 twins of round 17's flash configurations. All predicted before they ran by
# the H200 calibration refitted with round 18 (h200/_campaigns/x1-round19/predictions.json).
ROUND19 = ["llama70b-1gpu-L1-s8192", "llama70b-1gpu-L1-s6144", "llama70b-1gpu-L1-s8192-flash", "gpt175b-1gpu-L1-flash",
           "gpt175b-1gpu-L1", "llama8b-1gpu-mbs4-flash", "gpt6.7b-1gpu-mbs2-s4096-flash", "gpt13b-1gpu-mbs4-rcsel-flash",
           "mixtral-1gpu-L1-mbs2-flash"]
TRAININGS += [
    ("llama70b-1gpu-L1-s8192", "llama3-70b@L1", 1, 1, 1, 1, 1, 4, "none", []),
    ("llama70b-1gpu-L1-s6144", "llama3-70b@L1,S6144", 1, 1, 1, 1, 1, 4, "none", []),
    ("llama70b-1gpu-L1-s8192-flash", "llama3-70b@L1", 1, 1, 1, 1, 1, 4, "none", FLASH),
    ("gpt175b-1gpu-L1-flash", "gpt3-175b@L1", 1, 1, 1, 1, 1, 4, "none", FLASH),
    ("gpt175b-1gpu-L1", "gpt3-175b@L1", 1, 1, 1, 1, 1, 4, "none", []),
]

# Round 20 (a 2 x H100 lease, the first multi-GPU H100 host): the 2-GPU collectives timed both ways, H100
# twins of 2-GPU H200 configurations, and the first multi-GPU flash-attention runs (TP with and without
# sequence parallelism, DP, PP, EP). Predicted before they ran with the H100 calibration, which had no
# network fit: the preset's datasheet NVLink figures (h100/_campaigns/x2-round20/predictions.json).
SP = ["--sequence-parallel"]
ROUND20 = ["collectives-2gpu-loop", "llama8b-tp2", "llama8b-tp2-flash", "gpt6.7b-dp2-mbs4", "gpt6.7b-dp2-mbs4-flash",
           "llama8b-pp2-mbs2", "llama8b-pp2-mbs2-flash", "mixtral-ep2-mbs2", "mixtral-ep2-mbs2-flash",
           "collectives-2gpu-kernel", "llama8b-tp2-sp-mbs2", "llama8b-tp2-sp-mbs2-flash", "gpt13b-tp2", "gpt13b-tp2-flash",
           "gpt6.7b-tp2-mbs2", "gpt1.3b-dp2-mbs4", "mixtral-tp2-sp", "mixtral-tp2-sp-flash"]
# Its third call: H100 twins of further 2-GPU H200 configurations (distributed optimizer, a 70B pipeline,
# 175B layers, host-bound sequence-256 runs, the telemetry-off twin), predicted the same way.
ROUND20B = ["gpt13b-dp2-distopt-og", "llama70b-pp2", "gpt175b-tp2-rcsel", "llama8b-tp2-s256", "mixtral-ep2-s256",
            "llama8b-tp2-notel", "gpt13b-pp2-rcfull", "gpt6.7b-tp2-mbs4-rcsel"]
TRAININGS += [
    ("llama8b-tp2-flash", L8B, 2, 1, 1, 1, 1, 8, "none", FLASH),
    ("gpt6.7b-dp2-mbs4-flash", G67B, 1, 1, 2, 1, 4, 16, "none", FLASH),
    ("llama8b-pp2-mbs2-flash", L8B, 1, 2, 1, 1, 2, 8, "none", FLASH),
    ("mixtral-ep2-mbs2-flash", MIX, 1, 1, 2, 2, 2, 4, "none", FLASH),
    ("llama8b-tp2-sp-mbs2-flash", L8B, 2, 1, 1, 1, 2, 8, "none", [*SP, *FLASH]),
    ("gpt13b-tp2-flash", G13B, 2, 1, 1, 1, 1, 8, "none", FLASH),
    ("mixtral-tp2-sp-flash", MIX, 2, 1, 1, 1, 1, 4, "none", [*SP, *FLASH]),
]

# Round 21 (2 x H200): H200 twins of round 20's multi-GPU flash-attention runs, whose unfused twins ran
# on H200 pairs before (predicted before the call by the H200 calibration), and both 2-GPU collective
# harnesses again on another host, to set host-to-host repeatability beside the network model's error.
ROUND21 = ["llama8b-tp2-flash", "gpt6.7b-dp2-mbs4-flash", "llama8b-pp2-mbs2-flash", "mixtral-ep2-mbs2-flash",
           "llama8b-tp2-sp-mbs2-flash", "gpt13b-tp2-flash", "mixtral-tp2-sp-flash", "collectives-2gpu-kernel-r21",
           "collectives-2gpu-loop-r21"]

# Round 21 ran on 2 x H100 (a call for nvidia-h200-x2 may be given H100s): its flash runs came back as
# repeats of round 20's on another host, 1-5 % faster and steady (0.7-5.6 % step spread where round 20's
# host spread 11-34 %). Its second call: the round 20 configurations that ran unsteadily, again on that host.
ROUND21_BASE = ["llama8b-tp2", "llama8b-tp2-sp-mbs2", "gpt13b-tp2", "gpt6.7b-tp2-mbs2", "mixtral-tp2-sp",
                "mixtral-ep2-mbs2", "llama8b-tp2-s256", "mixtral-ep2-s256", "gpt175b-tp2-rcsel", "gpt6.7b-tp2-mbs4-rcsel",
                "llama8b-tp2-notel", "llama8b-pp2-mbs2", "gpt6.7b-dp2-mbs4"]
ROUND21B = repeats(ROUND21_BASE, "r21")
# One-GPU runs whose step time swung most between hosts (held-out error up to 30 %), once more on another host.
ROUND21_ONE = ["gpt1.3b-1gpu-s256", "mixtral-1gpu", "mixtral-1gpu-L1", "mixtral-1gpu-s256"]
ROUND21B += repeats(ROUND21_ONE, "r21")
# Its third call: H100 twins of the 2-GPU H200 configurations that had none (predicted before the call by
# the H100 calibration of the day, predictions-c.json).
# Round 22: ROUND21C asked again for 2 x H100, given 2 x H200 (traces/h200/_campaigns/x2-round22):
# committed as h200/<id>-r22.
ROUND21C = ["gpt13b-tp2-mbs2-rcsel", "gpt6.7b-pp2-mbs2", "gpt6.7b-tp2-mbs4-rcsel-notel", "llama70b-tp2",
            "llama70b-tp2-mbs2-rcsel", "llama8b-dp2-mbs2-rcsel", "mixtral-tp2-sp-rcsel", "mixtral-tp2-sp-s256"]
# Round 25 (thirty-second session): four of them, one per parallelism, given 2 x H100 at last (h100/<id>,
# h100/_campaigns/x2-round25): the tree that travels had room for no more.
ROUND25_H100 = ["gpt6.7b-pp2-mbs2", "llama8b-dp2-mbs2-rcsel", "gpt13b-tp2-mbs2-rcsel", "llama70b-tp2"]
# Round 26 (thirty-third session): the other four, once the tables' recompression made room (h100/<id>,
# h100/_campaigns/x2-round26; predicted in round 21's predictions-c.json and again, before the call, by the
# committed H100 calibration in predictions.json).
ROUND26_H100 = [i for i in ROUND21C if i not in ROUND25_H100]

# Round 23 (thirty-first session, asked for 4 x H100, nvidia-h100-x4, which may come as 4 x H200): the
# 4-GPU collectives timed by their NCCL kernels (group sizes 2 and 4 on one 4-GPU host: the group-size-4
# series had only event-timed points, with their 42-58 us launch floor) and as nccl-tests' loop, and
# three 4-GPU configurations no round ran (dense TP 4, EP 4 at micro-batch 2, PP 2 x DP 2), predicted
# before the call by both calibrations (h200/_campaigns/x4-round23/predictions.json, h100/...). Three
# only: a 4-GPU bundle is 0.35-0.56 MB and the repository travels to the device whole (64 MiB).
ROUND23 = ["collectives-4gpu-kernel", "collectives-4gpu-loop", "gpt6.7b-tp4-mbs2", "mixtral-ep4-mbs2",
           "llama8b-pp2dp2-mbs2"]
TRAININGS += [
    ("gpt6.7b-tp4-mbs2", G67B, 4, 1, 1, 1, 2, 8, "none", []),
    ("mixtral-ep4-mbs2", MIX, 1, 1, 4, 4, 2, 8, "none", []),
    ("llama8b-pp2dp2-mbs2", L8B, 1, 2, 2, 1, 2, 16, "none", []),
]

# Its second call, asked for nvidia-h100-x4 again: on 4 x H100 the three configurations without telemetry
# (half the bytes: the tree that travels is near its 64 MiB; the sampler is not part of what the
# projection models, so predictions.json of h100/_campaigns/x4-round23 stands for them) and the 4-GPU
# kernel-timed collectives; on 4 x H200 only the collectives again (a second host's repeat).
ROUND23B_H100 = ["collectives-4gpu-kernel", "gpt6.7b-tp4-mbs2-notel", "mixtral-ep4-mbs2-notel",
                 "llama8b-pp2dp2-mbs2-notel"]
ROUND23B_H200 = ["collectives-4gpu-kernel"]
TRAININGS += [
    ("gpt6.7b-tp4-mbs2-notel", G67B, 4, 1, 1, 1, 2, 8, "none", ["--no-telemetry"]),
    ("mixtral-ep4-mbs2-notel", MIX, 1, 1, 4, 4, 2, 8, "none", ["--no-telemetry"]),
    ("llama8b-pp2dp2-mbs2-notel", L8B, 1, 2, 2, 1, 2, 16, "none", ["--no-telemetry"]),
]

# Round 24 (one H100, the only kind that always gives an H100): layers at full width on the H100, predicted
# before they ran by the H100 calibration (h100/_campaigns/x1-round24/predictions.json). Every 1-GPU
# configuration that no H100 ran is predicted out of memory or "tight" there; these six are the tight ones
# (their device-memory bracket straddles the H100's 79.2 GiB): round 19's three H200 layers, one layer of
# Llama-3 70B at sequence 4096 with flash attention and of GPT-3 175B at 1024, and round 12's 8-layer
# Llama-3 8B. Which end of each bracket holds tests the memory verdict; those that fit test the step time.
ROUND24_H100 = ["llama70b-1gpu-L1-s8192-flash", "gpt175b-1gpu-L1-flash", "gpt175b-1gpu-L1",
                "llama70b-1gpu-L1-s4096-flash", "gpt175b-1gpu-L1-s1024", "llama8b-1gpu-mbs2-L8"]
TRAININGS += [
    ("llama70b-1gpu-L1-s4096-flash", "llama3-70b@L1,S4096", 1, 1, 1, 1, 1, 4, "none", FLASH),
    ("gpt175b-1gpu-L1-s1024", "gpt3-175b@L1,S1024", 1, 1, 1, 1, 1, 4, "none", []),
]

# Round 27 (thirty-fourth session, one GPU): the three one-GPU host-paced configurations again, now with
# the host-pace sampler beside them (measure/telemetry/host_pace.py), three times each in interleaved
# order (a slow spell of the machine falls on all three), and one GPU-paced configuration as the control
# whose step should not follow the host. Predicted before the call (_campaigns/x1-round27/predictions.json).
ROUND27_BASE = ["gpt1.3b-1gpu-s256", "llama8b-1gpu-s256", "mixtral-1gpu-s256"]
ROUND27 = [*repeats(ROUND27_BASE, "r27"), *repeats(["gpt1.3b-1gpu-mbs4"], "r27"), *repeats(ROUND27_BASE, "r27b"),
           *repeats(ROUND27_BASE, "r27c")]

# Round 28 (thirty-sixth session, one H200): round 27 on the H200, whose host-paced repeats spread most
# (up to 62 %) and had no run with the host-pace sampler: the same three configurations three times each,
# interleaved, and the same GPU-paced control. Predicted before the call (_campaigns/x1-round28/predictions.json).
ROUND28 = [*repeats(ROUND27_BASE, "r28"), *repeats(["gpt1.3b-1gpu-mbs4"], "r28"), *repeats(ROUND27_BASE, "r28b"),
           *repeats(ROUND27_BASE, "r28c")]

# Round 29 (thirty-sixth session, 2 x H200): dense TP 2 at more micro-batches per step than any fitted TP run
# (2-8), where a TP rendezvous per blocking collective and a race of the hosts once per step part ways
# (docs/host.md, "The race once per step, tried"). Predicted before the call by the committed calibration (per call
# only) and by the refit with the race (_campaigns/x2-round29/predictions-*.json).
ROUND29 = ["llama8b-tp2-mb32", "gpt13b-tp2-mb16"]
TRAININGS += [
    ("llama8b-tp2-mb32", L8B, 2, 1, 1, 1, 1, 32, "none", []),
    ("gpt13b-tp2-mb16", G13B, 2, 1, 1, 1, 1, 16, "none", []),
]

# Round 30 (thirty-seventh session, one H200): the three host-paced one-GPU configurations twice each,
# interleaved, the first runs with the trainer's own pace timed after every step (measure/own_pace.py): on the
# H200 a host-paced step follows the pace of its own threads' CPUs, which the host-pace sampler does not see
# (docs/host.md, "The trainer's threads, step by step"). Predicted before the call
# (_campaigns/x1-round30/predictions.json).
ROUND30 = [*repeats(ROUND27_BASE, "r30"), *repeats(ROUND27_BASE, "r30b")]
# Round 31: round 30 again on another lease, where the own pace's scale may differ from round 30's host
# (_campaigns/x1-round31/predictions.json, by the same calibration as round 30's).
ROUND31 = [*repeats(ROUND27_BASE, "r31"), *repeats(ROUND27_BASE, "r31b")]

# Round 32 (thirty-eighth session, 2 x H200): the host-paced two-GPU configurations (TP, TP with sequence
# parallelism, EP with DP) twice each, interleaved, with the trainer's own pace after every step (and the barrier
# across ranks it takes): the first multi-GPU runs that time it, for a host-cost factor beyond one GPU
# (docs/host.md, "The trainer's own pace, run by run"). Predicted before the call (_campaigns/x2-round32/predictions.json).
ROUND32_BASE = ["llama8b-tp2-s256", "mixtral-tp2-sp-s256", "mixtral-ep2-s256"]
ROUND32 = [*repeats(ROUND32_BASE, "r32"), *repeats(ROUND32_BASE, "r32b")]
# Round 33 (one H200): rounds 30 and 31 on a third lease (_campaigns/x1-round33/predictions.json).
ROUND33 = [*repeats(ROUND27_BASE, "r33"), *repeats(ROUND27_BASE, "r33b")]

# Round 34 (thirty-ninth session, 2 x H200, a probe: its bundles are not committed): the one-GPU and TP 2 +
# SP Mixtral configurations at sequence 256 with their raw traces kept, for the host's waits per MoE routing on
# the two code paths where only megatron-core's code said how many there are (mixtral-ep2-mbs2-raw has EP's:
# docs/host.md, "One wait per routing"). benchmarks/routing_waits.py reads them; its summary is committed in
# traces/h200/_probes/routing-waits-1/.
ROUND34 = repeats(["mixtral-1gpu-s256", "mixtral-tp2-sp-s256"], "raw34", "--keep-raw")
# Round 35 (fortieth session, one H200): the one-GPU Mixtral depth series at sequence 2048 (1, 2 and 3 layers)
# twice on one lease with the trainer's own pace, for what its GPU idles per step against the depth (docs/host.md,
# "Where the one-GPU MoE steps idle"; benchmarks/gpu_idle.py).
DEPTH_SERIES = ["mixtral-1gpu-L1", "mixtral-1gpu", "mixtral-1gpu-L3"]
ROUND35 = [*repeats(DEPTH_SERIES, "idle35"), *repeats(DEPTH_SERIES, "idle35b")]
# Round 36 (forty-first session, 2 x H200, committed in the forty-second): round 32's configurations measured twice on
# one lease, a pass before and a pass after the host-phase probe (traces/h200/_probes/host-phases-14), to set the
# probe's steps against `calib measure`'s. Run under round 32's ids (`--only` of ROUND32's first three) and renamed
# -r36 (first pass) and -r36b (second) when committed; _campaigns/x2-round36 keeps both passes' campaign.json as run.
ROUND36 = [*repeats(ROUND32_BASE, "r36"), *repeats(ROUND32_BASE, "r36b")]
# Round 37 (forty-third session, asked for as 4 x H200, run on the 4 x H100 given): three four-GPU configurations
# no bundle had, each predicted before it ran (measure.campaigns.predict: traces/h200/_campaigns/x4-round37 with the
# H200 calibration, traces/h100/_campaigns/x4-round37 with the H100's): TP 4 with sequence parallelism on Llama-3
# 70B's layers, TP 2 x PP 2 with sequence parallelism on them, and TP 2 x DP 2 with the distributed optimizer
# overlapping its gradient reduction (traces/README.md, round 37).
TRAININGS += [
    ("llama70b-tp4-sp", L70B, 4, 1, 1, 1, 1, 4, "none", ["--sequence-parallel"]),
    ("llama70b-tp2pp2-sp", L70B, 2, 2, 1, 1, 1, 8, "none", ["--sequence-parallel"]),
    ("llama8b-tp2dp2-distopt", L8B, 2, 1, 2, 1, 1, 8, "none", ["--distributed-optimizer", "--overlap-grad-reduce"]),
]
ROUND37 = ["llama70b-tp4-sp", "llama70b-tp2pp2-sp", "llama8b-tp2dp2-distopt"]
# Round 39 (forty-eighth session, 2 x H200): the 2-GPU collectives timed by their NCCL kernels at four sizes per
# doubling from 256 KiB to 1 GiB, twice on one host. The factor-of-2 grid steps over the bends between NCCL's
# protocol ranges, where the network model's held-out sizes miss most (4-8 MiB: up to 30 %); two passes on one
# host say how much of that a host repeats (traces/README.md, round 39).
# The first call's sizes were only multiples of 4 bytes and off the powers of two took up to 1.8x longer, unsteadily;
# the second call's are multiples of 4 KiB (as training messages are, mostly of 8-16 KiB) and of 64 KiB.
ROUND39 = ["collectives-2gpu-dense", "collectives-2gpu-dense-b"]
ROUND39_ALIGNED = {"collectives-2gpu-dense-a4k": 4096, "collectives-2gpu-dense-a4k-b": 4096,
                   "collectives-2gpu-dense-a64k": 65536}
# Round 40 (forty-ninth session, another 2 x H200 lease): round 39's 4 KiB grid twice more, to tell whether the bends
# the network model takes from one host (calib.models.network.Bends) hold on another.
ROUND40 = {"collectives-2gpu-dense-a4k-c": 4096, "collectives-2gpu-dense-a4k-d": 4096}
# Round 41 (forty-ninth session, 4 x H200): the same grid for groups of 4, whose series were measured by factors of 2
# only (the H200's 4-GPU microbenchmarks were its worst held-out sizes: 3.8-8.1 % against 2.2-5.2 % for groups of 2;
# traces/README.md, round 41). On 2 x H100, round 39's `collectives-2gpu-dense-a4k` and `-a4k-b` would do the same for
# the H100's 2-GPU series.
ROUND41_X4 = ["collectives-4gpu-dense-a4k", "collectives-4gpu-dense-a4k-b"]
# Round 42 (fiftieth session, 4 x H200): the 4 KiB grid for groups of 2 and 4 with each call alone on an idle GPU and
# its transfer split as a training step's (`--timing kernel-isolated`), twice, and once back to back on the same
# lease: measure.probes.a2a_context found the back-to-back harness 4-23 % slow for 32-64 MiB all-to-alls of 4 and
# its fastest-member convention 10-17 % fast at 8-9.5 MiB against the training steps' split (traces/README.md,
# round 42).
ROUND42_X4 = {"collectives-4gpu-dense-iso": "kernel-isolated", "collectives-4gpu-dense-b2b": "kernel",
              "collectives-4gpu-dense-iso-b": "kernel-isolated"}
# Round 44 (fifty-first session): round 43's probe found an all-to-all's split 5-14 % shorter when its members arrive
# 200 us or more apart; the harness's released timing (each call's members released together on the GPU, the last
# one `late_us` after) asks the same of every kind at sizes by factors of 2, together and apart, on one lease: groups
# of 2 on 2 x H200, groups of 2 and 4 on 4 x H200. calib fit refuses these bundles (timing_method kernel-released)
# until the model reads them. Id -> (GPUs, group sizes, the late member's delay in us, more flags). A second call
# added 50 and 1,000 us (how the saving grows with the delay), a send/recv whose sender is late, and the members
# together again on that lease.
ROUND44 = {"collectives-2gpu-released-0": (2, "2", 0.0, ()), "collectives-2gpu-released-200": (2, "2", 200.0, ()),
           "collectives-4gpu-released-0": (4, "2,4", 0.0, ()), "collectives-4gpu-released-200": (4, "2,4", 200.0, ()),
           "collectives-2gpu-released-50": (2, "2", 50.0, ()), "collectives-2gpu-released-1000": (2, "2", 1000.0, ()),
           "collectives-2gpu-released-200-sender": (2, "2", 200.0, ("--kinds", "send_recv", "--late-member", "0")),
           "collectives-2gpu-released-0-b": (2, "2", 0.0, ())}
# Round 45 (1 x H200): the kernel microbenchmarks timed kernel by kernel from a converted profile, as the training
# steps' kernels are (measure/kernels.py, --timing kernel), where kernels-h200 (round 1) timed each call with CUDA
# events and read the host's dispatch into its small kernels; attention forward and backward, up to sequence 8192.
# The quick subset runs first: it checks the path in a minute. Id -> extra arguments.
ROUND45 = {"kernels-h200-kernel-quick": ("--quick",), "kernels-h200-kernel": ("--max-seconds", "420")}

# Round 46 (fifty-seventh session, one H200): configurations no H200 had run, each predicted before the call by the
# committed H200 calibration (_campaigns/x1-round46/predictions.json): six the H100 ran (rounds 16, 17 and 24) and
# four new, GPU-bound at full-width layers as projections at scale are (Llama-3 70B's and GPT-3 175B's layers at
# micro-batch 2 with flash attention, Mixtral's at micro-batch 2, GPT-3 13B's under full recomputation), plus one
# host-paced run (GPT-3 1.3B at sequence 256 with flash attention).
ROUND46_NEW = ["llama70b-1gpu-L2-mbs2-flash", "gpt175b-1gpu-L1-mbs2-flash", "mixtral-1gpu-mbs2-flash",
               "gpt13b-1gpu-mbs4-L6-rcfull-flash"]
TRAININGS += [
    ("llama70b-1gpu-L2-mbs2-flash", L70B, 1, 1, 1, 1, 2, 8, "none", FLASH),
    ("gpt175b-1gpu-L1-mbs2-flash", "gpt3-175b@L1", 1, 1, 1, 1, 2, 4, "none", FLASH),
    ("mixtral-1gpu-mbs2-flash", MIX, 1, 1, 1, 1, 2, 4, "none", FLASH),
    ("gpt13b-1gpu-mbs4-L6-rcfull-flash", "gpt3-13b@L6", 1, 1, 1, 1, 4, 8, "full", FLASH),
]
ROUND46 = ["llama8b-1gpu-rcsel-flash", "llama8b-1gpu-mbs2-L8-flash", "gpt6.7b-1gpu-mbs4-rcsel-flash",
           "llama70b-1gpu-L1-s4096-flash", "gpt175b-1gpu-L1-s1024", *ROUND46_NEW, "gpt1.3b-1gpu-s256-flash"]

SMOKE: list[tuple] = [
    ("smoke-llama8b-pp2-distopt", "llama3-8b@L2,S2048", 1, 2, 1, 1, 1, 4, "full", ["--distributed-optimizer"]),
    ("smoke-mixtral-ep2-sp", "mixtral-8x7b@L2,S2048", 2, 1, 1, 1, 1, 2, "selective", ["--sequence-parallel"]),
]


def train_job(spec: tuple, out: Path, warmup: int, steps: int, convert: bool, timeout: float) -> Job:
    rid, model, tp, pp, dp, ep, mbs, gbs, rc, extra = spec
    args = [
        "train", "--model", model, "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--ep", str(ep),
        "--mbs", str(mbs), "--gbs", str(gbs), "--recompute", rc, "--warmup", str(warmup), "--steps", str(steps),
        "--profile-steps", "1", "--timeout", str(timeout), "-o", str(out / rid), *extra,
    ]
    if not convert:
        args += ["--no-convert", "--raw-plain"]
    return Job(rid, tp * pp * dp, args, est_s=35.0 if tp * pp * dp < 8 else 40.0, timeout_s=timeout)


def collectives_job(rid: str, gpus: int, out: Path, *flags: str, est_s: float, timeout_s: float) -> Job:
    """`calib measure collectives` on `gpus` GPUs into out/rid, with `flags`."""
    return Job(rid, gpus, ["collectives", "-o", str(out / rid), *flags], est_s=est_s, timeout_s=timeout_s)


def kernel_timed(timing: str = "kernel") -> tuple[str, ...]:
    """Each of 50 calls timed by its NCCL kernel under the CUDA profiler (measure/collectives.py): back to back
    ("kernel"), each alone ("kernel-isolated") or released together ("kernel-released")."""
    return ("--timing", timing, "--repeats", "50")


def timed_collectives(rid: str, gpus: int, out: Path, group_sizes: str, how: str, est_s: float = 90) -> Job:
    """The collectives by factors of 2 at `group_sizes`, each call timed by its NCCL kernel (`how` "kernel",
    50 calls) or as nccl-tests' loop of 20 back-to-back calls per event pair ("loop")."""
    timing = kernel_timed() if how == "kernel" else ("--iters", "20")
    return collectives_job(rid, gpus, out, "--factor", "2", "--group-sizes", group_sizes, *timing, est_s=est_s,
                           timeout_s=300)


def dense_collectives(rid: str, gpus: int, out: Path, group_sizes: str, align: int = 1, est_s: float = 120,
                      timing: str = "kernel", timeout_s: float = 300) -> Job:
    """The collectives at four sizes per doubling from 256 KiB to 1 GiB at `group_sizes`, rounded to multiples of
    `align` bytes, each call timed by its NCCL kernel (50 calls; `timing` "kernel-isolated": each alone)."""
    return collectives_job(rid, gpus, out, "--per-doubling", "4", "--align", str(align), "--min-bytes", str(2**18),
                           "--group-sizes", group_sizes, *kernel_timed(timing), est_s=est_s, timeout_s=timeout_s)


def released_collectives(rid: str, gpus: int, out: Path, group_sizes: str, late_us: float, *flags: str) -> Job:
    """The collectives by factors of 2 from 1 MiB to 1 GiB at `group_sizes`, 50 calls each, every call's members
    released together on the GPU and one member (the group's last unless `flags` say) `late_us` after
    (measure/collectives.py)."""
    return collectives_job(rid, gpus, out, "--factor", "2", "--min-bytes", str(2**20), "--group-sizes", group_sizes,
                           *kernel_timed("kernel-released"), "--late-us", f"{late_us:g}", *flags, est_s=120,
                           timeout_s=300)


def plan(out: Path, smoke: bool, convert: bool, warmup: int, steps: int, timeout: float, total_gpus: int = 8) -> list[Job]:
    jobs: list[Job] = []
    if smoke:
        jobs.append(collectives_job("collectives-smoke", 2, out, "--max-bytes", str(2**28), "--repeats", "10", est_s=30,
                                    timeout_s=120))
        jobs += [train_job(s, out, 2, 5, convert, timeout) for s in SMOKE]
        jobs.append(Job("kernels-smoke", 1, ["kernels", "--quick", "-o", str(out / "kernels-smoke")], est_s=30, timeout_s=120))
        return jobs
    by_id = {s[0]: s for s in TRAININGS}

    def t(rid: str) -> Job:
        return train_job(by_id[rid], out, warmup, ROUND5_STEPS.get(rid, steps), convert, timeout)

    # Order = priority: whatever the budget cuts is at the end. Runs of the whole host first, then
    # smaller runs side by side on disjoint GPUs, the kernel bench on one GPU beside them.
    two = [t(s[0]) for s in TRAININGS[12:20]]
    kernels = Job("kernels-h200", 1, ["kernels", "-o", str(out / "kernels-h200"), "--max-seconds", "120"], est_s=40, timeout_s=200)
    two = two[:2] + [kernels] + two[2:]
    if total_gpus >= 8:
        jobs.append(collectives_job("collectives-8gpu", 8, out, est_s=45, timeout_s=180))
        first8 = ["llama8b-tp2pp2dp2", "mixtral-ep8", "llama70b-tp4pp2-rcsel"]
        jobs += [t(r) for r in first8]
        jobs += [t(s[0]) for s in TRAININGS[5:12]]
        jobs += two
        jobs += [t("gpt13b-tp8-rcfull"), t("llama8b-dp8-distopt")]
    else:
        jobs.append(collectives_job("collectives-4gpu", 4, out, est_s=40, timeout_s=180))
        core4 = ["llama8b-tp2pp2", "mixtral-ep4", "llama70b-tp4-rcsel", "llama8b-tp4-mbs4", "llama8b-tp4-mbs4-notel",
                 "llama8b-pp4-rcfull"]
        jobs += [t(r) for r in core4]
        jobs += two
        jobs += [t(r) for r in ["gpt6.7b-tp2dp2-rcsel", "llama8b-tp2dp2-sp", "llama8b-pp2vpp2dp2", "gpt13b-tp4-rcfull",
                                "llama8b-dp4-distopt"]]
    jobs += [t(r) for r in ROUND3]
    jobs += [t(r) for r in ONE_GPU]
    jobs.append(timed_collectives("collectives-2gpu-loop", 2, out, "2", "loop"))
    jobs += [t(r) for r in ROUND5_STEPS]
    jobs += [t(r) for r in ROUND6]
    jobs += [t(r) for r in ROUND7]
    jobs += [t(r) for r in ROUND8]
    jobs.append(timed_collectives("collectives-2gpu-kernel", 2, out, "2", "kernel"))
    jobs += [t(r) for r in ROUND9[1:]]
    jobs += [t(r) for r in ROUND10[1:]]
    jobs += [t(r) for r in ROUND11]
    jobs += [t(r) for r in ROUND12]
    jobs += [t(r) for r in ROUND13]
    jobs += [t(r) for r in ROUND14]
    jobs += [t(r) for r in ROUND15]
    jobs += [t(r) for r in ROUND16]
    jobs += [t(r) for r in ROUND17]
    jobs += [t(r) for r in ROUND18 if r not in ROUND16 + ROUND17]
    jobs += [t(r) for r in ROUND19 if r not in ROUND17]
    planned = {j.id for j in jobs}
    jobs += [t(r) for r in ROUND20 if r not in planned and not r.startswith("collectives")]
    jobs += [t(r) for r in ROUND21B]
    jobs.append(timed_collectives("collectives-2gpu-kernel-r21", 2, out, "2", "kernel"))
    jobs.append(timed_collectives("collectives-2gpu-loop-r21", 2, out, "2", "loop"))
    jobs.append(timed_collectives("collectives-4gpu-kernel", 4, out, "2,4", "kernel", est_s=60))
    jobs.append(timed_collectives("collectives-4gpu-loop", 4, out, "4", "loop"))
    jobs += [t(r) for r in ROUND23 if not r.startswith("collectives")]
    jobs += [t(r) for r in ROUND23B_H100 if not r.startswith("collectives")]
    jobs += [t(r) for r in ROUND24_H100 if r not in ROUND19 + ROUND12]
    jobs += [t(r) for r in ROUND27]
    jobs += [t(r) for r in ROUND28]
    jobs += [t(r) for r in ROUND29]
    jobs += [t(r) for r in ROUND30]
    jobs += [t(r) for r in ROUND31]
    jobs += [t(r) for r in ROUND32]
    jobs += [t(r) for r in ROUND33]
    jobs += [t(r) for r in ROUND34]
    jobs += [t(r) for r in ROUND35]
    jobs += [t(r) for r in ROUND36]
    jobs += [t(r) for r in ROUND37]
    jobs += [dense_collectives(r, 2, out, "2") for r in ROUND39]
    jobs += [dense_collectives(r, 2, out, "2", align) for r, align in (ROUND39_ALIGNED | ROUND40).items()]
    jobs += [dense_collectives(r, 4, out, "4", 4096) for r in ROUND41_X4]
    jobs += [dense_collectives(r, 4, out, "2,4", 4096, est_s=200, timing=how, timeout_s=450)
             for r, how in ROUND42_X4.items()]
    jobs += [released_collectives(r, gpus, out, groups, late, *flags) for r, (gpus, groups, late, flags) in ROUND44.items()]
    jobs += [t(r) for r in ROUND46_NEW]
    for r, extra in ROUND45.items():
        quick = "--quick" in extra
        jobs.append(Job(r, 1, ["kernels", "--timing", "kernel", "-o", str(out / r), *extra], est_s=60 if quick else 480,
                        timeout_s=150 if quick else 560))
    return jobs


def _gpus(spec: tuple) -> str:
    return str(spec[2] * spec[3] * spec[4])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds after which no new job starts")
    ap.add_argument("--hard", type=float, default=0.0, help="seconds after which running jobs are killed (0: never)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated job ids to run (default: the whole plan)")
    ap.add_argument("--no-convert", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180.0, help="per training run")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan(out, a.smoke, not a.no_convert, a.warmup, a.steps, a.timeout, a.gpus)
    if a.only:
        keep = set(a.only.split(","))
        jobs = [j for j in jobs if j.id in keep]
    run_jobs(jobs, a.gpus, a.budget, out / "logs", hard_s=a.hard or None)
    write_summary(jobs, out / "campaign.json")


if __name__ == "__main__":
    main()
