"""GPU-side measurement harness behind `calib measure` (docs/measure.md).

Imports torch, megatron-core, pynvml or amdsmi only inside the functions and worker processes
that need them, so `calib measure --help` and the CPU tests stay light.
"""
