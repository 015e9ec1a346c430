"""Unit conversions at calib's edges; inside calib everything is SI (s, B, B/s, W, J, Hz).

Each foreign unit has exactly one function here (see docs/design.md, "Units").
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
KIB = 2**10


def astra_bw_gbps_to_bytes_per_s(gbps: float) -> float:
    """ASTRA-sim network `bandwidth` is GB/s with GB = 2^30 bytes."""
    return gbps * 2**30


def bytes_per_s_to_astra_bw_gbps(bps: float) -> float:
    return bps / 2**30


def astra_local_mem_bw_to_bytes_per_s(gbps: float) -> float:
    """ASTRA-sim `local-mem-bw` is GB/s with GB = 10^9 bytes."""
    return gbps * 1e9


def bytes_per_s_to_astra_local_mem_bw(bps: float) -> float:
    return bps / 1e9


def nccl_gbps_to_bytes_per_s(gbps: float) -> float:
    """nccl-tests algbw/busbw are GB/s with GB = 10^9 bytes."""
    return gbps * 1e9


def bytes_per_s_to_nccl_gbps(bps: float) -> float:
    return bps / 1e9


def nic_gbit_to_bytes_per_s(gbit: float) -> float:
    """NIC line rates are Gb/s with Gb = 10^9 bits."""
    return gbit * 1e9 / 8


def micros_to_s(us: float) -> float:
    """Chakra `duration_micros` is 10^-6 s."""
    return us * 1e-6


def s_to_micros_rounded(s: float) -> int:
    """Nearest whole microsecond, as Chakra's duration_micros holds it."""
    return int(round(s * 1e6))


def ns_to_s(ns: float) -> float:
    return ns * 1e-9


def s_to_ns(s: float) -> int:
    return int(round(s * 1e9))


# Vendor telemetry (NVML reports mW, mJ, MHz, KiB counters; amdsmi reports W, uJ, MHz, KB).
def mw_to_w(mw: float) -> float:
    return mw * 1e-3


def mj_to_j(mj: float) -> float:
    return mj * 1e-3


def uj_to_j(uj: float) -> float:
    return uj * 1e-6


def mhz_to_hz(mhz: float) -> float:
    return mhz * 1e6


def kib_to_bytes(kib: float) -> float:
    return kib * 2**10


def kb_to_bytes(kb: float) -> float:
    """amdsmi's XGMI accumulators count kilobytes of 10^3 bytes."""
    return kb * 1e3
