"""A run's host pace read from its profiled step, for the runs whose trainer did not time its own pace.

`calib measure` times the trainer's own launch pace after every measured step from round 30 on
(measure/own_pace.py); the host model scales a timed run's launch and sync costs by it
(calib.models.host, `own_launch_ref_s`). The runs measured before carry no such timing, but every
training bundle keeps its profiled step as Chakra ETs, and under the profiler a step waits for its host:
the profiled GPT-3 1.3B step at sequence 256 spans 360-820 ms against 100-210 ms unprofiled. Its span per
converted node (calib.validation.measured.profiled_span_per_node_s) is then the launching host's time per
launch under the profiler, which on the timed runs follows their own launch pace (log against log, r +0.69
over the H200's 36 timed runs, +0.66 over the H100's 12; docs/host.md, "The profiled step's pace").

`ProfiledPace` is that line, fitted over the timed runs by least squares in log-log: the expected own launch
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


def fit_profiled_pace(spans: Sequence[float | None], paces: Sequence[float | None]) -> ProfiledPace | None:
    """The line over the runs that have both a profiled span per node and a timed own pace; None where fewer
    than MIN_RUNS have, or their pace does not grow with the span (no slope to carry)."""
    pairs = np.array([(s, p) for s, p in zip(spans, paces, strict=True) if s is not None and p is not None])
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
