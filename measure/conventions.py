"""nccl-tests' bandwidth conventions (one place): sizes, algbw and busbw of each collective.

Sizes follow nccl-tests: all-reduce, broadcast, all-to-all and send/recv by the buffer each rank
holds; all-gather by its total OUTPUT (n x the per-rank input) and reduce-scatter by its total
INPUT. algbw = bytes / time; busbw = algbw x factor, with factor 2(n-1)/n for all-reduce, (n-1)/n
for all-gather, reduce-scatter and all-to-all, 1 for send/recv and broadcast. GB/s are 10^9 B/s.
"""

from __future__ import annotations

import math

from calib import units
from calib.errors import CalibError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor; NaN for a kind with no convention (gather, scatter, ...).

    The factors themselves live in calib.models.network (one place); this only maps kinds it does
    not know to NaN rather than an error, since a training step may hold any collective.
    """
    from calib.models.network import bus_factor as factor

    try:
        return factor(kind, n)
    except CalibError:
        return math.nan


def bandwidths_gbps(kind: str, n: int, nbytes: float, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in nccl-tests GB/s for `nbytes` sized by the convention above."""
    if not time_s > 0:
        return math.nan, math.nan
    alg = units.bytes_per_s_to_nccl_gbps(nbytes / time_s)
    return alg, alg * bus_factor(kind, n)
