"""Telemetry rate probe: how often the sampler really reads each column, per GPU, under load.

Runs measure.telemetry.Sampler on every visible GPU (or --gpus) for --seconds while one process per
GPU runs a bf16 matmul loop with a device-to-device copy to the next GPU (so the NVLink counters
move), then writes one JSON with, per GPU: achieved Hz per column (non-NaN samples per second),
each tier's rate and time per read call, the time of each single NVML call idle and under load,
the counters' deltas over the run, and (NVML) the NVLink all-links counter beside the per-link
sum so the two can be compared. --backend fake runs it on a CPU with a synthetic backend (output
marked `synthetic`).

    PYTHONPATH=. python3 measure/probes/telemetry_rate.py --out $OUT/telemetry-rate.json --seconds 20
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calib.bundle.schema import TELEMETRY_COLUMNS
from calib.errors import CalibError
from measure.telemetry import Sampler, column_rates_hz, open_backend

SCHEMA = "calib.probe.telemetry_rate/1"
COUNTER_COLUMNS = ("energy_j", "nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes")


def summarize_s(costs: list[float]) -> dict[str, float | int | None]:
    """median / p90 / max of call times in seconds, and how many."""
    if not costs:
        return {"median": None, "p90": None, "max": None, "count": 0}
    ordered = sorted(costs)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {"median": statistics.median(ordered), "p90": p90, "max": ordered[-1], "count": len(ordered)}


def time_calls(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict]:
    """Each call `repeats` times in a row; a call the GPU refuses is recorded with its error."""
    out: dict[str, dict] = {}
    for name, fn in calls.items():
        costs: list[float] = []
        try:
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                costs.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - unsupported call on this GPU/driver: say which
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name] = summarize_s(costs)
    return out


def _load_worker(gpu: int, peer: int, matmul_n: int, copy_bytes: int, stop: Any, ready: Any, done: Any) -> None:
    """One GPU's load: bf16 matmuls and a copy to the peer GPU, until `stop` is set."""
    try:
        import torch

        dev = torch.device("cuda", gpu)
        torch.cuda.set_device(dev)
        a = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
        src = dst = None
        if peer != gpu and copy_bytes > 0:
            src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
            dst = torch.empty(copy_bytes, dtype=torch.uint8, device=torch.device("cuda", peer))
        torch.cuda.synchronize(dev)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        ready.put((gpu, f"{type(exc).__name__}: {exc}"))
        return
    ready.put((gpu, ""))
    iterations = 0
    while not stop.is_set():
        for _ in range(16):
            a @ b  # noqa: B018 - the work is the point
        if dst is not None:
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        iterations += 1
    done.put((gpu, iterations))


class Load:
    """One spawned process per GPU (the sampler's process stays as light as the launcher's)."""

    def __init__(self, gpus: list[int], matmul_n: int, copy_mib: int, timeout_s: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        self.stop_event = ctx.Event()
        self.ready, self.done = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_load_worker, daemon=True, args=(
            g, gpus[(i + 1) % len(gpus)], matmul_n, copy_mib * 2**20, self.stop_event, self.ready, self.done))
            for i, g in enumerate(gpus)]
        for p in self.procs:
            p.start()
        errors = []
        self.running = 0  # workers that started their loop (and will report their iterations)
        for _ in self.procs:
            try:
                gpu, err = self.ready.get(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - queue.Empty: a worker hung or died
                self.stop()
                raise CalibError(f"telemetry probe: the GPU load did not start within {timeout_s:.0f} s") from None
            if err:
                errors.append(f"GPU {gpu}: {err}")
            else:
                self.running += 1
        if errors:
            self.stop()
            raise CalibError("telemetry probe: the GPU load could not start (" + "; ".join(errors) + ")")

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        iterations: dict[str, int] = {}
        for _ in range(self.running):
            try:
                gpu, n = self.done.get(timeout=30)
                iterations[str(gpu)] = n
            except Exception:  # noqa: BLE001 - a worker that failed to start sends nothing
                break
        for p in self.procs:
            p.join(timeout=10)
        return iterations


def open_probe_backend(kind: str, gpus: list[int] | None) -> Any:
    if kind == "fake":
        from measure.telemetry.fake import FakeBackend

        return FakeBackend(gpus)
    return open_backend(kind, gpus)


def run_probe(backend: Any, gpus: list[int], seconds: float, rate_hz: float, load: str = "matmul",
              matmul_n: int = 8192, copy_mib: int = 256, call_repeats: int = 100) -> dict:
    """Sample `gpus` for `seconds` under the load; the JSON-ready result."""
    calls = {g: backend.calls(g) for g in gpus} if hasattr(backend, "calls") else {}
    call_s: dict[str, dict] = {"idle": {str(g): time_calls(c, call_repeats) for g, c in calls.items()}}
    runner = Load(gpus, matmul_n, copy_mib) if load == "matmul" else None
    nvlink_before = {g: backend.nvlink_totals_bytes(g) for g in gpus} if hasattr(backend, "nvlink_totals_bytes") else {}
    iterations: dict[str, int] = {}
    try:
        if runner is not None:
            call_s["loaded"] = {str(g): time_calls(c, call_repeats) for g, c in calls.items()}
        t0 = time.monotonic()
        sampler = Sampler(backend, gpus, rate_hz, t0).start()
        deadline = t0 + seconds
        while time.monotonic() < deadline and not sampler.failure():
            time.sleep(0.05)
        sampler.stop()
        nvlink_after = {g: backend.nvlink_totals_bytes(g) for g in gpus} if nvlink_before else {}
    finally:
        if runner is not None:
            iterations = runner.stop()
    span = sampler.span_s()
    df = sampler.frame()
    rates = column_rates_hz(df, span)
    per_gpu: dict[str, dict] = {}
    for g in gpus:
        sub = df[df["gpu"] == g].sort_values("t_s")
        hz = rates.get(g, dict.fromkeys(TELEMETRY_COLUMNS[2:], 0.0))
        measured = {c: r for c, r in hz.items() if sub[c].notna().any()}
        deltas = {}
        for c in COUNTER_COLUMNS:
            vals = sub[c].dropna()
            deltas[c] = float(vals.iloc[-1] - vals.iloc[0]) if len(vals) >= 2 else None
        entry: dict[str, Any] = {
            "info": backend.info(g),
            "rows": len(sub),
            "columns_hz": {c: round(r, 2) for c, r in hz.items()},
            "min_column_hz": round(min(measured.values()), 2) if measured else None,
            "unsupported_columns": sorted(set(hz) - set(measured)),
            "counter_deltas": deltas,
        }
        if hasattr(backend, "nvlink_scope"):
            entry["nvlink_scope"] = backend.nvlink_scope(g)
        if nvlink_before:
            entry["nvlink_check_bytes"] = {k: nvlink_after[g][k] - nvlink_before[g][k] for k in nvlink_before[g]}
        per_gpu[str(g)] = entry
    return {
        "schema": SCHEMA,
        "synthetic": backend.name == "fake",
        "backend": backend.name,
        "host": socket.gethostname(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "asked_hz": rate_hz,
        "seconds": seconds,
        "span_s": span,
        "load": {"kind": load, "matmul_n": matmul_n, "copy_mib": copy_mib, "iterations": iterations},
        "failure": sampler.failure(),
        "achieved_rate_hz": round(sampler.achieved_rate_hz(), 2),
        "tiers": sampler.tier_report(),
        "read_s": {tier: {str(g): summarize_s(c) for g, c in per.items()} for tier, per in sampler.read_costs_s.items()},
        "call_s": call_s,
        "gpus": per_gpu,
    }


def write_json(path: Path, data: dict) -> None:
    """Atomically: a temp name, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _clean(value: Any) -> Any:
    """NaN/inf become null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="JSON to write")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate-hz", type=float, default=50.0, help="rate asked of the sampler (the worker's default)")
    ap.add_argument("--backend", default="auto", choices=["auto", "nvml", "amdsmi", "fake"])
    ap.add_argument("--gpus", default="", help="comma-separated GPU indices (default: all visible)")
    ap.add_argument("--load", default="matmul", choices=["matmul", "none"])
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--copy-mib", type=int, default=256, help="bytes copied to the next GPU per load iteration")
    ap.add_argument("--call-repeats", type=int, default=100)
    args = ap.parse_args(argv)
    try:
        if not (args.seconds > 0 and 0 < args.rate_hz <= 10_000):
            raise CalibError(f"telemetry probe: --seconds must be > 0 and --rate-hz in (0, 10000], "
                             f"got {args.seconds} and {args.rate_hz}")
        try:
            gpus = [int(x) for x in args.gpus.split(",")] if args.gpus else None
        except ValueError:
            raise CalibError(f"telemetry probe: --gpus must be comma-separated integers, got {args.gpus!r}") from None
        backend = open_probe_backend(args.backend, gpus)
        try:
            result = run_probe(backend, list(backend.gpus), args.seconds, args.rate_hz, args.load,
                               args.matmul_n, args.copy_mib, args.call_repeats)
        finally:
            backend.close()
        write_json(args.out, _clean(result))
    except CalibError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for g, entry in result["gpus"].items():
        tiers = ", ".join(f"{t} {info['rate_hz'].get(g)} Hz" for t, info in result["tiers"].items())
        print(f"GPU {g}: rows {entry['rows']}, min column {entry['min_column_hz']} Hz ({tiers}); "
              f"unsupported {entry['unsupported_columns']}")
    if result["failure"]:
        print(f"sampler failure: {result['failure']}", file=sys.stderr)
    print(f"wrote {args.out}")
    return 1 if result["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
