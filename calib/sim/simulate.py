"""The one entry point behind which both simulator backends sit."""

from __future__ import annotations

from calib.errors import CalibError
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.types import SimResult, SimWorkload

BACKENDS = ("analytical", "astrasim")


def simulate(
    workload: SimWorkload,
    network: NetworkConfig,
    system: SystemConfig,
    backend: str = "analytical",
    astra_sim_bin: str | None = None,
    timeline_path: str | None = None,
    breakdown: bool = True,
) -> SimResult:
    """Simulate one workload; `analytical` is the embedded simulator, `astrasim` runs the binary.
    `breakdown=False`: leave the per-category busy and exposed times empty (a caller wanting the step
    time alone, such as the host fit simulating each run at dozens of costs, saves an eighth of the time)."""
    network.check_ranks(workload.num_ranks)
    if backend == "analytical":
        from calib.sim.analytical import simulate_analytical

        return simulate_analytical(workload, network, system, timeline_path=timeline_path, breakdown=breakdown)
    if backend == "astrasim":
        from calib.sim.astrasim import run_astrasim

        if timeline_path:
            raise CalibError("a timeline (--timeline) needs the analytical backend; ASTRA-sim does not report node times")
        return run_astrasim(workload, network, system, astra_sim_bin=astra_sim_bin)
    raise CalibError(f"unknown simulator backend {backend!r}: choose one of {', '.join(BACKENDS)}")
