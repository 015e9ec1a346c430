"""`calib measure train`: validate, launch torchrun over the local GPUs (or gloo on CPU), sample
telemetry on the host meanwhile, and write one training bundle (complete or failed, never half).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from calib.bundle.io import BundleWriter
from calib.bundle.schema import (
    STEP_COLUMNS,
    STEP_OPTIONAL_COLUMNS,
    GpuInfo,
    Manifest,
    RankMemory,
    Software,
    StepsInfo,
    TelemetryInfo,
)
from calib.errors import CalibError
from measure import own_pace
from measure.env import child_env, host_cpu, host_name, software_versions, visible_gpus
from measure.proctree import kill_tree
from measure.request import TrainRequest
from measure.telemetry.host_pace import PACE_GAP_S, PACE_ITERATIONS, HostPaceSampler

REPO_ROOT = Path(__file__).resolve().parent.parent


def torchrun_argv(world: int, port: int, request_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", "--nnodes=1",
        "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "measure.worker", str(request_path),
    ]


def run_process(argv: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int | None, float]:
    """Run argv in its own process group; kill it and every process it started on timeout.
    (status or None, seconds)."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            rc = None
    return rc, time.monotonic() - start


def open_writer(out: str | Path, manifest: Manifest, overwrite: bool) -> BundleWriter:
    """A BundleWriter on an absolute path (workers run with cwd = the repo, so a relative path would
    name another folder there); an output that cannot be created is one CalibError line."""
    try:
        return BundleWriter(Path(out).absolute(), manifest, overwrite=overwrite)
    except OSError as exc:
        raise CalibError(f"bundle {out}: cannot create it: {exc.strerror or exc}") from None


# An exception line such as "RuntimeError: ..." or "torch.OutOfMemoryError: ..."; the launcher's own
# ChildFailedError only says that a child failed, not why.
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b:?")


def last_error_line(log: Path) -> str:
    """The most telling line of a crashed run's log (its last exception line that is not the launcher's)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        s = line.strip()
        if _EXC_LINE.match(s) and "ChildFailedError" not in s:
            return s[:300]
    for line in reversed(lines):
        s = line.strip()
        if s and ("Error" in s or "error" in s or "Exception" in s) and not s.startswith("File "):
            return s[:300]
    return lines[-1].strip()[:300] if lines else ""


def _gpu_info(backend: object, gpu: int, count: int) -> GpuInfo:
    info = backend.info(gpu)  # type: ignore[attr-defined]
    return GpuInfo(name=info["name"], count=count, memory_bytes=info["memory_bytes"], driver=info["driver"],
                   power_limit_w=info["power_limit_w"], vendor="amd" if backend.name == "amdsmi" else "nvidia")  # type: ignore[attr-defined]


def measure_training(
    req: TrainRequest, out: str | Path, overwrite: bool = False, telemetry_backend: str = "auto",
    convert: bool = True, raw_gzip: bool = True,
) -> Path:
    """Run one training measurement; return the bundle path (its manifest says complete or failed).

    convert=False skips the ET conversion (raw traces are kept; `calib measure convert` does it
    later); raw_gzip=False keeps them as plain JSON (for a transfer that compresses better as a whole).
    """
    cuda = req.device == "cuda"
    req.check(None)  # the configuration itself first: its reason beats "no GPU"
    gpus = visible_gpus() if cuda else []
    if cuda and not gpus:
        raise CalibError("no GPU visible (NVML finds none and CUDA_VISIBLE_DEVICES is empty); use --device cpu for the gloo path")
    model = req.check(len(gpus) if cuda else None)
    world = req.par.gpus
    gpus = gpus[:world]
    manifest = Manifest(
        kind="training", host=host_name(), spec=req.run_spec(model),
        steps=StepsInfo(warmup=req.warmup, measured=req.steps),
        telemetry=TelemetryInfo(enabled=bool(cuda and req.telemetry), rate_hz=0.0, backend="none"),
        notes=dict(req.notes),
    )
    manifest.notes["model_arch"] = model.to_dict()
    manifest.notes["physical_gpus"] = gpus
    manifest.notes["host_cpu"] = host_cpu()
    manifest.notes["clock"] = "start_s and t_s are seconds of CLOCK_MONOTONIC since the launcher started"
    if req.device == "cpu":
        manifest.gpu = GpuInfo(name="cpu", count=world, vendor="cpu")
        manifest.notes["cpu_path"] = "gloo + a small torch model (measure/cpu_model.py); not calibration data"
    if req.par.sequence_parallel and cuda:
        manifest.notes["sequence_parallel"] = (
            "megatron-core's torch norms refuse sequence parallel without Transformer Engine; calib uses its own "
            "norm whose params are marked sequence_parallel (measure/mcore.py)"
        )
    writer = open_writer(out, manifest, overwrite)
    work = writer.dir("work")
    req.work_dir = str(work)
    req.t0_monotonic = time.monotonic()
    request_path = work / "request.json"
    request_path.write_text(req.to_json())

    sampler = None
    backend = None
    pace = None
    env = child_env({"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
    try:
        if cuda:
            from measure.telemetry import Sampler, open_backend

            try:
                backend = open_backend(telemetry_backend, gpus)
                manifest.gpu = _gpu_info(backend, gpus[0], len(gpus))
            except CalibError as exc:
                if req.telemetry:
                    raise
                manifest.notes["gpu_info"] = f"unavailable: {exc}"
            if req.telemetry and backend is not None:
                manifest.telemetry.backend = backend.name  # type: ignore[attr-defined]
                if hasattr(backend, "supported"):
                    manifest.notes["telemetry_fields"] = backend.supported(gpus[0])
                sampler = Sampler(backend, gpus, req.telemetry_hz, req.t0_monotonic).start()
        if req.host_pace:
            pace = HostPaceSampler(work / "host_pace.log", req.t0_monotonic, cwd=REPO_ROOT, env=env).start()
        if cuda:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            # megatron-core wraps its fusions (bias-dropout-add, ...) in torch.compile; compiling
            # them cost ~75 s of a 2-GPU smoke run on H200. They run eagerly instead (the traces
            # show the unfused ops), unless the caller's environment says otherwise.
            env.setdefault("TORCHDYNAMO_DISABLE", "1")
            manifest.notes["torch_compile"] = "disabled" if env["TORCHDYNAMO_DISABLE"] == "1" else "enabled"
        log = work / "log.txt"
        rc, wall = run_process(torchrun_argv(world, req.master_port, request_path), env, log, req.timeout_s)
    except BaseException:
        for running in (sampler, pace):
            if running is not None:
                running.stop()
        shutil.rmtree(writer.tmp, ignore_errors=True)
        raise
    for running in (sampler, pace):
        if running is not None:
            running.stop()
    manifest.notes["wall_s"] = round(wall, 3)

    ranks = {}
    errors = []
    for r in range(world):
        f = work / f"rank.{r}.json"
        e = work / f"rank.{r}.error.json"
        if e.is_file():
            errors.append(json.loads(e.read_text()))
        if f.is_file():
            ranks[r] = json.loads(f.read_text())
    failure = ""
    if errors:
        errors.sort(key=lambda x: (not x.get("oom"), x["rank"]))
        failure = f"rank {errors[0]['rank']}: {errors[0]['error']}"
    elif rc is None:
        failure = f"timed out after {req.timeout_s:.0f} s and was killed"
    elif rc != 0:
        failure = f"torchrun exited with status {rc}: {last_error_line(log)}"
    elif len(ranks) < world:
        failure = f"rank(s) {sorted(set(range(world)) - set(ranks))} wrote no results"

    if ranks:
        rows = [row for r in sorted(ranks) for row in ranks[r]["steps"]]
        own = [c for c in STEP_OPTIONAL_COLUMNS if any(c in row for row in rows)]
        writer.write_table("steps", pd.DataFrame(rows, columns=STEP_COLUMNS + own))
        if own:
            manifest.notes["own_pace"] = {
                "launch": f"{own_pace.LAUNCHES} in-place adds on {own_pace.LAUNCH_FLOATS} floats, launched without waiting, "
                          "per launch",
                "work": f"{PACE_ITERATIONS} iterations of measure.telemetry.host_pace.python_work_us",
                "where": "the main thread of every rank, just after each measured step, outside its timing",
            }
        manifest.memory = [RankMemory(**ranks[r]["memory"]) for r in sorted(ranks)]
        first = ranks[min(ranks)]
        manifest.steps.profiled = list(first.get("profiled", []))
        manifest.notes["rank_info"] = first.get("info", {})
        sw = ranks.get(0, {}).get("software") or software_versions()
        manifest.software = Software(**{k: str(v) for k, v in sw.items() if k in Software.__dataclass_fields__})
        if cuda and "gpu" in ranks.get(0, {}) and not manifest.gpu.name:
            manifest.gpu = GpuInfo(name=ranks[0]["gpu"]["name"], count=world, memory_bytes=ranks[0]["gpu"]["memory_bytes"])
    if sampler is not None:
        tel = sampler.frame()
        if len(tel):
            writer.write_table("telemetry", tel)
        manifest.telemetry.rate_hz = round(sampler.achieved_rate_hz(), 2)
        manifest.notes["telemetry_slow_columns_rate_hz"] = {str(g): round(r, 2) for g, r in sampler.slow_rate_hz.items()}
        manifest.notes["telemetry_tiers"] = sampler.tier_report()
        if sampler.failure() and not failure:
            failure = sampler.failure()
    if backend is not None:
        backend.close()  # type: ignore[attr-defined]
    if pace is not None:
        _write_host_pace(writer, manifest, pace)

    if not failure and manifest.steps.profiled and convert:
        _convert_or_keep(work, writer.tmp, world, manifest, req.keep_raw, raw_gzip)
    elif req.keep_raw or (manifest.steps.profiled and not failure):
        from measure.convert import keep_raw

        if not convert:
            manifest.notes["et"] = "not converted yet (--no-convert): raw traces in raw/, run `calib measure convert`"
        keep_raw(work, writer.tmp / "raw", world, raw_gzip)
    stages = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[rank 0 +")] if log.is_file() else []
    if stages:
        manifest.notes["rank0_stages"] = stages
    if failure:
        _keep_log_tail(log, writer.tmp)
    shutil.rmtree(work, ignore_errors=True)
    return writer.fail(failure) if failure else writer.finish()


def _write_host_pace(writer: BundleWriter, manifest: Manifest, pace: HostPaceSampler) -> None:
    """The host-pace table and its rate; a sampler that saw nothing is noted, not an error: the
    steps are the measurement, the pace only explains them."""
    df = pace.frame()
    manifest.telemetry.host_pace_hz = round(pace.rate_hz(len(df)), 2)
    manifest.notes["host_pace"] = {
        "work": f"{PACE_ITERATIONS} iterations of measure.telemetry.host_pace.python_work_us, once per sample",
        "gap_s": PACE_GAP_S, "samples": len(df),
    }
    if len(df):
        writer.write_table("host_pace", df)


def _convert_or_keep(work: Path, bundle_dir: Path, world: int, manifest: Manifest, keep: bool, gz: bool) -> None:
    from measure.convert import convert_to, keep_raw, raw_paths

    host, dev = raw_paths(work, world)
    converted = False
    if len(host) == world:
        try:
            t = time.monotonic()
            manifest.notes.update(convert_to(bundle_dir, host, dev, manifest.steps.profiled[0]))
            manifest.notes["convert_s"] = round(time.monotonic() - t, 2)
            converted = True
        except Exception as exc:  # noqa: BLE001 - converter missing or failing: keep the raw traces
            manifest.notes["et"] = f"not converted ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); raw traces kept in raw/"
    else:
        manifest.notes["et"] = f"raw traces missing for rank(s) {sorted(set(range(world)) - set(host))}"
    if keep or not converted:
        keep_raw(work, bundle_dir / "raw", world, gz)


def _keep_log_tail(log: Path, bundle_dir: Path, lines: int = 80) -> None:
    if log.is_file():
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        (bundle_dir / "log_tail.txt").write_text("\n".join(tail) + "\n")
