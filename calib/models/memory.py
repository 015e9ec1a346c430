"""Device memory beyond the estimate of what torch allocates: the allocator's reserve and what the
process holds outside it, fitted on measured runs, and the out-of-memory verdict they give.

The workload's memory estimate (calib.workload.memory) counts the bytes torch allocates at the peak.
A GPU runs out when the device's used memory reaches its capacity, and the device holds more:
- torch's caching allocator reserves whole segments; at the measured peaks it held 1.00-1.21x the
  allocated bytes (`reserve_ratio`, per run peak_reserved / peak_allocated). Under memory pressure it
  frees its cached segments and retries before it fails, so the ratio seen without pressure is an upper
  bound on what a run that barely fits needs, not a requirement.
- the process holds memory outside the allocator (`outside_allocator_bytes`): the CUDA context and the
  NCCL communicators' buffers. measure.probes.outside_memory splits the 8.89 GiB of every one-GPU
  round-13 run (traces/README.md, round 13): 0.6 GiB of CUDA context, 0.55 GiB for the process group's
  communicator, 7.6 GiB for the communicators megatron-core's parallel groups create at start-up (the
  process group is bound to its device, so each group's NCCL communicator is created then), 0.1 GiB
  in the first steps.
So the device peak lies between estimate + outside (the allocator fully packed) and
estimate x reserve_ratio + outside (as packed as the measured runs). The verdict: "fits" when the upper
end is within the capacity, "tight" when only the lower end is (it may or may not fit), "out of memory"
when even the lower end is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from calib.errors import CalibError
from calib.models.common import NO_FITTED_PARAMETER, ErrorStat, error_stat

VERDICTS = ("fits", "tight", "out of memory")


@dataclass(frozen=True)
class MemoryPoint:
    """One measured training run: the estimate for its configuration and what its ranks held."""

    bundle: str
    config: str
    estimate_bytes: float  # calib.workload.memory's total for the run's most loaded GPU
    allocated_bytes: float  # the largest peak allocated over the run's ranks
    reserved_bytes: float  # the largest peak reserved over the ranks
    outside_bytes: float | None  # the most held outside the allocator over the ranks; None = not recorded
    capacity_bytes: float = 0.0  # the device's total memory as the run's CUDA saw it; 0 = not recorded
    gpus: int = 1  # the GPUs of the run (all on one host)

    @property
    def reserve_ratio(self) -> float:
        return self.reserved_bytes / self.allocated_bytes

    @property
    def device_bytes(self) -> float | None:
        """The device's peak use: the allocator's peak reserve plus what is held outside it."""
        return None if self.outside_bytes is None else self.reserved_bytes + self.outside_bytes


@dataclass
class MemoryModel:
    reserve_ratio: float  # the largest peak reserved / peak allocated over the fitted runs
    reserve_ratio_median: float
    outside_allocator_bytes: float  # the most held outside the allocator by a fitted run's rank
    runs: int  # runs the reserve ratio rests on
    outside_runs: int  # runs that recorded the memory outside the allocator
    # The device's total memory as CUDA reports it (the smallest over the runs; 0 = not recorded): the
    # datasheets' "80 GB" and "141 GB" are 79.6 and 140.4 GiB on the measured H100 and H200, not 80e9
    # and 141e9 bytes.
    capacity_bytes: float = 0.0
    bundles: list[str] = field(default_factory=list)
    # Per GPU count of the fitted runs: the most held outside the allocator by a rank of such a run. A
    # rank holds a communicator's buffers per group it is in and per peer it connects to, so the runs on
    # four GPUs held 13.0-15.9 GiB where those on one or two held 8.8-8.9 (round 23). Empty in files
    # written before it: `outside_allocator_bytes` for every count.
    outside_by_gpus: dict[int, float] = field(default_factory=dict)

    @classmethod
    def fit(cls, points: Sequence[MemoryPoint]) -> MemoryModel:
        usable = [p for p in points if p.allocated_bytes > 0 and p.reserved_bytes > 0]
        if not usable:
            raise CalibError("no training bundle recorded its peak allocated and reserved memory")
        ratios = np.array([p.reserve_ratio for p in usable])
        outside = [p.outside_bytes for p in usable if p.outside_bytes is not None]
        capacity = [p.capacity_bytes for p in usable if p.capacity_bytes > 0]
        by_gpus: dict[int, float] = {}
        for p in usable:
            if p.outside_bytes is not None:
                by_gpus[p.gpus] = max(by_gpus.get(p.gpus, 0.0), float(p.outside_bytes))
        return cls(
            reserve_ratio=float(max(ratios.max(), 1.0)), reserve_ratio_median=float(np.median(ratios)),
            outside_allocator_bytes=float(max(outside)) if outside else 0.0, runs=len(usable),
            outside_runs=len(outside), capacity_bytes=float(min(capacity)) if capacity else 0.0,
            bundles=sorted(p.bundle for p in usable), outside_by_gpus=dict(sorted(by_gpus.items())),
        )

    def outside_for(self, gpus: int | None = None) -> float:
        """What a rank of a run on `gpus` GPUs holds outside the allocator: the value of the largest measured
        GPU count not above `gpus` (the smallest measured count's where all are above it; nothing is
        extrapolated beyond the largest), or the most of any run where no counts were recorded or `gpus`
        is None."""
        if gpus is None or not self.outside_by_gpus:
            return self.outside_allocator_bytes
        counts = sorted(self.outside_by_gpus)
        below = [n for n in counts if n <= gpus]
        return self.outside_by_gpus[below[-1] if below else counts[0]]

    def device_bytes(self, estimate_bytes: float, gpus: int | None = None) -> tuple[float, float]:
        """The device peak for an allocator estimate: (allocator fully packed, packed as measured)."""
        outside = self.outside_for(gpus)
        return estimate_bytes + outside, estimate_bytes * self.reserve_ratio + outside

    def verdict(self, estimate_bytes: float, capacity_bytes: float, gpus: int | None = None) -> str:
        return _verdict(*self.device_bytes(estimate_bytes, gpus), capacity_bytes)

    def to_dict(self) -> dict:
        return {
            "reserve_ratio": round(self.reserve_ratio, 4), "reserve_ratio_median": round(self.reserve_ratio_median, 4),
            "outside_allocator_bytes": int(self.outside_allocator_bytes), "runs": self.runs,
            "outside_runs": self.outside_runs, "capacity_bytes": int(self.capacity_bytes),
            "outside_allocator_bytes_by_gpus": {str(n): int(v) for n, v in self.outside_by_gpus.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> MemoryModel:
        try:
            by_gpus = {int(n): float(v) for n, v in (data.get("outside_allocator_bytes_by_gpus") or {}).items()}
            return cls(float(data["reserve_ratio"]), float(data["reserve_ratio_median"]),
                       float(data["outside_allocator_bytes"]), int(data["runs"]), int(data["outside_runs"]),
                       float(data.get("capacity_bytes") or 0.0), outside_by_gpus=by_gpus)
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibError(f"calibration memory section is malformed ({exc})") from exc


def memory_errors(points: Sequence[MemoryPoint]) -> tuple[dict[str, ErrorStat], dict]:
    """The estimate's error against the measured peaks, and the verdict's bracket held out.

    `memory`: the allocator estimate against each run's peak allocated (no fitted parameter).
    `memory.device_peak`: the device peak predicted at the median reserve ratio plus the memory outside
    the allocator at the run's GPU count, both fitted on the other configurations (leave one configuration out), against the
    measured device peak of the runs that recorded it. The second value returned says for how many of
    those runs the measured device peak stayed within the bracket's upper end fitted without them (what
    a verdict of "fits" rests on), and the worst excess in percent."""
    pts = [p for p in points if p.allocated_bytes > 0 and p.reserved_bytes > 0]
    errors: dict[str, ErrorStat] = {}
    held = {"runs": 0, "within": 0, "worst_excess_pct": 0.0}
    if pts:
        errors["memory"] = error_stat(np.array([p.estimate_bytes for p in pts]), np.array([p.allocated_bytes for p in pts]),
                                      f"{NO_FITTED_PARAMETER}: estimate against the measured peak allocated, all runs")
    pred, meas = [], []
    for p in pts:
        others = [q for q in pts if q.config != p.config]
        if p.device_bytes is None or not any(q.outside_bytes is not None for q in others):
            continue
        m = MemoryModel.fit(others)
        pred.append(p.estimate_bytes * m.reserve_ratio_median + m.outside_for(p.gpus))
        meas.append(p.device_bytes)
        excess = 100.0 * (p.device_bytes - m.device_bytes(p.estimate_bytes, p.gpus)[1]) / p.device_bytes
        held["runs"] += 1
        held["within"] += int(excess <= 0)
        held["worst_excess_pct"] = round(max(held["worst_excess_pct"], excess), 3)
    if pred:
        errors["memory.device_peak"] = error_stat(
            np.array(pred), np.array(meas),
            "leave-one-configuration-out: estimate x median reserve ratio + memory outside the allocator at "
            "the run's GPU count, against the measured device peak")
    return errors, held


@dataclass(frozen=True)
class DeviceMemory:
    """The out-of-memory verdict of one configuration on one GPU (bytes)."""

    estimate_bytes: float  # what torch allocates at the peak (calib.workload.memory)
    capacity_bytes: float
    low_bytes: float  # the device peak with the allocator fully packed
    high_bytes: float  # the device peak with the allocator as packed as in the measured runs
    outside_bytes: float
    verdict: str  # VERDICTS
    calibrated: bool  # False: no memory model, the allocator estimate alone against the capacity

    @property
    def fits(self) -> bool:
        """Not refused: "tight" may fit (the allocator frees its cache before it fails)."""
        return self.verdict != "out of memory"


def _verdict(low_bytes: float, high_bytes: float, capacity_bytes: float) -> str:
    """VERDICTS for a device peak bracketed by [low, high]; without a model the bracket is one point."""
    if high_bytes <= capacity_bytes:
        return "fits"
    return "tight" if low_bytes <= capacity_bytes else "out of memory"


def device_memory(estimate_bytes: float, capacity_bytes: float, model: MemoryModel | None,
                  gpus: int | None = None) -> DeviceMemory:
    """The verdict for one GPU of a run on `gpus` GPUs (MemoryModel.outside_for; None: the most measured)."""
    low, high = (estimate_bytes, estimate_bytes) if model is None else model.device_bytes(estimate_bytes, gpus)
    outside = 0.0 if model is None else model.outside_for(gpus)
    return DeviceMemory(estimate_bytes, capacity_bytes, low, high, outside, _verdict(low, high, capacity_bytes),
                        model is not None)
