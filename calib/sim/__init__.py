"""Simulators behind one interface: `analytical` (embedded, default) and `astrasim`."""

from calib.sim.config import Dim, NetworkConfig, SystemConfig
from calib.sim.simulate import BACKENDS, simulate
from calib.sim.types import RankClass, SimResult, SimWorkload

__all__ = ["BACKENDS", "Dim", "NetworkConfig", "RankClass", "SimResult", "SimWorkload", "SystemConfig", "simulate"]
