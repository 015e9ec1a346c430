"""Congestion-unaware message times and routes (calib.sim.network)."""

from __future__ import annotations

import pytest

from calib.errors import CalibError
from calib.sim.config import Dim, NetworkConfig
from calib.sim.network import FullyConnected, MultiDimTopology, Ring, Switch, dimension


def test_message_time_is_floor_of_hops_latency_plus_bytes_over_bandwidth():
    ring = dimension(Dim("Ring", 8, 50.0, 500.0))
    assert isinstance(ring, Ring)
    # 50 GB/s with GB = 2^30 is 53.687 bytes/ns: 131072 bytes take 2441.4 ns, plus one 500-ns hop.
    assert ring.message_ns(131072, 1) == 2941
    assert ring.message_ns(1048576, 3) == 21031  # reference case sendrecv_ring8, rank 2 -> 5


def test_hops_per_topology():
    assert Ring(8, 1.0, 1.0).hops(0, 5) == 3 and Ring(8, 1.0, 1.0).hops(0, 4) == 4 and Ring(8, 1.0, 1.0).hops(7, 0) == 1
    assert FullyConnected(8, 1.0, 1.0).hops(0, 5) == 1
    assert Switch(8, 1.0, 1.0).hops(2, 3) == 2
    assert Switch(8, 1.0, 1.0).hops(3, 3) == 0


def test_message_uses_first_differing_dimension():
    topo = MultiDimTopology(NetworkConfig((Dim("Switch", 8, 360.0, 500.0), Dim("Switch", 4, 50.0, 2000.0))))
    assert topo.coords(13) == [5, 1]
    assert topo.route(0, 1) == (0, 2)
    assert topo.route(0, 8) == (1, 2)
    assert topo.route(1, 10) == (0, 2)  # differs in both: dimension 0 carries it
    assert topo.line(13, 1) == [5, 13, 21, 29]
    # 1 MiB over the 50 GB/s dimension: 2 x 2000 + 19531.25 (reference case sendrecv_sw8x4, rank 16 -> 31 is 64 KiB)
    assert topo.message_ns(0, 8, 1048576) == 23531
    assert topo.message_ns(16, 31, 65536) == 1169


def test_dimensions_must_multiply_to_rank_count():
    net = NetworkConfig((Dim("Switch", 8, 1.0, 1.0), Dim("Ring", 4, 1.0, 1.0)))
    with pytest.raises(CalibError, match="8 x 4 = 32 NPUs do not match the workload's 16 ranks"):
        net.check_ranks(16)
