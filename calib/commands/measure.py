"""`calib measure`: real trainings and microbenchmarks on the local GPUs -> measurement bundles.

Thin wrappers: the logic lives in the `measure` package (installed with `pip install -e .[measure]`),
imported only when a sub-command runs.
"""

from __future__ import annotations

from pathlib import Path

import typer

from calib.errors import CalibError

measure_app = typer.Typer(
    help="Measure trainings (megatron-core under torchrun) and collective/kernel microbenchmarks into bundles.",
    no_args_is_help=True,
)


def _summary(path: Path) -> None:
    import json

    m = json.loads((path / "manifest.json").read_text())
    if m["status"] != "complete":
        # The run started and failed (OOM, a GPU lost mid-run, a timeout): the bundle is kept, marked
        # failed with the reason, and the command fails like any bad input, in one line.
        raise CalibError(f"run failed: {m['failure'] or 'no reason recorded'} (bundle {path} is marked failed)")
    print(f"{m['status']}: {path}")


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CalibError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise CalibError(f"{option} must be positive integers, got {text!r}")
    return values


@measure_app.command("train")
def train(
    model: str = typer.Option(..., "--model", help="preset, scaled preset (llama3-8b@L4,S2048) or YAML file"),
    out: Path = typer.Option(..., "-o", "--out", help="bundle folder to write"),
    tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"), dp: int = typer.Option(1, "--dp"),
    ep: int = typer.Option(1, "--ep"), vpp: int = typer.Option(1, "--vpp", help="virtual pipeline stages per rank"),
    mbs: int = typer.Option(1, "--mbs", help="micro-batch size"), gbs: int = typer.Option(8, "--gbs", help="global batch size"),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    attention: str = typer.Option("local", "--attention", help="local (megatron-core's unfused attention) | flash (torch SDPA flash kernels)"),
    seq: int = typer.Option(0, "--seq", help="sequence length (0: the model's; shortening renames the model @S...)"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel"),
    overlap_grad_reduce: bool = typer.Option(False, "--overlap-grad-reduce"),
    overlap_param_gather: bool = typer.Option(False, "--overlap-param-gather"),
    distributed_optimizer: bool = typer.Option(False, "--distributed-optimizer"),
    warmup: int = typer.Option(5, "--warmup"), steps: int = typer.Option(20, "--steps"),
    profile_steps: int = typer.Option(1, "--profile-steps"),
    no_telemetry: bool = typer.Option(False, "--no-telemetry", help="no GPU telemetry and no host-pace sampler"),
    no_host_pace: bool = typer.Option(False, "--no-host-pace", help="no second process sampling the host's pace"),
    no_own_pace: bool = typer.Option(False, "--no-own-pace", help="no timing of the trainer's own pace after each step"),
    telemetry_hz: float = typer.Option(50.0, "--telemetry-hz"),
    telemetry_backend: str = typer.Option("auto", "--telemetry-backend", help="auto | nvml | amdsmi"),
    keep_raw: bool = typer.Option(False, "--keep-raw", help="keep the raw PyTorch/Kineto traces (gzipped) in raw/"),
    no_convert: bool = typer.Option(False, "--no-convert", help="skip ET conversion now; keep raw traces for `calib measure convert`"),
    raw_plain: bool = typer.Option(False, "--raw-plain", help="keep raw traces as plain JSON (compress the transfer as a whole)"),
    device: str = typer.Option("cuda", "--device", help="cuda (megatron-core + NCCL) or cpu (gloo, small torch model)"),
    master_port: int = typer.Option(29500, "--master-port"),
    timeout: float = typer.Option(1800.0, "--timeout", help="seconds before the run is killed (a failed bundle)"),
    overwrite: bool = typer.Option(False, "--overwrite"),
) -> None:
    """Run one training measurement and write a training bundle (complete or failed with the reason)."""
    from calib.workload.models import resolve_model
    from calib.workload.parallel import ParallelConfig
    from measure.request import TrainRequest
    from measure.train import measure_training

    name = model
    if seq:
        name = resolve_model(model, seq_length=seq).name
    par = ParallelConfig(
        tp=tp, pp=pp, dp=dp, ep=ep, vpp=vpp, sequence_parallel=sequence_parallel, micro_batch=mbs,
        global_batch=gbs, recompute=recompute, overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather, distributed_optimizer=distributed_optimizer,
        attention=attention,
    )
    req = TrainRequest(
        model=name, par=par, warmup=warmup, steps=steps, profile_steps=profile_steps, device=device,
        telemetry=not no_telemetry and device == "cuda", telemetry_hz=telemetry_hz, keep_raw=keep_raw,
        host_pace=not (no_telemetry or no_host_pace),
        own_pace=not (no_telemetry or no_own_pace),
        master_port=master_port, timeout_s=timeout,
    )
    _summary(measure_training(req, out, overwrite=overwrite, telemetry_backend=telemetry_backend,
                              convert=not no_convert, raw_gzip=not raw_plain))


@measure_app.command("collectives")
def collectives(
    out: Path = typer.Option(..., "-o", "--out"),
    gpus: int = typer.Option(0, "--gpus", help="ranks (0: every visible GPU)"),
    kinds: str = typer.Option("all_reduce,all_gather,reduce_scatter,all_to_all,send_recv", "--kinds"),
    min_bytes: int = typer.Option(2**10, "--min-bytes"), max_bytes: int = typer.Option(2**30, "--max-bytes"),
    factor: int = typer.Option(4, "--factor", help="size step"),
    per_doubling: int = typer.Option(0, "--per-doubling", help="sizes per doubling instead of --factor (0: by --factor)"),
    align: int = typer.Option(1, "--align", help="with --per-doubling, round sizes to a multiple of this many bytes"),
    group_sizes: str = typer.Option("2,4,8", "--group-sizes"),
    warmup: int = typer.Option(5, "--warmup"), repeats: int = typer.Option(20, "--repeats"),
    iters: int = typer.Option(1, "--iters", help="back-to-back collectives per timed window (1: one call on an idle GPU, launch floor included, as the committed calibration data; 20: nccl-tests' way)"),
    timing: str = typer.Option("events", "--timing", help="events: CUDA events around each timed window; kernel: each call's NCCL kernel from the CUDA profiler, the time the simulator consumes (no launch floor), calls back to back; kernel-isolated: the same, each call alone on an idle GPU, its transfer split as a training step's; kernel-released: each call's members released together on the GPU, the last one --late-us after (not fitted yet)"),
    late_us: float = typer.Option(0.0, "--late-us", help="with --timing kernel-released: the late member's delay (us) after the others"),
    late_member: int = typer.Option(-1, "--late-member", help="with --timing kernel-released: which member of each group is late (-1: the last, a send/recv's receiver; 0: the first, its sender)"),
    device: str = typer.Option("cuda", "--device"), master_port: int = typer.Option(29700, "--master-port"),
    overwrite: bool = typer.Option(False, "--overwrite"),
) -> None:
    """Collective microbenchmarks (nccl-tests algbw/busbw conventions, medians) -> a collectives bundle."""
    from measure.collectives import default_sizes, measure_collectives
    from measure.env import visible_gpus

    n = gpus or len(visible_gpus())
    sizes = default_sizes(min_bytes, max_bytes, factor, per_doubling, align)
    gs = _int_list(group_sizes, "--group-sizes")
    _summary(measure_collectives(out, n, device, sizes, [k.strip() for k in kinds.split(",") if k.strip()], gs,
                                 warmup, repeats, master_port, overwrite=overwrite, iters=iters, timing=timing,
                                 late_us=late_us, late_member=late_member))


@measure_app.command("kernels")
def kernels(
    out: Path = typer.Option(..., "-o", "--out"),
    quick: bool = typer.Option(False, "--quick", help="a small subset (llama3-8b, TP 1/2)"),
    warmup: int = typer.Option(3, "--warmup"), repeats: int = typer.Option(10, "--repeats"),
    max_seconds: float = typer.Option(0.0, "--max-seconds", help="stop starting new shapes after this long (0: no limit)"),
    overwrite: bool = typer.Option(False, "--overwrite"),
    timing: str = typer.Option("kernel", "--timing", help="kernel (each kernel's GPU time from a converted profile, as "
                               "training steps) | events (CUDA events around each call, the first bundles')"),
) -> None:
    """GEMM/attention/memory kernel microbenchmarks over the presets' shapes -> a kernels bundle."""
    from measure.kernels import measure_kernels

    _summary(measure_kernels(out, quick, warmup, repeats, max_seconds or None, overwrite=overwrite, timing=timing))


@measure_app.command("convert")
def convert(
    bundle: Path = typer.Argument(..., help="training bundle with raw/ traces"),
    drop_raw: bool = typer.Option(False, "--drop-raw", help="delete raw/ once the ETs are written"),
) -> None:
    """Convert a bundle's kept raw traces into et/, kernels.parquet and collectives.parquet."""
    from measure.reconvert import reconvert

    print(reconvert(bundle, drop_raw))


def register(app: typer.Typer) -> None:
    app.add_typer(measure_app, name="measure")


__all__ = ["register", "CalibError"]
