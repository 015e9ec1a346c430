"""What one training measurement asks for, validated before anything is launched."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from calib.bundle.schema import RunSpec
from calib.errors import CalibError
from calib.workload.models import ModelSpec, resolve_model
from calib.workload.parallel import ParallelConfig

DEVICES = ("cuda", "cpu")


@dataclass
class TrainRequest:
    """One `calib measure train` run. Times in seconds; `t0_monotonic` is the launcher's clock origin."""

    model: str
    par: ParallelConfig
    warmup: int = 5
    steps: int = 20
    profile_steps: int = 1
    device: str = "cuda"
    telemetry: bool = True
    telemetry_hz: float = 50.0
    # A second process timing fixed Python work all along (measure/telemetry/host_pace.py); on the CPU
    # path too, where there is no GPU telemetry.
    host_pace: bool = True
    # The trainer's own pace, timed in its main thread just after every measured step, outside the step's
    # timing: tiny CUDA launches and the sampler's Python work (measure/own_pace.py). On the H200 hosts a
    # host-paced step moves with the pace of the CPUs its own threads run on, which the second process does
    # not see (docs/host.md, "The trainer's threads, step by step").
    own_pace: bool = True
    keep_raw: bool = False
    seed: int = 1234
    timeout_s: float = 1800.0
    master_port: int = 29500
    notes: dict = field(default_factory=dict)
    # Set by the launcher for the workers.
    work_dir: str = ""
    t0_monotonic: float = 0.0

    def model_spec(self) -> ModelSpec:
        return resolve_model(self.model)

    def check(self, gpus_available: int | None = None) -> ModelSpec:
        """Everything that can be known wrong before launch, as one CalibError line."""
        model = self.model_spec()
        self.par.check(model)
        if self.device not in DEVICES:
            raise CalibError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.warmup < 0 or self.steps < 1 or self.profile_steps < 0:
            raise CalibError("need warmup >= 0, steps >= 1 and profile-steps >= 0")
        if self.telemetry and not 0 < self.telemetry_hz <= 10_000:  # also refuses NaN
            raise CalibError(f"telemetry rate must be in (0, 10000] Hz, got {self.telemetry_hz}")
        if not self.timeout_s > 0:
            raise CalibError(f"timeout must be a positive number of seconds, got {self.timeout_s}")
        if self.device == "cpu":
            if self.par.tp > 1 or self.par.pp > 1 or self.par.ep > 1:
                raise CalibError("the CPU (gloo) path runs data parallel only: use --tp 1 --pp 1 --ep 1")
        elif gpus_available is not None and self.par.gpus > gpus_available:
            raise CalibError(f"the run needs {self.par.gpus} GPUs (TP x PP x DP) but {gpus_available} are visible")
        if self.device == "cuda":
            need = weight_state_bytes(model, self.par)
            if need > 140e9:
                raise CalibError(
                    f"{model.name} needs about {need / 1e9:.0f} GB per GPU for weights, gradients and Adam state "
                    f"at TP {self.par.tp} x PP {self.par.pp} (x EP {self.par.ep}): more than one GPU holds; use fewer layers"
                )
        return model

    def run_spec(self, model: ModelSpec) -> RunSpec:
        p = self.par
        return RunSpec(
            model=model.name, tp=p.tp, pp=p.pp, dp=p.dp, ep=p.ep, vpp=p.vpp, sequence_parallel=p.sequence_parallel,
            micro_batch=p.micro_batch, global_batch=p.global_batch, seq_length=model.seq_length, dtype=p.dtype,
            recompute=p.recompute, overlap_grad_reduce=p.overlap_grad_reduce,
            overlap_param_gather=p.overlap_param_gather, distributed_optimizer=p.distributed_optimizer,
            attention=p.attention,
        )

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> TrainRequest:
        d = json.loads(text)
        d["par"] = ParallelConfig(**d["par"])
        return cls(**d)

    @classmethod
    def load(cls, path: str | Path) -> TrainRequest:
        return cls.from_json(Path(path).read_text())


def weight_state_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """Bytes per GPU of bf16 weights + fp32 grads + fp32 master weights and Adam moments (16 B/param).

    A lower bound on memory used to refuse a run that cannot fit before launching it; activations
    are not counted (an activation OOM ends as a failed bundle instead).
    """
    dense_layer = model.layer_params()
    if model.is_moe:
        expert = 3 * model.hidden * model.ffn_hidden if model.activation == "swiglu" else 2 * model.hidden * model.ffn_hidden
        shared = dense_layer - expert * model.experts
        per_layer = shared / par.tp + expert * model.experts / (par.tp * par.ep)
    else:
        per_layer = dense_layer / par.tp
    params = per_layer * model.layers / par.pp + 2 * model.vocab * model.hidden / par.tp
    per_param = 2 + 4 + 4 + 8 if not par.distributed_optimizer else 2 + 4 + 12 / max(par.dp, 1)
    return params * per_param
