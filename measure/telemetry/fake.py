"""A synthetic telemetry backend for running the sampler and the rate probe without a GPU.

SYNTHETIC: its readings are known functions of time (constant power, energy its integral, link
counters growing at fixed rates), never measurements; the probe marks its output `synthetic`.
Each read sleeps for a set cost, standing in for the time an NVML call takes, so the tiers' rates
can be exercised on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POWER_W = 300.0
NVLINK_BYTES_PER_S = 1.0e9
PCIE_BYTES_PER_S = 1.0e8


class FakeBackend:
    name = "fake"

    def __init__(self, gpus: list[int] | None = None, fast_cost_s: float = 0.001,
                 link_cost_s: float = 0.03) -> None:
        self.gpus = list(gpus) if gpus is not None else [0, 1]
        self.fast_cost_s = fast_cost_s
        self.link_cost_s = link_cost_s
        self.t_start = time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def read_fast(self, gpu: int) -> dict[str, float]:
        t = self._elapsed()
        time.sleep(self.fast_cost_s)
        return {
            "power_w": POWER_W, "power_instant_w": POWER_W, "energy_j": POWER_W * t,
            "temp_gpu_c": 40.0 + gpu, "temp_hbm_c": 45.0 + gpu, "sm_clock_hz": 1.98e9, "mem_clock_hz": 3.2e9,
            "clock_event_reasons": 0.0, "util_gpu": 1.0,
        }

    def read_links(self, gpu: int) -> dict[str, float]:
        t = self._elapsed()
        time.sleep(self.link_cost_s)
        return {
            "nvlink_tx_bytes": NVLINK_BYTES_PER_S * t, "nvlink_rx_bytes": NVLINK_BYTES_PER_S * t,
            "pcie_tx_bytes": PCIE_BYTES_PER_S * t, "pcie_rx_bytes": PCIE_BYTES_PER_S * t,
        }

    def read(self, gpu: int) -> dict[str, float]:
        return {**self.read_fast(gpu), **self.read_links(gpu)}

    def calls(self, gpu: int) -> dict[str, Callable[[], object]]:
        return {"read_fast": lambda: self.read_fast(gpu), "read_links": lambda: self.read_links(gpu)}

    def info(self, gpu: int) -> dict:
        return {"name": "fake (synthetic)", "memory_bytes": 0, "driver": "none", "power_limit_w": 700.0}

    def close(self) -> None:
        pass
