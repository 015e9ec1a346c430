"""Replays time compute-bound kernels at the clock of the measured steps, not the profiled one."""

from __future__ import annotations

import pytest

from calib.bundle.io import read_bundle
from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType
from calib.validation.measured import profiled_clock_ratio
from calib.validation.replay import replay_trace
from tests.conftest import TRACES


def _bundle(name: str):
    path = TRACES / "h200" / name
    if not path.is_dir():
        pytest.skip(f"no committed bundle {name}")
    return read_bundle(path)


def test_power_capped_run_profiled_at_a_higher_clock() -> None:
    # llama70b-tp2-mbs2-rcsel: 1,912.5 MHz in the profiled step, 1,725 MHz in the measured steps (sw power cap)
    assert profiled_clock_ratio(_bundle("llama70b-tp2-mbs2-rcsel")) == pytest.approx(1912.5 / 1725, rel=1e-3)
    # MoE with TP stays under the cap: 1,980 MHz in both
    assert profiled_clock_ratio(_bundle("mixtral-tp2-sp")) == 1.0
    # no telemetry recorded: nothing to correct with
    assert profiled_clock_ratio(_bundle("llama8b-tp2-notel")) == 1.0


def test_replay_scales_gemm_and_attention_only() -> None:
    def comp(i: int, cls: str, ns: int) -> Node:
        n = Node(id=i, name=f"k{i}", type=NodeType.COMP_NODE, duration_micros=ns // 1000)
        n.attrs = [Attr("is_cpu_op", False), Attr("duration_ns", ns), Attr("op_class", cls)]
        return n

    et = ExecutionTrace(nodes=[comp(0, "gemm", 100_000), comp(1, "memory", 100_000), comp(2, "attention", 50_000)])
    out = replay_trace(et, clock_scale=1.1)
    assert [n.attr("duration_ns") for n in out.nodes] == [110_000, 100_000, 55_000]
    assert [n.attr("duration_ns") for n in et.nodes] == [100_000, 100_000, 50_000]  # the input is left alone
    assert [n.attr("duration_ns") for n in replay_trace(et).nodes] == [100_000, 100_000, 50_000]


def test_replay_follows_the_calibrations_clock_exponent() -> None:
    from calib.validation.replay import read_run_traces

    b = _bundle("llama70b-tp2-mbs2-rcsel")
    assert read_run_traces(b).clock_scale == pytest.approx(1912.5 / 1725, rel=1e-3)
    assert read_run_traces(b, 0.6).clock_scale == pytest.approx((1912.5 / 1725) ** 0.6, rel=1e-3)
