"""Run many `calib measure` jobs on one host: each on its own block of GPUs, concurrently where
they fit, within a wall-clock budget. Jobs run as separate `python -m calib measure ...` processes
(distinct CUDA_VISIBLE_DEVICES and MASTER_PORTs), so a crash or OOM in one cannot take another down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from measure.env import child_env
from measure.proctree import kill_tree

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    id: str
    gpus: int
    args: list[str]  # after `python -m calib measure`
    est_s: float = 60.0
    timeout_s: float = 240.0
    # filled while running
    block: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    rc: int | None = None
    wall_s: float = 0.0
    note: str = ""


def _free_block(free: set[int], n: int, total: int) -> list[int] | None:
    for start in range(0, total - n + 1, n):
        block = list(range(start, start + n))
        if all(g in free for g in block):
            return block
    return None


def run_jobs(
    jobs: list[Job], total_gpus: int, budget_s: float, log_dir: Path, port_base: int = 29500,
    hard_s: float | None = None,
) -> list[Job]:
    """Start jobs in list order as GPUs free up (later jobs may backfill), none past the budget;
    at hard_s kill whatever still runs (its bundle stays a .partial folder, which readers refuse)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    free = set(range(total_gpus))
    pending = list(jobs)
    running: list[Job] = []
    port = port_base
    while pending or running:
        now = time.monotonic() - t0
        for job in list(pending):
            if job.gpus > total_gpus:
                job.note = f"needs {job.gpus} GPUs, host has {total_gpus}"
                pending.remove(job)
                continue
            if now + job.est_s > budget_s:
                continue
            block = _free_block(free, job.gpus, total_gpus)
            if block is None:
                continue
            port += 7
            job.block = block
            free -= set(block)
            env = child_env({
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, block)),
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            })
            argv = [sys.executable, "-m", "calib", "measure", *job.args]
            if job.args and job.args[0] in ("train", "collectives"):
                argv += ["--master-port", str(port)]
            log = open(log_dir / f"{job.id}.log", "wb")  # noqa: SIM115 - closed when the job ends
            log.write((" ".join(argv) + f"\n# CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}\n").encode())
            log.flush()
            job.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                        start_new_session=True)
            job.proc._calib_log = log  # type: ignore[attr-defined]
            job.started = time.monotonic()
            pending.remove(job)
            running.append(job)
            print(f"[{now:6.1f}s] start {job.id} on GPUs {block}", flush=True)
        if not running:
            if pending:
                for job in pending:
                    job.note = "not started: the time budget ran out"
                    print(f"[{now:6.1f}s] skip {job.id}: {job.note}", flush=True)
            break
        time.sleep(0.5)
        for job in list(running):
            assert job.proc is not None
            rc = job.proc.poll()
            elapsed = time.monotonic() - job.started
            if rc is None and hard_s is not None and time.monotonic() - t0 > hard_s:
                kill_tree(job.proc.pid)
                rc = job.proc.wait()
                job.note = f"killed at the campaign's hard deadline ({hard_s:.0f} s)"
            if rc is None and elapsed > job.timeout_s + 60:
                kill_tree(job.proc.pid)
                rc = job.proc.wait()
                job.note = "killed by the campaign's outer timeout"
            if rc is not None:
                job.rc = rc
                job.wall_s = round(elapsed, 2)
                job.proc._calib_log.close()  # type: ignore[attr-defined]
                free |= set(job.block)
                running.remove(job)
                print(f"[{time.monotonic() - t0:6.1f}s] done  {job.id} rc={rc} in {elapsed:.1f}s", flush=True)
    return jobs


def summary(jobs: list[Job]) -> list[dict]:
    return [
        {"id": j.id, "gpus": j.block, "args": j.args, "rc": j.rc, "wall_s": j.wall_s, "note": j.note}
        for j in jobs
    ]


def write_summary(jobs: list[Job], path: Path) -> None:
    path.write_text(json.dumps(summary(jobs), indent=1))
