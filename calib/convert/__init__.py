"""calib.convert: PyTorch host execution trace + Kineto trace -> per-rank Chakra ETs, kernel and collective tables."""

from calib.convert.run import (
    COLLECTIVE_COLUMNS,
    KERNEL_COLUMNS,
    RunConversion,
    convert_pair,
    convert_run,
    convert_traces,
    find_rank_traces,
    write_outputs,
)

__all__ = [
    "COLLECTIVE_COLUMNS",
    "KERNEL_COLUMNS",
    "RunConversion",
    "convert_pair",
    "convert_run",
    "convert_traces",
    "find_rank_traces",
    "write_outputs",
]
