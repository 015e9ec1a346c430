"""`calib project`: project a training configuration to a cluster (or sweep configurations)."""

from __future__ import annotations

from pathlib import Path

import typer

from calib.errors import CalibError
from calib.paths import check_output_folder
from calib.workload.parallel import ATTENTION


def register(app: typer.Typer) -> None:
    @app.command("project")
    def project_cmd(
        model: str = typer.Option(..., "--model", help="Model preset (gpt3-175b, llama3-70b, mixtral-8x7b, ...) or a YAML file."),
        gpus: int = typer.Option(..., "--gpus", help="GPU count: at most one node, or whole nodes."),
        seq: int = typer.Option(None, "--seq", help="Sequence length (default: the model's own, e.g. 8192 for llama3-70b)."),
        cluster: str = typer.Option("dgx-h200", "--cluster", help="Cluster preset in simconfigs/ (dgx-h200, dgx-h100, mi250, h200-8, ...) or a YAML file."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
        pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
        dp: int = typer.Option(0, "--dp", help="Data-parallel degree (default: GPUs / (TP x PP))."),
        ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (MoE; divides DP)."),
        vpp: int = typer.Option(1, "--vpp", help="Virtual pipeline chunks per rank (interleaved 1F1B when > 1)."),
        sp: bool = typer.Option(False, "--sp", help="Sequence parallelism (needs TP > 1)."),
        mbs: int = typer.Option(1, "--mbs", help="Micro-batch size."),
        gbs: int = typer.Option(..., "--gbs", help="Global batch size (sequences per step)."),
        attention: str = typer.Option("local", "--attention", help="Core attention: local (megatron-core's unfused, as most measured runs) or flash (torch's fused flash SDPA)."),
        recompute: str = typer.Option("none", "--recompute", help="Activation recomputation: none, selective or full."),
        overlap_grad_reduce: bool = typer.Option(False, "--overlap-grad-reduce", help="Overlap the DP gradient reduction with backward."),
        distributed_optimizer: bool = typer.Option(False, "--distributed-optimizer", help="Shard optimizer state over DP (reduce-scatter + all-gather)."),
        overlap_param_gather: bool = typer.Option(False, "--overlap-param-gather", help="Overlap the distributed optimizer's parameter all-gather with forward."),
        calibration: str = typer.Option(None, "--calibration", help="Calibration file (default: calib/data/calibration-<gpu>.yaml for the cluster's GPU); 'none' for an uncalibrated datasheet roofline."),
        allow_gpu_mismatch: bool = typer.Option(False, "--allow-gpu-mismatch", help="Use a calibration fitted on another GPU model (the report lists what was transferred)."),
        own_launch_us: float = typer.Option(None, "--own-launch-us", help="The host's pace as `calib measure` times it (microseconds per tiny launch, the bundle's own_launch_s): host costs scaled to it from the calibration's reference pace."),
        backend: str = typer.Option("analytical", "--backend", help="Simulator: analytical (embedded) or astrasim."),
        astra_sim_bin: str = typer.Option(None, "--astra-sim-bin", help="ASTRA-sim analytical binary (for --backend astrasim)."),
        emit_astra_sim: Path = typer.Option(None, "--emit-astra-sim", help="Also write per-rank ETs and ASTRA-sim inputs to this folder."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON instead of a table."),
        plot: Path = typer.Option(None, "--plot", help="Write the step-time breakdown to FILE.png or FILE.html."),
        do_sweep: bool = typer.Option(False, "--sweep", help="Enumerate valid TP/PP/DP/EP/micro-batch/recompute for --gpus and rank them."),
        sweep_max: int = typer.Option(200, "--sweep-max", help="Simulate at most this many in-memory configurations in a sweep."),
        top: int = typer.Option(15, "--top", help="Rows of the sweep table."),
    ) -> None:
        """Step time, tokens/s, TFLOP/s and MFU, time breakdown, memory, energy and error band of one
        training configuration on a cluster, from the calibration fitted on measured runs.

        Example: calib project --model gpt3-175b --gpus 8192 --tp 8 --pp 16 --mbs 1 --gbs 1536 --cluster dgx-h200
        """
        from calib.cluster import load_cluster
        from calib.project import project
        from calib.report import plot_projection, print_projection, to_json_text
        from calib.workload.models import resolve_model
        from calib.workload.parallel import ParallelConfig

        if do_sweep and (sweep_max < 1 or top < 1):
            raise CalibError(f"--sweep-max and --top must be at least 1, got {sweep_max} and {top}")
        if emit_astra_sim is not None:
            check_output_folder(emit_astra_sim, "--emit-astra-sim")
        if attention not in ATTENTION:
            raise CalibError(f"--attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
        if own_launch_us is not None and not (own_launch_us > 0 and own_launch_us < float("inf")):
            raise CalibError(f"--own-launch-us must be a positive number of microseconds, got {own_launch_us}")
        if seq is not None and seq < 1:
            raise CalibError(f"--seq must be a positive sequence length, got {seq}")
        spec = resolve_model(model, seq_length=seq)
        preset = load_cluster(cluster)
        preset.check_gpus(gpus)
        if tp < 1 or pp < 1:
            raise CalibError(f"--tp and --pp must be positive, got {tp} and {pp}")
        if dp == 0:
            if gpus % (tp * pp):
                raise CalibError(f"GPUs ({gpus}) is not a multiple of TP x PP = {tp} x {pp} = {tp * pp}")
            dp = gpus // (tp * pp)
        par = ParallelConfig(
            tp=tp, pp=pp, dp=dp, ep=ep, vpp=vpp, sequence_parallel=sp, micro_batch=mbs, global_batch=gbs,
            recompute=recompute, overlap_grad_reduce=overlap_grad_reduce, distributed_optimizer=distributed_optimizer,
            overlap_param_gather=overlap_param_gather, attention=attention,
        )
        if not do_sweep:
            par.check(spec, gpus)
        cal = load_calibration_for(calibration, preset.gpu)
        if do_sweep:
            _run_sweep(spec, gpus, par, preset, cal, allow_gpu_mismatch, sweep_max, top, json_out)
            return
        result = project(spec, par, preset, cal, backend=backend, astra_sim_bin=astra_sim_bin,
                         allow_gpu_mismatch=allow_gpu_mismatch, emit_astra_sim=emit_astra_sim,
                         own_launch_s=None if own_launch_us is None else own_launch_us * 1e-6)
        if plot is not None:
            plot_projection(result, plot)
        if json_out:
            typer.echo(to_json_text(result))
        else:
            print_projection(result)


def load_calibration_for(path: str | None, gpu: str) -> object | None:
    """The calibration to use: a path, 'none' (uncalibrated), or the bundled one for `gpu`."""
    from calib.calibration import Calibration
    from calib.project import default_calibration_path

    if path is not None and path.lower() == "none":
        return None
    if path is None:
        default = default_calibration_path(gpu)
        if not default.is_file():
            others = sorted(str(p) for p in default.parent.glob("calibration-*.yaml"))
            hint = f"; bundled for other GPUs: {', '.join(others)} (with --allow-gpu-mismatch)" if others else ""
            raise CalibError(
                f"no bundled calibration for {gpu} ({default}); pass --calibration FILE (from calib fit), "
                f"or --calibration none for an uncalibrated datasheet estimate{hint}"
            )
        return Calibration.load(default)
    return Calibration.load(path)


def _run_sweep(spec, gpus, par, preset, cal, allow, sweep_max, top, json_out) -> None:  # noqa: ANN001
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from calib.project import check_calibration_gpu
    from calib.sweep import sweep

    check_calibration_gpu(cal, preset, allow)
    console = Console(stderr=json_out)
    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=json_out) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        ranked, oom, notes = sweep(spec, gpus, par, preset, cal, allow, max_configs=sweep_max, progress=progress)
    if json_out:
        typer.echo(json.dumps({"ranked": [r.to_json() for r in ranked], "out_of_memory": [r.to_json() for r in oom],
                               "notes": notes}, indent=2))
        return
    t = Table(title=f"{spec.name} on {gpus} x {preset.gpu} ({preset.name}), global batch {par.global_batch}: best by step time")
    cols = ["#", "TP", "PP", "DP"] + (["EP"] if spec.is_moe else []) + ["SP", "mbs", "recompute", "step s", "Mtok/s",
                                                                       "MFU %", "MJ/step", "GiB/GPU"]
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    for i, r in enumerate(ranked[:top], 1):
        p = r.par
        cells = [str(i), str(p.tp), str(p.pp), str(p.dp)] + ([str(p.ep)] if spec.is_moe else [])
        cells += ["y" if p.sequence_parallel else "-", str(p.micro_batch), p.recompute, f"{r.step_time_s:.3f}",
                  f"{r.tokens_per_s / 1e6:.2f}", f"{100 * r.mfu:.1f}",
                  "n/a" if r.energy_j_per_step is None else f"{r.energy_j_per_step / 1e6:.2f}",
                  f"{r.memory_gib:.1f}" + ("!" if r.memory_verdict == "tight" else "")]
        t.add_row(*cells)
    console.print(t)
    if any(r.memory_verdict == "tight" for r in ranked[:top]):
        console.print("[dim]GiB/GPU: torch's allocated bytes; ! = tight: with the allocator's reserve and the "
                      "memory outside it the device may not hold it[/dim]")
    for n in notes:
        console.print(f"[dim]note: {n}[/dim]")
