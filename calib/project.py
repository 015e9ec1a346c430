"""`calib project`: one training configuration on a cluster -> step time, throughput, breakdown,
memory, energy and an error band, every input labelled calibrated or configured.

Flow: check the configuration against the cluster -> generate the step (calib.workload.generate,
compute times from the calibration's kernel model) -> network and system from the cluster preset
with the calibration's fitted parameters where it has them -> simulate (embedded or ASTRA-sim) ->
breakdown, memory (calib.workload.memory), FLOPs (calib.workload.flops), energy (the
calibration's power model) and the error band (the calibration's `validation` section).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from calib.cluster import ClusterPreset
from calib.errors import CalibError
from calib.models.clock import ClockModel, clock_of, throttled
from calib.models.host import own_pace_factor
from calib.models.memory import MemoryModel, device_memory
from calib.sim import BACKENDS, simulate
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.types import SimResult
from calib.stack import flash_runs
from calib.units import GIB
from calib.workload import memory as memory_model
from calib.workload.generate import GeneratedStep, KernelTime, generate
from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig

DATA = Path(__file__).resolve().parent / "data"
COMM_CATEGORIES = ("tp", "pp", "dp", "ep")


def gpu_key(name: str) -> str:
    """The GPU model in a name, vendor and form factor dropped: "NVIDIA H200 SXM" -> "h200"."""
    s = name.lower()
    for word in ("nvidia", "amd", "instinct", "tesla"):
        s = s.replace(word, " ")
    m = re.search(r"[a-z]+\d+[a-z]*", s)
    return m.group(0) if m else s.strip()


def default_calibration_path(gpu: str) -> Path:
    return DATA / f"calibration-{gpu_key(gpu)}.yaml"


def roofline_kernel_time(cluster: ClusterPreset) -> KernelTime:
    """Uncalibrated compute time: the roofline at the preset's datasheet peaks (an optimistic bound)."""
    peak, bw = cluster.peak_flops_per_s, cluster.hbm_bytes_per_s

    def predict(df: pd.DataFrame) -> np.ndarray:
        flops = df["flops"].to_numpy(dtype=float)
        nbytes = df["bytes"].to_numpy(dtype=float)
        return np.maximum(flops / peak, nbytes / bw)

    return predict


def calibrated_memory(calibration: object | None) -> MemoryModel | None:
    """The calibration's memory model; None without a calibration or in files from before it."""
    get = getattr(calibration, "memory_model", None)
    return get() if callable(get) else None


def memory_capacity(cluster: ClusterPreset, memory: MemoryModel | None, mismatch: bool) -> tuple[float, bool]:
    """The GPU's memory in bytes, and whether it was measured: the calibration's device total where it
    was fitted on this GPU model, else the cluster preset's datasheet figure."""
    if memory is not None and memory.capacity_bytes > 0 and not mismatch:
        return memory.capacity_bytes, True
    return cluster.hbm_bytes, False


@dataclass
class ProjectionResult:
    """What `calib project` reports; units in the key names (SI; memory in GiB as the issue names it)."""

    inputs: dict
    calibration_id: str | None
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown_s: dict[str, float]
    memory_gib_per_gpu: float
    memory_detail_gib: dict[str, float]
    fits_in_memory: bool
    memory_verdict: str  # calib.models.memory.VERDICTS: fits | tight | out of memory
    energy_j_per_step: float | None
    avg_power_w: float | None
    peak_power_w: float | None
    error_band: dict
    calibrated: list[str]
    configured: list[str]
    transferred: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sim: dict = field(default_factory=dict)
    host_share: float | None = None  # the share of the step the host exposes (`host_share`), which the band follows

    def to_json(self) -> dict:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "breakdown_s": dict(self.breakdown_s),
            "host_share": self.host_share,
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "memory_detail_gib": dict(self.memory_detail_gib),
            "fits_in_memory": self.fits_in_memory,
            "memory_verdict": self.memory_verdict,
            "energy_j_per_step": self.energy_j_per_step,
            "avg_power_w": self.avg_power_w,
            "peak_power_w": self.peak_power_w,
            "error_band": dict(self.error_band),
            "calibrated": list(self.calibrated),
            "configured": list(self.configured),
            "transferred": list(self.transferred),
            "notes": list(self.notes),
            "calibration_id": self.calibration_id,
            "inputs": dict(self.inputs),
            "sim": dict(self.sim),
        }


def check_calibration_gpu(calibration: object | None, cluster: ClusterPreset, allow_gpu_mismatch: bool) -> bool:
    """True when the calibration comes from another GPU model (allowed only with the override)."""
    if calibration is None:
        return False
    if gpu_key(str(getattr(calibration, "gpu", ""))) == gpu_key(cluster.gpu):
        return False
    if not allow_gpu_mismatch:
        src = getattr(calibration, "source", "") or "the calibration"
        raise CalibError(
            f"{src} was fitted on {getattr(calibration, 'gpu', '?')} but cluster {cluster.name} has {cluster.gpu} GPUs; "
            "pass --allow-gpu-mismatch to transfer its parameters anyway"
        )
    return True


def project(
    model: ModelSpec,
    par: ParallelConfig,
    cluster: ClusterPreset,
    calibration: object | None,
    backend: str = "analytical",
    astra_sim_bin: str | None = None,
    allow_gpu_mismatch: bool = False,
    emit_astra_sim: str | Path | None = None,
    own_launch_s: float | None = None,
) -> ProjectionResult:
    """Project one configuration (module docstring). `calibration` is a calib.calibration.Calibration,
    or None for an explicitly uncalibrated run (datasheet roofline, no power model, no error band).
    `own_launch_s`: the host's pace as `calib measure` times it (seconds per tiny launch in the trainer's
    thread, measure/own_pace.py); the host costs are scaled to it from the calibration's reference pace.
    None: the reference pace."""
    t0 = time.perf_counter()
    if backend not in BACKENDS:
        raise CalibError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    gpus = par.gpus
    cluster.check_gpus(gpus)
    par.check(model, gpus)
    mismatch = check_calibration_gpu(calibration, cluster, allow_gpu_mismatch)
    calibrated: list[str] = []
    configured: list[str] = []
    transferred: list[str] = []
    notes: list[str] = []

    # Compute times.
    if calibration is not None and getattr(calibration, "kernel", None):
        km = calibration.kernel_model()  # type: ignore[attr-defined]
        kernel_time: KernelTime = km.predict
        calibrated.append("kernel times (kernel model)")
        if par.attention == "flash" and not flash_runs(getattr(calibration, "software", None)):
            configured.append("flash attention kernels: the attention curve of the calibration's SDPA forward "
                              "microbenchmarks (no flash-attention training run among its bundles)")
            notes.append("flash attention: no training run with flash attention on this calibration's GPU; its "
                         "backward kernels are not measured there (the H100 calibration has them)")
        if mismatch:
            transferred.append(f"kernel model (fitted on {calibration.gpu})")  # type: ignore[attr-defined]
    else:
        kernel_time = roofline_kernel_time(cluster)
        configured.append("kernel times: roofline at datasheet peaks (no kernel model)")
        notes.append("no calibrated kernel model: compute times are the datasheet roofline, an optimistic bound")
    # Host launches and syncs (calib.models.host), when the calibration has a host model.
    host = None
    if calibration is not None and getattr(calibration, "host", None):
        fitted_host = calibration.host_model()  # type: ignore[attr-defined]
        host = fitted_host.on_path(par.tp, par.pp, par.ep).at_own_pace(own_launch_s)
        if own_launch_s is not None and fitted_host.own_launch_ref_s is None:
            notes.append("own launch pace given, but no run of this calibration timed it: host costs not scaled")
        elif own_launch_s is not None:
            calibrated.append(f"host costs at an own launch pace of {own_launch_s * 1e6:.2f} us (x"
                              f"{own_pace_factor(own_launch_s, fitted_host.own_launch_ref_s):.3f} on the calibration's "
                              f"{fitted_host.own_launch_ref_s * 1e6:.2f} us)")
        calibrated.append(f"host: {host.launch_s * 1e6:.1f} us per kernel launch, {host.sync_s * 1e6:.0f} us per host "
                          f"sync, {host.p2p_sync * 1e6:.0f} us per pipeline send/recv sync (host model, code path "
                          f"TP {par.tp} / PP {par.pp} / EP {par.ep})")
        if par.tp > 1 and host.tp_rendezvous_s:
            calibrated.append(f"TP rendezvous: {host.tp_rendezvous_s * 1e6:.0f} us per blocking collective of the TP "
                              "group (host model)")
            most = fitted_host.tp_rendezvous_microbatches
            if most is not None and par.num_microbatches > most:
                notes.append(f"TP rendezvous fitted on steps of at most {most} micro-batches, this one has "
                             f"{par.num_microbatches}: "
                             "part of it stands for a race of the TP group's hosts once per step (docs/host.md, "
                             "\"The TP rendezvous\"), which a per-collective cost over-counts here")
        if fitted_host.beyond_fitted(par.tp, par.pp, par.ep):
            notes.append(f"host costs of TP {par.tp} / PP {par.pp} / EP {par.ep} together are those of the longest code "
                         "path measured: how the launch pace grows beyond it is not measured")
        if mismatch:
            transferred.append(f"host model (fitted on {calibration.gpu})")  # type: ignore[attr-defined]
    gen = generate(model, par, kernel_time, host)
    t_gen = time.perf_counter()

    # Network and system.
    network = cluster.network(gpus)
    system = cluster.system(gpus)
    prov = cluster.provenance(gpus)
    net_fit = bool(calibration is not None and getattr(calibration, "network", None)
                   and calibration.network.get("astra_sim"))  # type: ignore[attr-defined]
    if net_fit:
        network = calibration.astra_network(network)  # type: ignore[attr-defined]
        system = calibration.astra_system(system, len(network.dims))  # type: ignore[attr-defined]
        fits = calibration.network.get("astra_sim", {})  # type: ignore[attr-defined]
    else:
        fits = {}
    names = [d.name for d, _, _ in cluster.network_dims(gpus)]
    for i, name in enumerate(names):
        domain = "intra" if i == 0 else "inter"
        for what in ("bandwidth", "latency"):
            key = f"network.{name}.{what}"
            if domain in fits:
                calibrated.append(f"{key} (calibration domain {domain})")
                if mismatch:
                    transferred.append(f"{key} (domain {domain}, fitted on {calibration.gpu})")  # type: ignore[attr-defined]
            else:
                configured.append(f"{key}: {prov[key].source}")
    if "intra" in fits:
        calibrated.append("network.endpoint_delay and collective implementations (calibration domain intra)")
    else:
        configured.append(f"network.endpoint_delay: {prov['network.endpoint_delay'].source}")
    memory = calibrated_memory(calibration)
    capacity, measured_capacity = memory_capacity(cluster, memory, mismatch)
    for key, v in prov.items():
        if key.startswith(("processor.", "memory.")) and not (key == "memory.hbm_bytes" and measured_capacity):
            configured.append(f"{key}: {v.source}")

    # The power cap's clock (calib.models.clock) is settled on the embedded simulator, so that the
    # emitted ASTRA-sim inputs and an ASTRA-sim run are those of the final step.
    settled = None
    clock = clock_of(calibration)
    if clock is not None and clock.slows:
        def embedded(g: GeneratedStep) -> SimResult:
            return simulate(g.workload, network, system)

        gen, settled, slowdown, x = _at_power_cap_clock(gen, embedded(gen), clock, model, par, kernel_time, host,
                                                        embedded)
        what = (f"a GEMM FLOP rate of {x:.3f} of {clock.peak_flops_per_s / 1e12:.0f} TFLOP/s"
                if clock.feature == "gemm_flop_rate" else f"a GEMM/attention share of {x:.3f} of the step")
        calibrated.append(f"SM clock under the power cap: GEMM and attention kernels x{slowdown:.3f} at {what} "
                          "(clock model)")
        if clock.beyond_measured(x):
            notes.append(f"{what[2:]} is above the largest measured ({clock.top:.2f}): the power cap's clock "
                         "slowdown is held at that input's")
        if mismatch:
            transferred.append(f"clock model (fitted on {calibration.gpu})")  # type: ignore[union-attr]

    if emit_astra_sim is not None:
        write_astra_sim(gen, network, system, emit_astra_sim)

    if settled is not None and backend == "analytical":
        result = settled
    else:
        result = simulate(gen.workload, network, system, backend=backend, astra_sim_bin=astra_sim_bin)
    t_sim = time.perf_counter()
    step = result.step_time_s
    if not step > 0:
        raise CalibError("simulation returned a zero step time")

    breakdown, critical_stage = _breakdown(gen, result, par)
    mem = memory_model.estimate(model, par, capacity)
    device = device_memory(mem.total_bytes, capacity, memory, par.gpus)
    configured.append("memory: Megatron model-state bytes and Korthikanti et al. 2022 activations")
    if measured_capacity:
        calibrated.append("memory.hbm_bytes (the device total the bundles' CUDA reported)")
    if device.calibrated:
        calibrated.append("memory model: the allocator's reserve and the memory outside it")
        if mismatch:
            transferred.append(f"memory model (fitted on {calibration.gpu})")  # type: ignore[union-attr]
    else:
        notes.append("no calibrated memory model: the verdict counts torch's allocated bytes only, not its "
                     "reserve or the CUDA context and NCCL buffers outside it")
    tokens = par.global_batch * model.seq_length
    tflops = gen.model_flops / step / gpus / 1e12
    mfu = gen.model_flops / (step * gpus * cluster.peak_flops_per_s)

    energy = avg_w = peak_w = None
    if calibration is not None and getattr(calibration, "power", None):
        pm = calibration.power_model()  # type: ignore[attr-defined]
        energy = 0.0
        for stage, cls in enumerate(gen.workload.classes):
            shares = _activity_shares(gen, result, stage, cls.rep, step)
            energy += pm.energy_j(step, shares, gen.stage_flops(stage)) * len(cls.members)
        avg_w = energy / (step * gpus)
        peak_w = float(pm.peak_power_w) if np.isfinite(pm.peak_power_w) else None
        calibrated.append("power by activity" + (" and GEMM/attention FLOP rate" if pm.energy_per_flop_j > 0 else "")
                          + " (power model)")
        if mismatch:
            transferred.append(f"power model (fitted on {calibration.gpu})")  # type: ignore[attr-defined]
    else:
        notes.append("no calibrated power model: energy and power are not reported")

    share = host_share(breakdown, step)
    band = error_band(calibration, step, model.name, share)
    if band.get("missing"):
        notes.append(band["missing"])

    cal_id = getattr(calibration, "id", None) if calibration is not None else None
    inputs = {
        "model": model.to_dict(), "parallel": par.to_dict(), "gpus": gpus, "cluster": cluster.name,
        "cluster_gpu": cluster.gpu, "backend": backend,
        "calibration": getattr(calibration, "source", None) if calibration is not None else None,
        "calibration_gpu": getattr(calibration, "gpu", None) if calibration is not None else None,
        # The stack the calibration's measurements ran on (calib.stack): the kernel times are its.
        "calibration_software": dict(getattr(calibration, "software", None) or {}) if calibration is not None else None,
        "network": network.to_dict(),
    }
    t_end = time.perf_counter()
    return ProjectionResult(
        inputs=inputs, calibration_id=cal_id, step_time_s=step, tokens_per_s=tokens / step, tflops_per_gpu=tflops,
        mfu=mfu, breakdown_s=breakdown, memory_gib_per_gpu=mem.total_gib,
        memory_detail_gib={
            "weights": mem.weights_bytes / GIB, "grads": mem.grads_bytes / GIB, "optimizer": mem.optimizer_bytes / GIB,
            "activations": mem.activations_bytes / GIB, "transient": mem.working_bytes / GIB,
            "buffers": mem.buffers_bytes / GIB,
            "optimizer_step_transient": mem.optimizer_step_bytes / GIB, "capacity": mem.capacity_bytes / GIB,
            "peak_stage": mem.stage, "outside_allocator": device.outside_bytes / GIB,
            "device_low": device.low_bytes / GIB, "device_high": device.high_bytes / GIB,
        },
        memory_verdict=device.verdict, fits_in_memory=device.fits, energy_j_per_step=energy, avg_power_w=avg_w,
        peak_power_w=peak_w, error_band=band, host_share=share,
        calibrated=calibrated, configured=configured, transferred=transferred, notes=notes,
        sim={
            "rank_classes": len(gen.workload.classes),
            "nodes": sum(len(c.trace.nodes) for c in gen.workload.classes),
            "simulated_ranks": result.simulated_ranks, "critical_stage": critical_stage,
            "generate_s": t_gen - t0, "simulate_s": t_sim - t_gen, "total_s": t_end - t0,
            "model_flops_per_step": gen.model_flops, "hardware_flops_per_step": gen.hardware_flops,
        },
    )


CLOCK_ROUNDS = 4  # simulations at most to settle the clock; each moves the slowdown by under a tenth of the last
CLOCK_TOL = 1e-3  # slowdowns closer than this are one


def _ranks_per_stage(gen: GeneratedStep) -> list[int]:
    """How many ranks each generated stage (rank class) stands for: the weights of a mean over ranks."""
    return [len(c.members) for c in gen.workload.classes]


def _gemm_flops(gen: GeneratedStep) -> float:
    """GEMM FLOPs per rank and step, the mean over stages weighted by their ranks (as calib.models.clock's measured
    points take it); the power cap's slowdown does not move them."""
    members = _ranks_per_stage(gen)
    return float(np.average([gen.stage_flops(s, ("gemm",)) for s in range(len(members))], weights=members))


def _clock_input(gen: GeneratedStep, result: SimResult, slowdown: float, clock: ClockModel,
                 gemm_flops: float) -> float:
    """The clock model's input for the simulated step, the mean over ranks: GEMM and attention time at the
    unthrottled clock over the step, or `gemm_flops` (_gemm_flops) over it."""
    step = result.step_time_s
    if not step > 0:
        return 0.0
    flop = [(c - m) / slowdown for c, m in zip(gen.stage_compute_s, gen.stage_memory_s, strict=True)]
    return clock.step_input(float(np.average(flop, weights=_ranks_per_stage(gen)) / step), gemm_flops / step)


def _at_power_cap_clock(gen: GeneratedStep, result: SimResult, clock: ClockModel, model: ModelSpec,
                        par: ParallelConfig, kernel_time: KernelTime, host: object,
                        run: Callable[[GeneratedStep], SimResult]) -> tuple[GeneratedStep, SimResult, float, float]:
    """The step with GEMM and attention kernels at the clock the power cap leaves them (calib.models.clock):
    the slowdown follows the step's input (GEMM/attention share or GEMM FLOP rate), which the slowdown
    lowers, so the two are iterated to agreement. Returns the generated step, its result, the slowdown and
    the input."""
    slowdown = 1.0
    gemm_flops = _gemm_flops(gen)
    x = _clock_input(gen, result, slowdown, clock, gemm_flops)
    for _ in range(CLOCK_ROUNDS):
        target = clock.slowdown(x)
        if abs(target - slowdown) < CLOCK_TOL:
            break
        slowdown = target
        gen = generate(model, par, throttled(kernel_time, slowdown), host)  # type: ignore[arg-type]
        result = run(gen)
        x = _clock_input(gen, result, slowdown, clock, gemm_flops)
    return gen, result, slowdown, x


def _breakdown(gen: GeneratedStep, result: SimResult, par: ParallelConfig) -> tuple[dict[str, float], int]:
    """Where the slowest rank's step goes; the parts add up to the step time.

    compute: its compute nodes; exposed tp/dp/ep: communication not hidden behind compute as the
    simulator reports it; pipeline bubble: the schedule's idle time, (PP - 1) / VPP micro-batch
    passes (Narayanan et al. 2021, section 2.2.1), taken out of the send/recv wait; exposed pp:
    the rest of that wait (transfers on the critical path, and waiting on a slower stage); other:
    whatever remains (waiting on peers outside the above). A pass is the rank's step less its
    send/recv wait and exposed DP communication (once a step), over its micro-batches: the other
    stages' passes, which the bubble waits for, hold their exposed TP/EP communication and host
    stalls as well as their compute, so a bubble of compute alone would leave those in exposed pp."""
    finish = np.asarray(result.finish_ns)
    crit = int(np.argmax(finish))
    cls_of = gen.workload.class_of()
    stage = cls_of[crit] if crit < len(cls_of) else 0
    step_ns = float(finish[crit])
    busy = result.busy_ns[crit] if result.busy_ns else {}
    exposed = result.exposed_ns[crit] if result.exposed_ns else {}
    compute_ns = float(busy.get("compute", gen.stage_compute_s[stage] * 1e9))
    out = {"compute": compute_ns}
    for c in ("tp", "dp", "ep"):
        out[f"exposed_{c}"] = float(exposed.get(c, 0.0))
    pp_wait = float(exposed.get("pp", 0.0))
    passes_ns = max(step_ns - pp_wait - out["exposed_dp"], 0.0)
    per_mb = passes_ns / max(par.num_microbatches, 1)  # forward + backward of one micro-batch, all chunks
    bubble = min(pp_wait, (par.pp - 1) / par.vpp * per_mb) if par.pp > 1 else 0.0
    out["pipeline_bubble"] = bubble
    out["exposed_pp"] = pp_wait - bubble
    other = step_ns - sum(out.values())
    out["other"] = max(other, 0.0)
    return {k: v * 1e-9 for k, v in out.items()}, stage


def _activity_shares(gen: GeneratedStep, result: SimResult, stage: int, rep: int, step_s: float) -> dict[str, float]:
    """The power model's activity shares of one rank class over the step (compute > memory > comm > idle).

    comm includes the pipeline's send/recv waits (bubble included), as the fitted shares do: there a
    receive's NCCL kernel runs while it waits for its peer (calib.models.power)."""
    compute = gen.stage_compute_s[stage]
    memory = gen.stage_memory_s[stage]
    exposed = result.exposed_ns[rep] if result.exposed_ns and rep < len(result.exposed_ns) else {}
    comm = sum(float(exposed.get(c, 0.0)) for c in ("tp", "dp", "ep", "pp")) * 1e-9
    shares = {"compute": max(compute - memory, 0.0) / step_s, "memory": memory / step_s, "comm": comm / step_s}
    busy = sum(shares.values())
    if busy > 1:
        shares = {k: v / busy for k, v in shares.items()}
        busy = 1.0
    shares["idle"] = 1.0 - busy
    return shares


FAMILY_BAND_MIN_RUNS = 3  # held-out runs of the projected model's family before its own worst error is the band
# A step whose breakdown leaves at most this share to "other" (the GPU waiting for its host's launches and syncs,
# `host_share`) is GPU-bound: a host 30 % off the calibrated pace, as far as the committed repeats of host-paced
# configurations spread, moves such a step by at most 1.5 %. `calib validate` scores the held-out runs predicted
# GPU-bound apart (calib.validation.types, `heldout_gpu_bound_*`), and the error band of a projection is taken over
# the validated runs no more host-bound than it is (`error_band`).
HOST_BOUND_SHARE = 0.05
REGIME_BAND_MIN_RUNS = 10  # validated runs of the family within the projection's host share before they set the band


def host_share(breakdown_s: dict[str, float], step_s: float | None) -> float | None:
    """The share of a predicted step its host exposes: the breakdown's "other" over the step (`_breakdown`); None
    where the breakdown has no "other" (a replay's) or there is no step."""
    other = breakdown_s.get("other")
    if other is None or step_s is None or not np.isfinite(step_s) or step_s <= 0:
        return None
    return float(min(max(other / step_s, 0.0), 1.0))


def model_family(name: str) -> str:
    """"gpt3-175b" / "llama3-8b@L4,S2048" -> "gpt3" / "llama3": the preset family a run or projection is of."""
    return str(name).split("@")[0].split("-")[0].lower()


def error_band(calibration: object | None, step_s: float, model_name: str | None = None,
               share: float | None = None) -> dict:
    """Step-time band from the calibration's held-out validation, else from its per-model errors.

    The band is the worst held-out error over the validated runs of the projected model's family
    (gpt3, llama3, mixtral) no more host-bound than the projection: whose predicted host share (`host_share`, kept
    per run by `calib validate`) is at most the projection's `share`, or HOST_BOUND_SHARE where it is below that,
    where the validation has at least REGIME_BAND_MIN_RUNS of them; else over the family's runs where it has at
    least FAMILY_BAND_MIN_RUNS, else over all runs. A host-paced step moves with its host by far more than a
    GPU-bound one (docs/validate.md, "GPU-bound and host-bound runs"), so the host-paced runs' errors do not bound
    a projection the host hardly paces. The family's and all runs' worst errors are given beside it."""
    if calibration is None:
        return {"low": None, "high": None, "pct": None, "from": "none: uncalibrated projection",
                "missing": "no calibration: no error band"}
    val = getattr(calibration, "validation", None) or {}
    pct = val.get("heldout_max")
    if pct is not None and np.isfinite(float(pct)):
        pct = float(pct)
        runs = val.get("heldout_count") or len(val.get("runs") or [])
        configs = val.get("heldout_configs")
        over = f"{runs} measured run(s)" + (f" of {configs} configuration(s)" if configs else "")
        fam = model_family(model_name) if model_name else ""
        family_runs = [r for r in val.get("runs") or []
                       if r.get("kind") == "heldout" and r.get("error_pct") is not None and r.get("model")
                       and model_family(r["model"]) == fam]
        errs = [abs(float(r["error_pct"])) for r in family_runs]
        upto = max(HOST_BOUND_SHARE, share) if share is not None and np.isfinite(share) else None
        alike = [] if upto is None else [abs(float(r["error_pct"])) for r in family_runs
                                         if r.get("host_share") is not None and float(r["host_share"]) <= upto]
        if fam and len(alike) >= REGIME_BAND_MIN_RUNS:
            band = {"pct": max(alike), "mape_pct": float(np.mean(alike)), "all_pct": pct, "family": fam,
                    "family_pct": max(errs), "host_share": share, "host_share_upto": upto,
                    "from": f"worst held-out step-time error over the {len(alike)} measured {fam} run(s) whose "
                            f"predicted host share was at most {100 * upto:.0f}% (this projection's: "
                            f"{100 * share:.1f}%; all {len(errs)} {fam} runs: {max(errs):.1f}%; all families: "
                            f"{pct:.1f}% over {over})"}
        elif fam and len(errs) >= FAMILY_BAND_MIN_RUNS:
            band = {"pct": max(errs), "mape_pct": float(np.mean(errs)), "all_pct": pct, "family": fam,
                    "from": f"worst held-out step-time error over the {len(errs)} measured {fam} run(s) "
                            f"(all families: {pct:.1f}% over {over})"}
        else:
            band = {"pct": pct, "mape_pct": val.get("heldout_mape"), "all_pct": pct,
                    "from": f"validation.heldout_max: worst held-out step-time error over {over}"}
        return {"low": step_s * (1 - band["pct"] / 100), "high": step_s * (1 + band["pct"] / 100), **band}
    errors = getattr(calibration, "errors", None) or {}
    worst = None
    used = []
    for name in ("kernel", "network"):
        e = errors.get(name)
        if e is None:
            continue
        mape = float(e.mape if hasattr(e, "mape") else e["mape"])
        used.append(f"{name} {mape:.1f}%")
        worst = mape if worst is None else max(worst, mape)
    if worst is None:
        return {"low": None, "high": None, "pct": None, "from": "none",
                "missing": "calibration has neither a validation section nor per-model errors: no error band"}
    return {
        "low": step_s * (1 - worst / 100), "high": step_s * (1 + worst / 100), "pct": worst,
        "from": "per-model cross-validated MAPE (" + ", ".join(used) + ")",
        "missing": "calibration has no held-out step-time validation (run calib validate); band from per-model errors",
    }


def write_astra_sim(gen: GeneratedStep, network: NetworkConfig, system: SystemConfig, out_dir: str | Path) -> list[str]:
    """Per-rank ETs (`materialize`) and the ASTRA-sim configuration files, with run.sh (calib.sim.astrasim)."""
    from calib.sim.astrasim import write_inputs

    return write_inputs(gen.workload, network, system, str(out_dir))
