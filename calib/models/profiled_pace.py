"""A run's host pace read from its profiled step, for the runs whose trainer did not time its own pace.

`calib measure` times the trainer's own launch pace after every measured step from round 30 on
(measure/own_pace.py); the host model scales a timed run's launch and sync costs by it
(calib.models.host, `own_launch_ref_s`). The runs measured before carry no such timing, but every
training bundle keeps its profiled step as Chakra ETs, and under the profiler a step waits for its host:
the profiled GPT-3 1.3B step at sequence 256 spans 360-820 ms against 100-210 ms unprofiled. Its span per
converted node (calib.validation.measured.profiled_span_per_node_s) is then the launching host's time per
launch under the profiler, which on the timed runs follows their own launch pace (log against log, r +0.69
over the H200's 36 timed runs, +0.66 over the H100's 12; docs/host.md, "The profiled step's pace").

`ProfiledPace` is that line, fitted by least squares in log-log over the timed runs of the configurations the
host paced (MIN_HOST_EXPOSURE, `config_exposures`), pipelines left out: the expected own launch
pace of a run given its profiled span per node. A run that did not time its pace is simulated at the pace
the line gives it; one that did, at its timed pace; a projection, at the reference pace (it has no profiled
step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calib.errors import CalibError

# Fewer timed runs than this leave the line unfitted (the untimed runs stay at the reference pace).
MIN_RUNS = 8
# The line is fitted over the timed runs of the configurations whose median measured step exceeds their median step
# simulated at no host cost by at least this share of it (`config_exposures`): twice calib.project.HOST_BOUND_SHARE.
# A configuration the host hardly paces lies within the kernel and network models' error of that step (the held-out
# runs predicted GPU-bound: under 7 % at most on either GPU; docs/validate.md), so its step says little
# of its host; and its profiled span per node is long kernels' time more than its host's: the 4-GPU H100 runs of
# round 37 (Llama-3 70B layers at TP 4 + SP, 4 % exposed; TP 2 x PP 2 + SP and Llama-3 8B at TP 2 x DP 2, 7 %) span
# 160-261 us a node at own paces of 6.6-10.3 us, where the host-paced runs span 110-180 us at 8-12 us, and with them
# the H100's line fell from slope 0.41 (r +0.66, 12 runs) to 0.09 (r +0.12). The exposure is the configuration's,
# not the run's: a run's own exposure falls with its host's pace, and selecting on it dropped the H200's two fastest
# timed hosts (llama8b-1gpu-s256-r31/-r31b, 4.5-6.5 % exposed, their configuration 11 %), truncating the line's fast
# end (docs/host.md, "The line over the runs their host paced").
MIN_HOST_EXPOSURE = 0.10
# Nor is a pipeline's profiled span its host's: each stage's profiled step also waits for the other stages (the bubble
# and the sends and receives between them), whatever its host's pace. The H100's first four-stage run (round 38,
# Llama-3 8B with full recomputation, 10.1 % exposed by the p2p syncs) spans 432 us a node at an own pace of 12.2 us,
# where the host-paced runs span 110-195 us at 8-12 us; with it the H100's line fell from slope 0.39 to 0.21. So the
# line is fitted over runs without pipeline parallelism (`pipelined`).
TIMED = "timed"  # where a run's own launch pace came from (`own_launch_of`)
PROFILED = "profiled step"


@dataclass(frozen=True)
class ProfiledPace:
    slope: float  # d log(own launch pace) / d log(span per node)
    log_intercept: float  # log(own launch pace, s) at a span per node of 1 s
    runs: int  # timed runs fitted on
    r: float  # their correlation, log against log

    def own_launch_s(self, span_per_node_s: float) -> float:
        """The own launch pace (seconds per tiny launch) expected of a run whose profiled step spans this
        much per node."""
        if not (math.isfinite(span_per_node_s) and span_per_node_s > 0):
            raise CalibError(f"profiled span per node {span_per_node_s!r} s must be a positive number")
        return float(math.exp(self.log_intercept + self.slope * math.log(span_per_node_s)))

    def to_dict(self) -> dict:
        return {"slope": float(self.slope), "log_intercept": float(self.log_intercept), "runs": int(self.runs),
                "r": float(self.r)}

    @classmethod
    def from_dict(cls, data: Any) -> ProfiledPace:
        try:
            out = cls(float(data["slope"]), float(data["log_intercept"]), int(data["runs"]), float(data["r"]))
        except (TypeError, KeyError, ValueError):
            raise CalibError("calibration host section: profiled_pace must be a mapping with numbers slope, "
                             "log_intercept, runs and r") from None
        if not all(math.isfinite(x) for x in (out.slope, out.log_intercept, out.r)) or out.slope <= 0 or out.runs < 2:
            raise CalibError(f"calibration host section: profiled_pace {out.to_dict()} needs a finite positive slope "
                             "and at least two runs")
        return out


def host_exposure(measured_s: float, zero_host_s: float) -> float:
    """The share of a measured step beyond its step simulated at no host cost: how much its host paced it."""
    return float(1.0 - zero_host_s / measured_s) if measured_s > 0 else 0.0


def config_exposures(keys: Sequence[str], measured_s: Sequence[float], zero_host_s: Sequence[float]) -> list[float]:
    """Each run's configuration's host exposure: its median measured step against its median step at no host cost
    (`host_exposure`), over the runs sharing its key; so repeats of one configuration are kept or left out
    together, whatever their own hosts' paces."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = [0.0] * len(keys)
    for members in groups.values():
        e = host_exposure(float(np.median([measured_s[i] for i in members])),
                          float(np.median([zero_host_s[i] for i in members])))
        for i in members:
            out[i] = e
    return out


def fit_profiled_pace(spans: Sequence[float | None], paces: Sequence[float | None],
                      exposures: Sequence[float] | None = None,
                      pipelined: Sequence[bool] | None = None) -> ProfiledPace | None:
    """The line over the runs that have both a profiled span per node and a timed own pace, where `exposures` are
    given a host exposure of at least MIN_HOST_EXPOSURE, and where `pipelined` is given no pipeline parallelism; None
    where fewer than MIN_RUNS have, or their pace does not grow with the span (no slope to carry)."""
    paced = [True] * len(spans) if exposures is None else [e >= MIN_HOST_EXPOSURE for e in exposures]
    if pipelined is not None:
        paced = [ok and not pp for ok, pp in zip(paced, pipelined, strict=True)]
    pairs = np.array([(s, p) for s, p, ok in zip(spans, paces, paced, strict=True)
                      if s is not None and p is not None and ok])
    if len(pairs) < MIN_RUNS:
        return None
    x, y = np.log(pairs[:, 0]), np.log(pairs[:, 1])
    if np.ptp(x) == 0:
        return None
    slope, icept = np.polyfit(x, y, 1)
    if not slope > 0:
        return None
    return ProfiledPace(float(slope), float(icept), len(pairs), float(np.corrcoef(x, y)[0, 1]))


def own_launch_of(timed_s: float | None, span_per_node_s: float | None,
                  line: ProfiledPace | None) -> tuple[float | None, str | None]:
    """A run's own launch pace and where it came from: timed by its trainer, else from its profiled step by
    `line`, else (None, None): the reference pace."""
    if timed_s is not None:
        return timed_s, TIMED
    if span_per_node_s is not None and line is not None:
        return line.own_launch_s(span_per_node_s), PROFILED
    return None, None
