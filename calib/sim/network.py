"""Congestion-unaware network: one small class per topology and their multi-dimensional composition.

The time of one m-byte message over h hops is T(m) = floor(h * latency + m / Bp) ns, Bp the link
bandwidth in bytes/ns (ASTRA-sim's analytical congestion-unaware backend; see
docs/simulator.md). A message between two ranks uses only the first dimension in which their
coordinates differ; concurrent messages do not slow each other down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calib.errors import CalibError
from calib.sim.config import Dim, NetworkConfig
from calib.units import astra_bw_gbps_to_bytes_per_s


@dataclass(frozen=True)
class Topology:
    """One network dimension of `npus` ranks; subclasses say how many hops apart two of them are."""

    npus: int
    bandwidth_bytes_per_ns: float
    latency_ns: float

    def hops(self, src: int, dst: int) -> int:
        raise NotImplementedError

    def message_ns(self, size_bytes: int, hops: int) -> int:
        # Same operation order as the reference backend so that the floor lands on the same integer.
        return int(hops * self.latency_ns + size_bytes / self.bandwidth_bytes_per_ns)


class Ring(Topology):
    """Bidirectional ring: the shorter way round."""

    def hops(self, src: int, dst: int) -> int:
        d = abs(src - dst) % self.npus
        return min(d, self.npus - d)


class FullyConnected(Topology):
    """A direct link between every pair."""

    def hops(self, src: int, dst: int) -> int:
        return 0 if src == dst else 1


class Switch(Topology):
    """Every rank one link from a switch: two links between any pair."""

    def hops(self, src: int, dst: int) -> int:
        return 0 if src == dst else 2


_KINDS: dict[str, type[Topology]] = {"Ring": Ring, "FullyConnected": FullyConnected, "Switch": Switch}


def dimension(dim: Dim) -> Topology:
    bw = astra_bw_gbps_to_bytes_per_s(dim.bandwidth_gbps) / 1e9  # bytes per ns
    return _KINDS[dim.topology](dim.npus, bw, dim.latency_ns)


class MultiDimTopology:
    """Dimensions composed; rank = x0 + n0*x1 + n0*n1*x2 + ... (dimension 0 varies fastest)."""

    def __init__(self, network: NetworkConfig) -> None:
        if not network.dims:
            raise CalibError("network configuration has no dimensions")
        self.dims: list[Topology] = [dimension(d) for d in network.dims]
        self.shape: list[int] = [d.npus for d in network.dims]
        self.npus = math.prod(self.shape)
        self.strides: list[int] = [math.prod(self.shape[:i]) for i in range(len(self.shape))]

    def coord(self, rank: int, dim: int) -> int:
        return (rank // self.strides[dim]) % self.shape[dim]

    def coords(self, rank: int) -> list[int]:
        return [self.coord(rank, d) for d in range(len(self.shape))]

    def route(self, src: int, dst: int) -> tuple[int, int]:
        """(dimension, hops) of a message: the first dimension in which the coordinates differ."""
        for d in range(len(self.shape)):
            a, b = self.coord(src, d), self.coord(dst, d)
            if a != b:
                return d, self.dims[d].hops(a, b)
        return 0, 0

    def message_ns(self, src: int, dst: int, size_bytes: int) -> int:
        d, h = self.route(src, dst)
        return self.dims[d].message_ns(size_bytes, h)

    def line(self, rank: int, dim: int) -> list[int]:
        """The ranks that differ from `rank` only in dimension `dim`, in coordinate order."""
        base = rank - self.coord(rank, dim) * self.strides[dim]
        return [base + i * self.strides[dim] for i in range(self.shape[dim])]
