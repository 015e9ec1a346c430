"""Synthetic bundles for unit-testing calib fit's algorithms.

Every number here is generated from a KNOWN function inside the test process (written to a pytest
tmp folder, never saved as data, never counted as a measured error): the tests check that the
fit recovers that function, not anything about real hardware.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from calib.bundle.io import BundleWriter
from calib.bundle.schema import GpuInfo, Manifest, RunSpec, StepsInfo, TelemetryInfo
from calib.chakra.codec import write_et
from calib.chakra.model import ExecutionTrace

H200 = "NVIDIA H200"
PEAK_F = 989.4e12
PEAK_B = 4.8e12


def gemm_time(m: float, n: float, k: float) -> float:
    """Known synthetic GEMM time: efficiency saturating at 0.7 with size, plus a 3 us floor."""
    fl = 2.0 * m * n * k
    by = 2.0 * (m * k + k * n + m * n)
    eff = 0.7 * fl / (fl + 5e9)
    return 3e-6 + max(fl / (PEAK_F * eff), by / (0.8 * PEAK_B))


def memory_time(nbytes: float) -> float:
    return 2e-6 + nbytes / (0.85 * PEAK_B)


def kernel_frame(n_gemm: int = 120, n_mem: int = 60, seed: int = 0, noise: float = 0.01,
                 max_log2: float = 13.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_gemm):
        m, n, k = (int(2 ** rng.uniform(8, max_log2)) for _ in range(3))
        t = gemm_time(m, n, k) * (1 + noise * rng.standard_normal())
        rows.append({"rank": 0, "step": i % 3, "stream": 7, "name": "nvjet_gemm", "op_class": "gemm",
                     "start_s": 0.001 * i, "time_s": t, "aten_op": "aten::mm", "m": m, "n": n, "k": k, "batch": 1,
                     "flops": 2.0 * m * n * k, "bytes": 2.0 * (m * k + k * n + m * n), "dtype": "bfloat16"})
    for i in range(n_mem):
        nb = float(int(2 ** rng.uniform(16, 30)))
        t = memory_time(nb) * (1 + noise * rng.standard_normal())
        rows.append({"rank": 0, "step": i % 3, "stream": 7, "name": "elementwise", "op_class": "memory",
                     "start_s": 1.0 + 0.001 * i, "time_s": t, "aten_op": "aten::add", "m": np.nan, "n": np.nan,
                     "k": np.nan, "batch": np.nan, "flops": 0.0, "bytes": nb, "dtype": "bfloat16"})
    return pd.DataFrame(rows)


def labelled_gemm_frame(noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """GEMMs shaped like the kernel microbenchmarks: preset layers under TP 1/2/4/8, labelled
    "<model>/tp<N>/tokens<T>/<role>/<pass>", timed by the known gemm_time."""
    from calib.workload.models import PRESETS

    rng = np.random.default_rng(seed)
    rows = []
    for name in ("llama3-8b", "llama3-70b", "gpt3-175b"):
        mdl = PRESETS[name]
        for tp in (1, 2, 4, 8):
            for tokens in (2048, 8192):
                for role, m, n, k in (("qkv", tokens, 3 * mdl.hidden // tp, mdl.hidden),
                                      ("fc1", tokens, mdl.ffn_hidden // tp, mdl.hidden),
                                      ("fc2", tokens, mdl.hidden, mdl.ffn_hidden // tp)):
                    for pas, (a, b, c) in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (n, k, m))):
                        t = gemm_time(a, b, c) * (1 + noise * rng.standard_normal())
                        rows.append({"rank": 0, "step": 0, "stream": 0, "name": f"{name}/tp{tp}/tokens{tokens}/{role}/{pas}",
                                     "op_class": "gemm", "start_s": 0.0, "time_s": t, "aten_op": "aten::mm", "m": a,
                                     "n": b, "k": c, "batch": 1, "flops": 2.0 * a * b * c,
                                     "bytes": 2.0 * (a * c + c * b + a * b), "dtype": "bfloat16"})
    return pd.DataFrame(rows)


def allreduce_time(nbytes: np.ndarray, n: int) -> np.ndarray:
    """Known synthetic all-reduce: 30 us latency, 350 GB/s bus bandwidth (10^9 B/s)."""
    return 30e-6 + np.asarray(nbytes, float) * 2 * (n - 1) / n / 350e9


def collective_frame(group_sizes: tuple[int, ...] = (2, 8), kinds: tuple[str, ...] = ("all_reduce",),
                     noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = 2.0 ** np.arange(10, 31)
    rows = []
    for kind in kinds:
        for n in group_sizes:
            t = allreduce_time(sizes, n) * (1 + noise * rng.standard_normal(len(sizes)))
            for s, ti in zip(sizes, t, strict=True):
                alg = s / ti / 1e9
                rows.append({"kind": kind, "group_size": n, "bytes": s, "time_s": ti, "wait_s": np.nan,
                             "transfer_s": ti, "algbw_gbps": alg, "busbw_gbps": alg * 2 * (n - 1) / n, "repeats": 20})
    return pd.DataFrame(rows)


def manifest(kind: str, gpu: str = H200, count: int = 8, spec: RunSpec | None = None, **kw: object) -> Manifest:
    return Manifest(kind=kind, gpu=GpuInfo(name=gpu, count=count, power_limit_w=700.0), spec=spec, **kw)


def write_kernels(path: Path, gpu: str = H200, **kw: object) -> Path:
    w = BundleWriter(path, manifest("kernels", gpu))
    w.write_table("kernels", kernel_frame(**kw))
    return w.finish()


def write_collectives(path: Path, gpu: str = H200, **kw: object) -> Path:
    w = BundleWriter(path, manifest("collectives", gpu))
    w.write_table("collectives", collective_frame(**kw))
    return w.finish()


POWER_W = {"compute": 620.0, "memory": 450.0, "comm": 300.0, "idle": 120.0}


def write_training(path: Path, gemm_frac: float, mem_frac: float, mbs: int, gpu: str = H200,
                   gpus: int = 2, steps: int = 40, step_s: float = 0.05, first_gpu: int = 0) -> Path:
    """A training bundle whose GPU power follows POWER_W over the activity shares of its kernels."""
    spec = RunSpec(model="llama3-8b@L2", tp=gpus, micro_batch=mbs, global_batch=mbs, seq_length=2048)
    m = manifest("training", gpu, count=gpus, spec=spec, steps=StepsInfo(warmup=2, measured=steps - 2, profiled=[5]),
                 telemetry=TelemetryInfo(enabled=True, rate_hz=20.0, backend="nvml"))
    m.notes["physical_gpus"] = list(range(first_gpu, first_gpu + gpus))
    w = BundleWriter(path, m)
    t0 = 100.0
    srows, krows = [], []
    for r in range(gpus):
        for s in range(steps):
            srows.append({"rank": r, "step": s, "start_s": t0 + s * step_s, "time_s": step_s, "profiled": s == 5})
        # One profiled step: a GEMM block, a memory block, a comm block overlapping the memory one.
        st = t0 + 5 * step_s
        krows.append({"rank": r, "step": 5, "stream": 7, "name": "gemm", "op_class": "gemm", "start_s": st,
                      "time_s": gemm_frac * step_s})
        krows.append({"rank": r, "step": 5, "stream": 7, "name": "add", "op_class": "memory",
                      "start_s": st + gemm_frac * step_s, "time_s": mem_frac * step_s})
        krows.append({"rank": r, "step": 5, "stream": 9, "name": "ncclDevKernel_AllReduce", "op_class": "comm",
                      "start_s": st + gemm_frac * step_s, "time_s": (mem_frac + 0.1) * step_s})
    shares = {"compute": gemm_frac, "memory": mem_frac, "comm": 0.1, "idle": 1 - gemm_frac - mem_frac - 0.1}
    p_run = sum(POWER_W[a] * v for a, v in shares.items())
    trows = []
    times = np.arange(t0 - 3.0, t0 + steps * step_s + 3.0, 0.05)
    for g in range(gpus):
        e = 0.0
        prev = times[0]
        for t in times:
            busy = t0 <= t <= t0 + steps * step_s
            p = p_run if busy else POWER_W["idle"]
            e += p * (t - prev)
            prev = t
            trows.append({"gpu": g + first_gpu, "t_s": t, "power_w": p, "power_instant_w": p * 1.1, "energy_j": e,
                          "temp_gpu_c": 50.0, "temp_hbm_c": 50.0, "sm_clock_hz": 1.8e9 if busy else 3.45e8,
                          "mem_clock_hz": 3.2e9, "clock_event_reasons": 0 if busy else 1,
                          "util_gpu": 90.0 if busy else 0.0, "nvlink_tx_bytes": 0, "nvlink_rx_bytes": 0,
                          "pcie_tx_bytes": 0, "pcie_rx_bytes": 0})
    w.write_table("steps", pd.DataFrame(srows))
    w.write_table("kernels", pd.DataFrame(krows))
    for r in range(gpus):  # empty ETs: the bundle check wants one per rank of a profiled run
        write_et(ExecutionTrace(), w.dir("et") / f"rank.{r}.et.gz")
    w.write_table("telemetry", pd.DataFrame(trows))
    return w.finish()


def write_validation_set(root: Path) -> Path:
    """Kernel and collective microbenchmarks and three training configurations (TP 2 at micro-batch 1,
    2 and 4): the smallest set every held-out fit of `calib validate` can fit on."""
    write_kernels(root / "k")
    write_collectives(root / "c", group_sizes=(2,), kinds=("all_reduce",))
    for name, gemm, mem, mbs in (("t1", 0.5, 0.2, 1), ("t2", 0.6, 0.15, 2), ("t3", 0.55, 0.2, 4)):
        write_training(root / name, gemm, mem, mbs)
    return root
