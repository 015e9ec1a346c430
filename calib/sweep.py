"""`calib project --sweep`: every valid (TP, PP, DP, EP, micro-batch, recompute, SP) for a model on a GPU
count, out-of-memory ones discarded before simulating, the rest simulated in parallel processes and
ranked by step time (then energy)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from calib.cluster import ClusterPreset
from calib.errors import CalibError
from calib.models.memory import device_memory
from calib.workload import memory as memory_model
from calib.workload.flops import hardware_flops_per_step
from calib.workload.generate import check_supported
from calib.workload.models import ModelSpec
from calib.workload.parallel import ParallelConfig

MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: ModelSpec, gpus: int, base: ParallelConfig, gpus_per_node: int) -> Iterator[ParallelConfig]:
    """Valid configurations: TP within a node, PP dividing the layers, EP dividing DP and the experts,
    with and without sequence parallelism when TP > 1; the other options as in `base`."""
    for tp in _divisors(min(gpus, gpus_per_node)):
        for pp in _divisors(model.layers):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for ep in (_divisors(dp) if model.is_moe else [1]):
                for mbs in MICRO_BATCHES:
                    for rc in RECOMPUTE:
                        for sp in ((True, False) if tp > 1 else (False,)):
                            par = dataclasses.replace(base, tp=tp, pp=pp, dp=dp, ep=ep, vpp=1, micro_batch=mbs,
                                                      recompute=rc, sequence_parallel=sp)
                            try:
                                check_supported(model, par)
                            except CalibError:
                                continue
                            yield par


@dataclass
class SweepRow:
    par: ParallelConfig
    memory_gib: float
    fits: bool
    memory_verdict: str
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    energy_j_per_step: float | None = None
    error: str = ""

    def to_json(self) -> dict:
        p = self.par
        return {
            "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep, "micro_batch": p.micro_batch, "recompute": p.recompute,
            "sequence_parallel": p.sequence_parallel, "memory_gib_per_gpu": self.memory_gib, "fits_in_memory": self.fits,
            "memory_verdict": self.memory_verdict,
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
            "energy_j_per_step": self.energy_j_per_step, "error": self.error,
        }


def _one(args: tuple) -> tuple[int, dict]:
    """Worker: project one configuration (top level so that process pools can pickle it)."""
    from calib.project import project

    i, model, par, cluster, calibration, allow = args
    try:
        r = project(model, par, cluster, calibration, allow_gpu_mismatch=allow)
    except CalibError as exc:
        return i, {"error": str(exc)}
    return i, {"step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
               "energy_j_per_step": r.energy_j_per_step}


def sweep(model: ModelSpec, gpus: int, base: ParallelConfig, cluster: ClusterPreset, calibration: object | None,
          allow_gpu_mismatch: bool = False, max_configs: int = 200, workers: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> tuple[list[SweepRow], list[SweepRow], list[str]]:
    """(ranked rows that fit, rows discarded for memory, notes)."""
    cluster.check_gpus(gpus)
    notes: list[str] = []
    from calib.project import calibrated_memory, check_calibration_gpu, memory_capacity

    mm = calibrated_memory(calibration)
    capacity, _ = memory_capacity(cluster, mm, check_calibration_gpu(calibration, cluster, allow_gpu_mismatch))

    def row(p: ParallelConfig) -> SweepRow:
        est = memory_model.estimate(model, p, capacity)
        dev = device_memory(est.total_bytes, capacity, mm, p.gpus)
        return SweepRow(p, est.total_gib, dev.fits, dev.verdict)

    rows = [row(p) for p in candidates(model, gpus, base, cluster.gpus_per_node)]
    if not rows:
        raise CalibError(f"no valid parallel configuration of {model.name} on {gpus} GPUs with global batch {base.global_batch}")
    fit = [r for r in rows if r.fits]
    oom = [r for r in rows if not r.fits]
    if len(fit) > max_configs:
        # Simulate the most promising by a first-order estimate: FLOPs (with recomputation) at peak,
        # stretched by the pipeline bubble (PP - 1) / (m x VPP).
        def estimate(r: SweepRow) -> float:
            p = r.par
            bubble = (p.pp - 1) / (p.num_microbatches * p.vpp)
            return hardware_flops_per_step(model, p) / gpus * (1 + bubble)

        fit.sort(key=estimate)
        notes.append(f"{len(fit)} configurations fit in memory; simulated the {max_configs} best by FLOPs and "
                     "pipeline bubble (--sweep-max)")
        fit = fit[:max_configs]
    jobs = [(i, model, r.par, cluster, calibration, allow_gpu_mismatch) for i, r in enumerate(fit)]
    n_workers = workers or max(1, os.cpu_count() or 1)
    done = 0
    if n_workers == 1 or len(jobs) == 1:
        results = map(_one, jobs)
        for i, res in results:
            _apply(fit[i], res)
            done += 1
            if progress:
                progress(done, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=n_workers) as pool:
            futs = [pool.submit(_one, j) for j in jobs]
            for f in as_completed(futs):
                i, res = f.result()
                _apply(fit[i], res)
                done += 1
                if progress:
                    progress(done, len(jobs))
    failed = [r for r in fit if r.error]
    if failed:
        notes.append(f"{len(failed)} configuration(s) could not be projected (first: {failed[0].error})")
    ranked = sorted((r for r in fit if not r.error), key=lambda r: (r.step_time_s, r.energy_j_per_step or 0.0))
    tight = sum(r.memory_verdict == "tight" for r in fit)
    notes.append(f"{len(rows)} valid configurations; {len(oom)} discarded as out of memory"
                 + (f"; {tight} simulated are tight (may not fit)" if tight else ""))
    return ranked, oom, notes


def _apply(row: SweepRow, res: dict) -> None:
    if "error" in res:
        row.error = res["error"]
        return
    row.step_time_s = res["step_time_s"]
    row.tokens_per_s = res["tokens_per_s"]
    row.mfu = res["mfu"]
    row.energy_j_per_step = res["energy_j_per_step"]
