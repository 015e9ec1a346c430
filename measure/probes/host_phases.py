"""Where a training step's host time goes: wall time per phase and module, launches per phase.

    PYTHONPATH=.:/tmp/site python3 -m measure.probes.host_phases --out /tmp/phases [--only NAME,...]

One or two GPUs, megatron-core as `calib measure` builds it (measure.mcore), mostly at short sequences
so that the GPU waits for the host and the host's own pace shows. Per configuration, in a child
process per GPU (rank 0 writes the result):
- plain steps (nothing added) give the step time the phases must add up to;
- timed steps: host timestamps (perf_counter_ns, no device syncs) at the start and end of the step,
  its gradient zeroing, every micro-batch's forward and backward (megatron-core's schedule
  functions), each layer's submodules, the MoE layer's stages (route, preprocess, dispatch, experts,
  combine, postprocess), finalize_model_grads and the optimizer's stages; the plain and timed steps'
  difference is the timestamps' own cost;
- GPU-stamped steps: the same spans, each also recording a CUDA event on the current stream where it opens
  and closes, so that the GPU's time at every span boundary is known without a profiler: a span's GPU
  interval less the GPU time of the kernels launched in it (the profiled step's) is what the GPU idled
  there, in a step the profiler did not slow;
- one profiled step with the same spans as profiler ranges: the CUDA launches (runtime calls that
  enqueue device work) and the GPU time of their kernels inside each span.
Host time per launch by phase is then one span's time over its launches (benchmarks/host_phases.py
reads the JSON this writes). Why: the calibration's one launch cost per host size fits dense runs
and MoE runs about 1.5x apart (docs/host.md), and a per-step cost or a per-code-path cost would
explain that; only the host's own timestamps can tell them apart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib.workload.parallel import ParallelConfig
from measure.env import host_cpu
from measure.probes.ranks import build_rank, probe_main


@dataclass(frozen=True)
class Probe:
    """One probed configuration: a model and how it is split (ParallelConfig's fields)."""

    name: str
    model: str
    micro_batch: int
    global_batch: int
    recompute: str = "none"
    tp: int = 1
    dp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    pp: int = 1

    def par(self) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, sequence_parallel=self.sequence_parallel,
                              micro_batch=self.micro_batch, global_batch=self.global_batch, recompute=self.recompute)


# One GPU: pairs at 4 and 1 micro-batches tell a per-step host cost from a per-launch one; dense against
# MoE at the same micro-batches tells a per-code-path cost. Two GPUs: the committed two-GPU runs at
# sequence 256 (traces/h200), where expert parallelism's all-to-all path needs more host time per
# launch than the calibration gives it, beside its tensor-parallel and data-parallel neighbours.
CONFIGS: list[Probe] = [
    Probe("llama8b-s256-mb4", "llama3-8b@L4,S256", 2, 8),
    Probe("llama8b-s256-mb1", "llama3-8b@L4,S256", 2, 2),
    Probe("mixtral-s256-mb4", "mixtral-8x7b@L2,S256", 1, 4),
    Probe("mixtral-s256-mb1", "mixtral-8x7b@L2,S256", 2, 2),
    Probe("gpt6.7b-s256-mb4", "gpt3-6.7b@L4,S256", 2, 8),
    Probe("llama8b-s2048-mb4", "llama3-8b@L4,S2048", 2, 8),
    Probe("mixtral-L1-s256-mb4", "mixtral-8x7b@L1,S256", 1, 4),
    Probe("mixtral-s2048-mb4", "mixtral-8x7b@L2,S2048", 1, 4),
    Probe("llama8b-s256-mb4-rcsel", "llama3-8b@L4,S256", 2, 8, "selective"),
    Probe("llama8b-s256-mb4-rcfull", "llama3-8b@L4,S256", 2, 8, "full"),
    Probe("2gpu-mixtral-ep2-s256", "mixtral-8x7b@L2,S256", 2, 4, dp=2, ep=2),
    Probe("2gpu-mixtral-ep2-s256-mb4", "mixtral-8x7b@L2,S256", 1, 8, dp=2, ep=2),
    Probe("2gpu-mixtral-tp2-sp-s256", "mixtral-8x7b@L2,S256", 1, 4, tp=2, sequence_parallel=True),
    Probe("2gpu-llama8b-tp2-s256", "llama3-8b@L4,S256", 1, 8, tp=2),
    Probe("2gpu-llama8b-dp2-s256", "llama3-8b@L4,S256", 2, 8, dp=2),
    Probe("2gpu-mixtral-ep2-mbs2", "mixtral-8x7b@L2,S2048", 2, 4, dp=2, ep=2),
    # MoE without EP or TP, pipeline, sequence parallel and biased layers on two GPUs
    Probe("2gpu-mixtral-dp2-s256", "mixtral-8x7b@L2,S256", 1, 8, dp=2),
    Probe("2gpu-llama8b-pp2-s256", "llama3-8b@L4,S256", 1, 8, pp=2),
    Probe("2gpu-llama8b-tp2-sp-s256", "llama3-8b@L4,S256", 1, 8, tp=2, sequence_parallel=True),
    Probe("2gpu-gpt6.7b-tp2-s256", "gpt3-6.7b@L4,S256", 2, 8, tp=2),
    # the committed two-GPU runs at sequence 2048 that the calibration under-predicts (not run yet: no
    # two-GPU machine was lent again in the fifteenth session)
    Probe("2gpu-llama8b-tp2", "llama3-8b@L4,S2048", 1, 8, tp=2),
    Probe("2gpu-gpt13b-tp2", "gpt3-13b@L4", 1, 8, tp=2),
    Probe("2gpu-mixtral-ep2-rcfull", "mixtral-8x7b@L2,S2048", 1, 4, "full", dp=2, ep=2),
    # the committed one-GPU runs at sequence 256 that the calibration under-predicts most
    # (gpt1.3b-1gpu-s256, mixtral-1gpu-s256), beside llama8b-s256-mb4 (= llama8b-1gpu-s256) on one lease
    Probe("gpt1.3b-s256-mb4", "gpt3-1.3b@L8,S256", 4, 16),
    Probe("mixtral-s256-mb2", "mixtral-8x7b@L2,S256", 2, 4),
    # the one-GPU Mixtral depth series at sequence 2048 (traces/h200 mixtral-1gpu-L1, mixtral-1gpu, mixtral-1gpu-L3),
    # whose GPU idles 21-72 ms a step: where, phase by phase (docs/host.md, "Where the one-GPU MoE steps idle")
    Probe("mixtral-L1-s2048-mb4", "mixtral-8x7b@L1,S2048", 1, 4),
    Probe("mixtral-L3-s2048-mb4", "mixtral-8x7b@L3,S2048", 1, 4),
]
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync")
MOE_STAGES = ("route", "preprocess", "dispatch", "routed_experts_compute", "combine", "postprocess",
              "shared_experts_compute")
OPT_STAGES = ("prepare_grads", "get_grad_norm", "clip_grad_norm", "step_with_ready_grads")
LAYER_PARTS = ("input_layernorm", "self_attention", "pre_mlp_layernorm", "mlp")


@dataclass
class Spans:
    """Nested host spans of the steps being timed, and the profiler ranges when profiling."""

    on: bool = False
    profiling: bool = False
    gpu: bool = False  # record a CUDA event where each span opens and closes
    rows: list[tuple[str, int, int, int]] = field(default_factory=list)  # (label, step, start_ns, end_ns)
    events: list[tuple[Any, Any]] = field(default_factory=list)  # with `gpu`: per row, its (open, close) events
    step: int = 0

    @contextlib.contextmanager
    def span(self, label: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        opened = self._open(label)
        try:
            yield
        finally:
            self._close(label, *opened)

    def _open(self, label: str) -> tuple[int, Any, Any]:
        return time.perf_counter_ns(), _range(label) if self.profiling else None, _event() if self.gpu else None

    def _close(self, label: str, start: int, rng: Any, opened: Any) -> None:
        self.rows.append((label, self.step, start, time.perf_counter_ns()))
        if opened is not None:
            self.events.append((opened, _event()))
        if rng is not None:
            rng.__exit__(None, None, None)

    def wrap(self, fn: Callable, label: str) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.span(label):
                return fn(*args, **kwargs)

        return timed

    def hook(self, module: Any, label: str) -> None:
        open_: list[tuple[int, Any, Any]] = []

        def pre(*_: Any) -> None:
            if self.on:
                open_.append(self._open(label))

        def post(*_: Any) -> None:
            if self.on and open_:
                self._close(label, *open_.pop())

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def _event() -> Any:
    """A CUDA event recorded now on the current stream (its time is when the GPU gets there)."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _range(label: str) -> Any:
    import torch

    rng = torch.autograd.profiler.record_function(label)
    rng.__enter__()
    return rng


def instrument(training: Any, spans: Spans) -> Callable[[], None]:
    """Put the spans into the built training (its modules, schedule and optimizer); return its step."""
    import megatron.core.pipeline_parallel.schedules as schedules

    schedules.forward_step = spans.wrap(schedules.forward_step, "forward")
    schedules.backward_step = spans.wrap(schedules.backward_step, "backward")
    cfg = training.config
    cfg.finalize_model_grads_func = spans.wrap(cfg.finalize_model_grads_func, "finalize_grads")
    for chunk in training.chunks:
        for name, module in chunk.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("embedding", "final_layernorm", "output_layer"):
                spans.hook(module, leaf)
            elif name.count(".layers.") == 1 and leaf in LAYER_PARTS:
                spans.hook(module, ("moe" if hasattr(module, "token_dispatcher") else leaf))
            if hasattr(module, "token_dispatcher"):
                for stage in MOE_STAGES:
                    if hasattr(module, stage):
                        setattr(module, stage, spans.wrap(getattr(module, stage), f"moe.{stage}"))
    opts = [training.optimizer, *getattr(training.optimizer, "chained_optimizers", [])]
    for opt in opts:
        for stage in OPT_STAGES:
            if hasattr(opt, stage):
                setattr(opt, stage, spans.wrap(getattr(opt, stage), f"optimizer.{stage}"))
    inner = training.parts

    def step() -> None:
        with spans.span("step"):
            with spans.span("zero_grads"):
                inner.zero()
            inner.forward_backward()
            with spans.span("optimizer"):
                inner.optimizer_step()

    return step


def run_one(probe: Probe, args: argparse.Namespace) -> dict | None:
    """Run `probe` as this process's rank; rank 0's result (None on the others)."""
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    training = build_rank(probe.model, probe.par())
    spans = Spans()
    step = instrument(training, spans)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()

    def timed(n: int) -> list[float]:
        times = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter_ns()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter_ns() - t) / 1e9)
            spans.step += 1
        return times

    plain = timed(args.steps)
    spans.on = True
    first = spans.step
    with_spans = timed(args.steps)
    rows = [r for r in spans.rows if r[1] >= first]
    spans.rows.clear()
    spans.gpu = True
    stamped, gpu_rows = gpu_stamped(spans, step, args.steps)
    spans.gpu = False

    from torch.profiler import ProfilerActivity, profile

    spans.profiling = True
    trace = Path(args.out) / f"{probe.name}.trace.{rank}.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiled = timed(1)
    prof.export_chrome_trace(str(trace))
    if rank != 0:
        trace.unlink()
        return None
    kineto = json.loads(trace.read_text())
    trace.unlink()
    return {
        "name": probe.name, "model": probe.model, "par": probe.par().to_dict(), "gpus": dist.get_world_size(),
        "micro_batch": probe.micro_batch, "global_batch": probe.global_batch, "recompute": probe.recompute,
        "microbatches": training.info["microbatches"], "plain_step_s": plain, "spans_step_s": with_spans,
        "profiled_step_s": profiled, "spans": [list(r) for r in rows], "profiled_spans": launches_per_span(kineto),
        "gpu_stamped_step_s": stamped, "gpu_spans": gpu_rows,
        "device_busy": device_busy(kineto), "gpu": torch.cuda.get_device_name(local), "host_cpu": host_cpu(),
    }


def gpu_stamped(spans: Spans, step: Callable[[], None], n: int) -> tuple[list[float], list[list]]:
    """`n` steps with every span's GPU time at its ends: the step times, and per span [label, step, host start
    and end (ns since the step's start), GPU start and end (us since the step's start)]. Each step starts on a
    drained GPU with an event recorded just before it, so the host's and the GPU's clocks start together."""
    import torch

    times: list[float] = []
    out: list[list] = []
    for _ in range(n):
        spans.rows.clear()
        spans.events.clear()
        torch.cuda.synchronize()
        ref = _event()
        t = time.perf_counter_ns()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - t) / 1e9)
        for (label, k, a, b), (ea, eb) in zip(spans.rows, spans.events, strict=True):
            out.append([label, k, a - t, b - t, ref.elapsed_time(ea) * 1e3, ref.elapsed_time(eb) * 1e3])
        spans.step += 1
    spans.rows.clear()
    spans.events.clear()
    return times, out


def launches_per_span(trace: dict) -> list[dict]:
    """Each profiler range of the profiled step with the launches made inside it (nested ranges
    keep their own: a launch counts in the innermost range holding it) and their kernels' GPU time.
    Runtime and driver calls alike (calib.convert.kineto): cuBLAS's GEMMs and NCCL's kernels are
    launched through the driver (cuLaunchKernelEx), which a count of runtime calls alone misses."""
    from calib.convert.kineto import parse_kineto

    kt = parse_kineto(trace, Path("profiled step"))
    ranges = sorted((s for spans in kt.cpu_spans.values() for s in spans if s[2].get("cat") == "user_annotation"),
                    key=lambda s: (s[0], s[0] - s[1]))
    gpu_by_corr: dict[int, int] = {}
    for a in kt.gpu:
        if a.correlation is not None:
            gpu_by_corr[int(a.correlation)] = gpu_by_corr.get(int(a.correlation), 0) + a.dur_ns
    out = [{"label": str(e.get("name", "")), "start_us": e["ts"], "dur_us": e["dur"], "launches": 0, "gpu_us": 0.0,
            "runtime_us": {}} for _, _, e in ranges]
    for c in kt.calls:
        best = None
        for i, (start, end, _) in enumerate(ranges):
            if start <= c.ts_ns <= end and (best is None or end - start <= ranges[best][1] - ranges[best][0]):
                best = i
        if best is None:
            continue
        spent = out[best]["runtime_us"]
        spent[c.name] = spent.get(c.name, 0.0) + c.dur_ns / 1e3
        if c.name in LAUNCH_CALLS:
            out[best]["launches"] += 1
            out[best]["gpu_us"] += gpu_by_corr.get(int(c.correlation), 0) / 1e3 if c.correlation is not None else 0.0
    return out


def device_busy(trace: dict) -> list[list[float]]:
    """The GPU's kernels and copies in the profiled step as [start_us, dur_us], in start order."""
    cats = ("kernel", "gpu_memcpy", "gpu_memset")
    events = trace.get("traceEvents", [])
    return sorted([float(e["ts"]), float(e["dur"])] for e in events if e.get("ph") == "X" and e.get("cat") in cats)


def main(argv: list[str] | None = None) -> int:
    return probe_main("measure.probes.host_phases", __doc__.splitlines()[0], CONFIGS, run_one,
                      lambda probe, result: f"{probe.name}.json", 29531, argv)


if __name__ == "__main__":
    sys.exit(main())
