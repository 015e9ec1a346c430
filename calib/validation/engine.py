"""The one place where validation calls the other parts: fit, cluster presets, generator, simulator.

Everything here goes through the public interfaces of docs/contracts.md, so a replayed or held-out
run is rebuilt exactly the way `calib fit` and `calib project` would do it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calib.bundle.io import Bundle
from calib.bundle.schema import RunSpec
from calib.errors import CalibError
from calib.workload.models import ModelSpec, resolve_model
from calib.workload.parallel import ParallelConfig


@dataclass
class Prediction:
    step_s: float
    breakdown_s: dict[str, float] = field(default_factory=dict)
    energy_j: float | None = None


def fit(bundles: list[Bundle]) -> object:
    """calib.fit.fit_calibration on exactly these bundles, without the cross-validation of its models
    (a held-out fit is scored on the run it left out; its own error estimates would be discarded)."""
    from calib.fit import fit_calibration

    return fit_calibration(bundles, cross_validate=False)


def load_calibration(path: str) -> object:
    from calib.calibration import Calibration

    return Calibration.load(path)


def model_of(spec: RunSpec) -> ModelSpec:
    """The measured model: a preset (possibly scaled down) or an architecture dict, at the run's sequence."""
    model = resolve_model(spec.model)
    if spec.seq_length and spec.seq_length != model.seq_length:
        model = model.scaled_down(model.layers, spec.seq_length)
    return model


def parallel_of(spec: RunSpec) -> ParallelConfig:
    return ParallelConfig(
        tp=spec.tp, pp=spec.pp, dp=spec.dp, ep=spec.ep, vpp=spec.vpp,
        sequence_parallel=spec.sequence_parallel, micro_batch=spec.micro_batch, global_batch=spec.global_batch,
        recompute=spec.recompute, overlap_grad_reduce=spec.overlap_grad_reduce,
        overlap_param_gather=spec.overlap_param_gather, distributed_optimizer=spec.distributed_optimizer,
        dtype=spec.dtype, attention=spec.attention,
    )


def host_cluster(bundle: Bundle) -> object:
    """The single-host preset matching the bundle's GPU model and count (simconfigs/<gpu>-<count>.yaml)."""
    from calib.cluster import load_cluster

    family = gpu_family(bundle.manifest.gpu.name)
    spec = bundle.manifest.spec
    gpus = spec.tp * spec.pp * spec.dp
    if family is None:
        raise CalibError(f"bundle {bundle.path}: no single-host cluster preset for GPU {bundle.manifest.gpu.name!r}")
    return load_cluster(f"{family}-{gpus}")


def replay_network(bundle: Bundle, calibration: object) -> tuple[object, object]:
    """(NetworkConfig, SystemConfig) of the bundle's host with the calibration's network parameters."""
    cluster = host_cluster(bundle)
    spec = bundle.manifest.spec
    gpus = spec.tp * spec.pp * spec.dp
    # The same route as calib.project.project: the preset's dimensions and system, with the
    # calibration's ASTRA-sim fit (bandwidth, latency, endpoint delay, implementations) where it has one.
    network = cluster.network(gpus)  # type: ignore[attr-defined]
    system = cluster.system(gpus)  # type: ignore[attr-defined]
    if (getattr(calibration, "network", None) or {}).get("astra_sim"):
        network = calibration.astra_network(network)  # type: ignore[attr-defined]
        system = calibration.astra_system(system, len(network.dims))  # type: ignore[attr-defined]
    return network, system


def predict(bundle: Bundle, calibration: object) -> Prediction:
    """Generate the run's step from its spec with this calibration, simulate it, return step time etc."""
    from calib.models.host import run_own_launch
    from calib.project import project

    spec = bundle.manifest.spec
    # At the run's own host pace: timed by its trainer, else read from its profiled step (calib.models.host,
    # own_launch_ref_s and profiled_pace).
    host = calibration.host_model() if getattr(calibration, "host", None) else None  # type: ignore[attr-defined]
    result = project(model_of(spec), parallel_of(spec), host_cluster(bundle), calibration,
                     own_launch_s=run_own_launch(bundle, host)[0])
    data = result.to_json() if hasattr(result, "to_json") else dict(result)
    breakdown = {str(k): float(v) for k, v in (data.get("breakdown_s") or {}).items()}
    energy = data.get("energy_j_per_step")
    return Prediction(step_s=float(data["step_time_s"]), breakdown_s=breakdown,
                      energy_j=None if energy is None else float(energy))


def gpu_family(name: str) -> str | None:
    """"NVIDIA H200" -> "h200": the key of the bundled calibration and of the host presets."""
    low = (name or "").lower()
    for fam in ("h200", "h100", "mi250", "mi300"):
        if fam in low:
            return fam
    return None
