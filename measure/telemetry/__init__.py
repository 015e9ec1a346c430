"""GPU telemetry: one interface, a vendor module each (nvml.py, amdsmi.py), one sampler thread.

Why not zeus (ml-energy/zeus)? It is not installed on the GPU image and nothing can be fetched
there; its energy windows cover power and energy only, while calib needs one time series of
power, energy, temperatures, clocks, clock-event reasons, utilisation and NVLink/PCIe counters per
GPU, on the same clock as the step start times, so that the fit can align them to steps. The
backends here are small (one read() per GPU) and never return a silent 0 or -1: a reading a GPU
cannot give is NaN for the whole run, and a required reading (power, energy) that fails is an error.

Units (schema columns, calib.bundle.schema.TELEMETRY_COLUMNS): t_s seconds since the launcher's
clock origin (CLOCK_MONOTONIC, the clock the workers stamp step starts with), power_w and
power_instant_w watts, energy_j joules (the GPU's own counter, monotonic), temperatures in degrees
C, clocks in Hz, clock_event_reasons the vendor bit mask, util_gpu a fraction 0-1, link counters in
bytes (cumulative, 64-bit).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol

import pandas as pd

from calib.bundle.schema import TELEMETRY_COLUMNS, TELEMETRY_REQUIRED
from calib.errors import CalibError


class TelemetryBackend(Protocol):
    name: str

    def read(self, gpu: int) -> dict[str, float]:
        """One sample of every TELEMETRY_COLUMNS reading but gpu/t_s, in SI units (NaN if absent)."""
        ...

    def info(self, gpu: int) -> dict:
        """name, memory_bytes, driver, power_limit_w of one GPU."""
        ...

    def close(self) -> None: ...


def check_sample(row: dict, where: str) -> None:
    """A required reading that is NaN or missing is an error naming the GPU and the reading."""
    for col in TELEMETRY_REQUIRED:
        value = row.get(col)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise CalibError(f"telemetry: {where}: {col} reading is NaN or missing")


def open_backend(kind: str = "auto", gpus: list[int] | None = None) -> TelemetryBackend:
    """NVML, amdsmi, or (auto) whichever loads. Raises CalibError when the one asked for cannot."""
    errors = []
    if kind in ("auto", "nvml"):
        try:
            from measure.telemetry.nvml import NvmlBackend

            return NvmlBackend(gpus)
        except CalibError as exc:
            errors.append(str(exc))
    if kind in ("auto", "amdsmi"):
        try:
            from measure.telemetry.amdsmi import AmdSmiBackend

            return AmdSmiBackend(gpus)
        except CalibError as exc:
            errors.append(str(exc))
    raise CalibError("no telemetry backend: " + "; ".join(errors or [f"unknown backend {kind!r}"]))


SLOW_COLUMNS = ("temp_gpu_c", "temp_hbm_c", "util_gpu", "nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes")


class Sampler:
    """Samples every GPU in `gpus` at `rate_hz`, one thread per GPU, until stop().

    A backend with read_fast/read_slow (NVML) has its cheap readings (power, energy, clocks) taken
    every sample and its slow ones (temperatures, utilisation, link counters: ~10 ms on an H200)
    every `stride` samples, the stride adapting so a GPU's thread keeps the rate; rows in between
    hold NaN in the slow columns (never a repeated stale value). failure() says why sampling
    stopped early (NaN required reading, a GPU that stopped answering).
    """

    def __init__(self, backend: TelemetryBackend, gpus: list[int], rate_hz: float, t0: float) -> None:
        self.backend = backend
        self.gpus = list(gpus)
        self.period = 1.0 / rate_hz
        self.t0 = t0
        self.rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure = ""
        self._threads = [threading.Thread(target=self._loop, args=(g,), name=f"calib-telemetry-{g}", daemon=True)
                         for g in self.gpus]
        self._started = 0.0
        self._stopped = 0.0
        self.slow_rate_hz: dict[int, float] = {}

    def start(self) -> Sampler:
        self._started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def _sample(self, gpu: int, slow: bool) -> dict:
        b = self.backend
        if hasattr(b, "read_fast"):
            row = b.read_fast(gpu)  # type: ignore[attr-defined]
            if slow:
                row.update(b.read_slow(gpu))  # type: ignore[attr-defined]
            else:
                row.update(dict.fromkeys(SLOW_COLUMNS, math.nan))
        else:
            row = b.read(gpu)
        return row

    def _loop(self, gpu: int) -> None:
        next_t = time.monotonic()
        tick, stride, slow_cost, slow_reads = 0, 1, 0.0, 0
        while not self._stop.is_set():
            slow = tick % stride == 0
            try:
                t_read = time.monotonic()
                row = self._sample(gpu, slow)
                row["gpu"] = gpu
                row["t_s"] = t_read - self.t0
                check_sample(row, f"GPU {gpu}")
            except CalibError as exc:
                self._failure = self._failure or str(exc)
                self._stop.set()
                return
            except Exception as exc:  # noqa: BLE001 - a vendor library error: the GPU is gone or broken
                self._failure = self._failure or f"telemetry: GPU {gpu} stopped answering mid-run ({type(exc).__name__}: {exc})"
                self._stop.set()
                return
            cost = time.monotonic() - t_read
            if slow:
                slow_reads += 1
                slow_cost = cost if slow_cost == 0 else 0.8 * slow_cost + 0.2 * cost
                stride = max(1, math.ceil(2.0 * slow_cost / self.period))
            with self._lock:
                self.rows.append(row)
            tick += 1
            next_t += self.period
            delay = next_t - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_t = time.monotonic()  # fell behind: do not burst to catch up
        span = time.monotonic() - self._started
        self.slow_rate_hz[gpu] = slow_reads / span if span > 0 else 0.0

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._stopped = time.monotonic()

    def failure(self) -> str:
        return self._failure

    def achieved_rate_hz(self) -> float:
        span = (self._stopped or time.monotonic()) - self._started
        per_gpu = len(self.rows) / max(len(self.gpus), 1)
        return per_gpu / span if span > 0 else 0.0

    def frame(self) -> pd.DataFrame:
        with self._lock:
            rows = list(self.rows)
        df = pd.DataFrame(rows, columns=TELEMETRY_COLUMNS)
        df = df.sort_values(["t_s", "gpu"], kind="stable").reset_index(drop=True)
        df["gpu"] = df["gpu"].astype("int64")
        df["clock_event_reasons"] = df["clock_event_reasons"].astype("float64")
        return df
