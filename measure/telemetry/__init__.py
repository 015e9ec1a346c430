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
import statistics
import threading
import time
from typing import TYPE_CHECKING, Protocol

from calib.bundle.schema import TELEMETRY_COLUMNS, TELEMETRY_REQUIRED
from calib.errors import CalibError

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported where it is used: the host-pace sampler's child process (host_pace.py) starts
# through this package, and on a cold disk pandas and pyarrow alone took 8 s, the first seconds of a
# run it should have sampled (calib.bundle loads its reader, and with it pyarrow, on first use).


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


# Cumulative 64-bit link counters: read in a thread of their own per GPU (one batched call), since
# on NVML they cost tens of ms and would otherwise hold back power, clocks and temperatures.
LINK_COLUMNS = ("nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes")
FAST_TIER = "fast"
LINK_TIER = "links"


class Sampler:
    """Samples every GPU in `gpus` at `rate_hz` until stop(), in one or two tiers per GPU.

    Fast tier (one thread per GPU): every reading but the link counters, each sample. A backend
    with read_fast/read_links (NVML) also gets a link tier: a second thread per GPU that, woken by
    each fast tick, reads the NVLink and PCIe counters in one call and files them in that tick's
    row; it starts a read only within half a period of its tick, so a row's t_s is also when its
    link read began. A link read that outlasts a period makes the thread skip ticks, never the
    fast tier (NVML is thread-safe and ctypes releases the GIL during the call): link rate =
    rate_hz / ceil(read time / period). Skipped rows hold NaN in the link columns, never a
    repeated stale value. The counters are cumulative, so a window's
    delta is exact whatever the link rate. A backend with read() only (amdsmi) reads everything
    each fast tick. failure() says why sampling stopped early (NaN required reading, a GPU that
    stopped answering).
    """

    def __init__(self, backend: TelemetryBackend, gpus: list[int], rate_hz: float, t0: float) -> None:
        self.backend = backend
        self.gpus = list(gpus)
        self.period = 1.0 / rate_hz
        self.t0 = t0
        self.rows: list[dict] = []
        self.tiered = hasattr(backend, "read_fast") and hasattr(backend, "read_links")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure = ""
        self._threads = [threading.Thread(target=self._loop, args=(g,), name=f"calib-telemetry-{g}", daemon=True)
                         for g in self.gpus]
        # Link tier: the tick each GPU's link thread should read for, the event that wakes it, and
        # its readings by tick.
        self._link_tick: dict[int, tuple[int, float]] = {}
        self._link_wake = {g: threading.Event() for g in self.gpus}
        self._links: dict[int, dict[int, dict[str, float]]] = {g: {} for g in self.gpus}
        if self.tiered:
            self._threads += [threading.Thread(target=self._link_loop, args=(g,), name=f"calib-telemetry-links-{g}",
                                               daemon=True) for g in self.gpus]
        self.read_costs_s: dict[str, dict[int, list[float]]] = {
            tier: {g: [] for g in self.gpus} for tier in self.tiers()}
        self._started = 0.0
        self._stopped = 0.0
        # Rate of the slowest tier per GPU (the link counters; every column on a one-tier backend),
        # kept for the manifest's notes.telemetry_slow_columns_rate_hz.
        self.slow_rate_hz: dict[int, float] = {}

    def tiers(self) -> dict[str, tuple[str, ...]]:
        """Tier name -> the columns it reads."""
        readings = tuple(c for c in TELEMETRY_COLUMNS if c not in ("gpu", "t_s"))
        if not self.tiered:
            return {FAST_TIER: readings}
        return {FAST_TIER: tuple(c for c in readings if c not in LINK_COLUMNS), LINK_TIER: LINK_COLUMNS}

    def start(self) -> Sampler:
        self._started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def _fail(self, gpu: int, exc: Exception) -> None:
        if isinstance(exc, CalibError):
            msg = str(exc)
        else:  # a vendor library error: the GPU is gone or broken
            msg = f"telemetry: GPU {gpu} stopped answering mid-run ({type(exc).__name__}: {exc})"
        self._failure = self._failure or msg
        self._stop.set()
        for wake in self._link_wake.values():
            wake.set()

    def _loop(self, gpu: int) -> None:
        next_t = time.monotonic()
        tick = 0
        costs = self.read_costs_s[FAST_TIER][gpu]
        while not self._stop.is_set():
            t_read = time.monotonic()
            if self.tiered:
                self._link_tick[gpu] = (tick, t_read)
                self._link_wake[gpu].set()
            try:
                row = self.backend.read_fast(gpu) if self.tiered else self.backend.read(gpu)  # type: ignore[attr-defined]
                row["gpu"] = gpu
                row["t_s"] = t_read - self.t0
                check_sample(row, f"GPU {gpu}")
            except Exception as exc:  # noqa: BLE001 - CalibError or a vendor library error
                self._fail(gpu, exc)
                return
            costs.append(time.monotonic() - t_read)
            row["_tick"] = tick
            with self._lock:
                self.rows.append(row)
            tick += 1
            next_t += self.period
            delay = next_t - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_t = time.monotonic()  # fell behind: do not burst to catch up

    def _link_loop(self, gpu: int) -> None:
        wake, costs = self._link_wake[gpu], self.read_costs_s[LINK_TIER][gpu]
        while True:
            wake.wait()
            if self._stop.is_set():
                return
            wake.clear()
            tick, t_tick = self._link_tick[gpu]
            t_read = time.monotonic()
            if t_read - t_tick > 0.5 * self.period:
                continue  # that tick passed while the last read ran: wait for the next, to stay on time
            try:
                values = self.backend.read_links(gpu)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - a vendor library error
                self._fail(gpu, exc)
                return
            costs.append(time.monotonic() - t_read)
            with self._lock:
                self._links[gpu][tick] = values

    def stop(self) -> None:
        self._stop.set()
        for wake in self._link_wake.values():
            wake.set()
        for t in self._threads:
            t.join(timeout=10)
        self._stopped = time.monotonic()
        rates = self.tier_rates_hz()
        self.slow_rate_hz = dict(rates[LINK_TIER if self.tiered else FAST_TIER])

    def failure(self) -> str:
        return self._failure

    def span_s(self) -> float:
        """Seconds from start() to stop() (to now while running)."""
        return (self._stopped or time.monotonic()) - self._started

    def achieved_rate_hz(self) -> float:
        span = self.span_s()
        per_gpu = len(self.rows) / max(len(self.gpus), 1)
        return per_gpu / span if span > 0 else 0.0

    def tier_rates_hz(self) -> dict[str, dict[int, float]]:
        """Completed reads per second, per tier and GPU."""
        span = self.span_s()
        return {tier: {g: (len(c) / span if span > 0 else 0.0) for g, c in per_gpu.items()}
                for tier, per_gpu in self.read_costs_s.items()}

    def tier_report(self) -> dict[str, dict]:
        """JSON-ready per tier: its columns, achieved rate and median read time per GPU ("gpu" keys
        are strings), for the manifest's notes."""
        rates = self.tier_rates_hz()
        return {
            tier: {
                "columns": list(cols),
                "rate_hz": {str(g): round(r, 2) for g, r in rates[tier].items()},
                "read_median_s": {str(g): (round(float(statistics.median(c)), 6) if c else None)
                                  for g, c in self.read_costs_s[tier].items()},
            }
            for tier, cols in self.tiers().items()
        }

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        with self._lock:
            rows = list(self.rows)
            links = {g: dict(v) for g, v in self._links.items()}
        merged = []
        for row in rows:
            got = links.get(row["gpu"], {}).get(row["_tick"])
            merged.append({**row, **got} if got else row)
        df = pd.DataFrame(merged, columns=TELEMETRY_COLUMNS)
        df = df.sort_values(["t_s", "gpu"], kind="stable").reset_index(drop=True)
        df["gpu"] = df["gpu"].astype("int64")
        df["clock_event_reasons"] = df["clock_event_reasons"].astype("float64")
        return df


def column_rates_hz(df: pd.DataFrame, span_s: float) -> dict[int, dict[str, float]]:
    """Non-NaN samples per second of every reading column, per GPU, over `span_s` seconds."""
    if span_s <= 0:
        raise CalibError(f"telemetry: column rates need a positive span, got {span_s} s")
    cols = [c for c in TELEMETRY_COLUMNS if c not in ("gpu", "t_s")]
    return {int(g): {c: float(sub[c].notna().sum()) / span_s for c in cols} for g, sub in df.groupby("gpu")}
