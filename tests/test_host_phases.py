"""The host-phase probe (measure.probes.host_phases) and its reader (benchmarks/host_phases.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from measure.probes.host_phases import CONFIGS, Spans, device_busy, launches_per_span
from tests.conftest import ROOT, load_benchmark

# Every round is committed as its summary (benchmarks/host_phases.py --summary-out), written from its results, which
# are not kept for room: rounds 1-10 since the forty-second session, 11 since the forty-fourth, 12 on from the start.
PROBE_ROUNDS = sorted(d for d in (ROOT / "traces").glob("*/_probes/host-phases-*") if (d / "summary.json.xz").is_file())
SUMMARY_12 = ROOT / "traces" / "h200" / "_probes" / "host-phases-12" / "summary.json.xz"
SUMMARY_13 = ROOT / "traces" / "h200" / "_probes" / "host-phases-13" / "summary.json.xz"


def _summary(path) -> dict:
    """A committed round's summary runs (xz JSON, benchmarks/host_phases.py --summary-out)."""
    return load_benchmark("host_phases").load(path)["runs"]


def _x(cat: str, name: str, ts: float, dur: float, corr: int | None = None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_launches_count_in_the_innermost_range_with_their_kernels_time():
    trace = {"traceEvents": [
        _x("user_annotation", "forward", 0, 100), _x("user_annotation", "mlp", 10, 20),
        _x("cuda_runtime", "cudaLaunchKernel", 15, 3, corr=1),   # inside mlp
        _x("cuda_runtime", "cudaLaunchKernel", 40, 3, corr=2),   # forward only
        _x("cuda_driver", "cuLaunchKernelEx", 45, 4, corr=4),    # NCCL's launch, through the driver
        _x("cuda_runtime", "cudaMalloc", 50, 30),                # runtime time, not a launch
        _x("cuda_runtime", "cudaLaunchKernel", 500, 3, corr=3),  # outside every range
        _x("kernel", "gemm", 60, 7, corr=1), _x("kernel", "add", 20, 2, corr=2),
        _x("gpu_memcpy", "copy", 5, 1, corr=9), _x("kernel", "ncclDevKernel_AllReduce", 70, 11, corr=4),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 1},
    ]}
    by = {r["label"]: r for r in launches_per_span(trace)}
    assert by["mlp"]["launches"] == 1 and by["mlp"]["gpu_us"] == 7.0
    assert by["forward"]["launches"] == 2 and by["forward"]["gpu_us"] == 13.0
    assert by["forward"]["runtime_us"] == {"cudaLaunchKernel": 3.0, "cuLaunchKernelEx": 4.0, "cudaMalloc": 30.0}
    assert device_busy(trace) == [[5.0, 1.0], [20.0, 2.0], [60.0, 7.0], [70.0, 11.0]]


def test_spans_record_only_when_on_and_nest():
    spans = Spans()
    double = spans.wrap(lambda x: 2 * x, "double")
    assert double(2) == 4 and spans.rows == []
    spans.on = True
    with spans.span("step"):
        double(3)
    labels = [r[0] for r in spans.rows]
    assert labels == ["double", "step"]
    inner, outer = spans.rows
    assert outer[2] <= inner[2] <= inner[3] <= outer[3]


def test_probe_configurations_are_valid_runs():
    from measure.request import TrainRequest

    for probe in CONFIGS:
        TrainRequest(model=probe.model, par=probe.par()).check(probe.par().gpus)
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)
    assert {c.par().gpus for c in CONFIGS} == {1, 2}


@pytest.mark.parametrize("round_dir", PROBE_ROUNDS, ids=lambda p: f"{p.parent.parent.name}-{p.name}")
def test_committed_probe_summaries_decompose(round_dir):
    """Each run's modules' exclusive host time adds up to its host's time to finish the step (the decomposition
    loses nothing), every forward and backward made launches, and the host never finishes after the measured step.
    (Checked on the results themselves while they were committed; their summaries keep the tables it reads.)"""
    kept = _summary(round_dir / "summary.json.xz")
    assert kept
    for name, v in kept.items():
        p = v["phases"]
        if "modules" in v:  # rounds 12-14 kept none
            host_ms = sum(m["host_ms"] for m in v["modules"].values())
            assert host_ms == pytest.approx(p["host_done_ms"], rel=0.1), name
        assert p["forward_launches"] > 0 and p["backward_launches"] > 0, name
        assert p["host_done_ms"] < p["step_ms"] * 1.05, name


def test_gpu_idle_is_a_phase_gpu_interval_less_its_kernels_counting_outermost_spans_once():
    bench = load_benchmark("host_phases")
    run = {
        # [label, step, host start ns, host end ns, GPU start us, GPU end us]; the inner "optimizer" is a chained
        # optimizer's own span inside the outer one and must not count twice
        "gpu_spans": [["forward", 0, 0, 50, 0.0, 4000.0], ["optimizer", 0, 60, 70, 4100.0, 5000.0],
                      ["optimizer", 0, 55, 90, 4000.0, 6000.0], ["step", 0, 0, 100, 0.0, 6000.0],
                      ["forward", 1, 0, 50, 0.0, 3000.0], ["optimizer", 1, 55, 90, 3000.0, 5000.0],
                      ["step", 1, 0, 100, 0.0, 5000.0]],
        "profiled_spans": [{"label": "forward", "start_us": 0, "dur_us": 50, "gpu_us": 2500.0},
                           {"label": "optimizer", "start_us": 55, "dur_us": 35, "gpu_us": 1000.0},
                           {"label": "optimizer", "start_us": 60, "dur_us": 10, "gpu_us": 500.0}],
        "device_busy": [[0.0, 3000.0], [3000.0, 1500.0]],
    }
    table = bench.gpu_idle(run)
    assert list(table.index) == ["step", "forward", "optimizer"]
    assert table.loc["forward"].tolist() == [3.5, 2.5, 1.0]  # median of 4 and 3 ms, 2.5 ms of kernels
    assert table.loc["optimizer"].tolist() == [2.0, 1.5, 0.5]
    assert table.loc["step"].tolist() == [5.5, 4.5, 1.0]


def test_the_gpu_stamped_probe_puts_the_moe_steps_idle_in_their_forward():
    """Round 11 (fortieth session, committed as its summary since the forty-fourth): the unprofiled step's GPU
    intervals of its phases add up to the step, no phase runs its kernels in less GPU time than they take, the dense
    control hardly idles (~1 %), and each Mixtral configuration idles most in its MoE layers' forward (docs/host.md,
    "Where the one-GPU MoE steps idle"); the reader prints the summary's tables."""
    summary = ROOT / "traces" / "h200" / "_probes" / "host-phases-11" / "summary.json.xz"
    kept = _summary(summary)
    assert set(kept) == {"llama8b-s2048-mb4", "mixtral-L1-s2048-mb4", "mixtral-s2048-mb4", "mixtral-L3-s2048-mb4",
                         "mixtral-s256-mb2"}
    for name, v in kept.items():
        t = pd.DataFrame.from_dict(v["gpu_idle"], orient="index")
        parts = t.loc[["zero_grads", "forward", "backward", "finalize_grads", "optimizer"], "gpu_interval_ms"].sum()
        assert parts == pytest.approx(t.loc["step", "gpu_interval_ms"], rel=0.02), name
        assert (t.idle_ms > -0.02 * t.gpu_interval_ms - 0.05).all(), name
        if name.startswith("llama"):
            assert t.loc["step", "idle_ms"] < 0.02 * t.loc["step", "gpu_interval_ms"]
        else:
            assert t.loc["moe", "idle_ms"] > t.loc["backward", "idle_ms"] + t.loc["optimizer", "idle_ms"], name
            assert t.loc["moe", "idle_ms"] > 0.4 * t.loc["step", "idle_ms"], name
    assert load_benchmark("host_phases").main([str(summary.parent), "--gpu", "--modules"]) == 0


def test_gpu_stamps_pair_with_their_spans_in_closing_order(monkeypatch):
    """With `gpu` on, every span records an event where it opens and where it closes, one pair per row, nested
    spans included (measure.probes.host_phases.gpu_stamped zips them)."""
    import itertools

    import measure.probes.host_phases as probe

    counter = itertools.count()
    monkeypatch.setattr(probe, "_event", lambda: next(counter))
    spans = Spans(on=True, gpu=True)
    inner = spans.wrap(lambda: None, "inner")
    with spans.span("outer"):
        inner()
        inner()
    assert [r[0] for r in spans.rows] == ["inner", "inner", "outer"]
    assert spans.events == [(1, 2), (3, 4), (0, 5)]
    spans.gpu = False
    with spans.span("plain"):
        pass
    assert len(spans.rows) == 4 and len(spans.events) == 3


def test_round_12_is_committed_as_the_summary_its_reader_prints():
    """Round 12 (fortieth session, 2 x H200): three two-GPU Mixtral configurations at sequence 256, committed as
    benchmarks/host_phases.py's summary of their GPU-stamped steps; the reader prints it like results."""

    runs = _summary(SUMMARY_12)
    assert set(runs) == {"2gpu-mixtral-tp2-sp-s256", "2gpu-mixtral-ep2-s256-mb4", "2gpu-mixtral-dp2-s256"}
    for name, run in runs.items():
        idle = run["gpu_idle"]
        assert {"step", "forward", "backward", "optimizer", "moe", "moe.routed_experts_compute"} <= set(idle), name
        assert run["phases"]["run"] == name and run["phases"]["microbatches"] == 4
        # the expert loop launches no collective: its GPU interval holds its kernels
        loop = idle["moe.routed_experts_compute"]
        assert loop["gpu_interval_ms"] >= loop["kernels_ms"] > 0, name
    bench = load_benchmark("host_phases")
    assert bench.main([str(SUMMARY_12.parent), "--gpu"]) == 0


def test_round_13_times_tensor_parallelism_beside_data_parallelism_on_one_lease():
    """Round 13 (forty-first session, 2 x H200): the Mixtral trio of round 12 and Llama-3 8B with TP 2 and DP 2 at
    sequence 256, committed as the summary; on this lease TP's launches cost the host more than DP's, dense and MoE
    (docs/host.md, "Tensor parallelism adds no pace": what the probe says against the weight of 0)."""

    runs = _summary(SUMMARY_13)
    assert set(runs) == {"2gpu-mixtral-tp2-sp-s256", "2gpu-mixtral-ep2-s256-mb4", "2gpu-mixtral-dp2-s256",
                         "2gpu-llama8b-tp2-s256", "2gpu-llama8b-dp2-s256"}
    per = {name: run["phases"] for name, run in runs.items()}
    for phase in ("forward_us_per_launch", "backward_us_per_launch"):
        assert per["2gpu-llama8b-tp2-s256"][phase] > per["2gpu-llama8b-dp2-s256"][phase]
        assert per["2gpu-mixtral-tp2-sp-s256"][phase] > per["2gpu-mixtral-dp2-s256"][phase]
    bench = load_benchmark("host_phases")
    assert bench.main([str(SUMMARY_13.parent), "--gpu"]) == 0


def test_round_14_is_the_probe_beside_calib_measure_on_one_lease():
    """Round 14 (forty-first session, 2 x H200): the probe between two `calib measure` passes of the same three
    configurations; its summary holds the probe's three runs, which the reader prints."""

    summary = ROOT / "traces" / "h200" / "_probes" / "host-phases-14" / "summary.json.xz"
    runs = _summary(summary)
    assert set(runs) == {"2gpu-mixtral-tp2-sp-s256", "2gpu-llama8b-tp2-s256", "2gpu-mixtral-ep2-s256"}
    assert all(run["phases"]["step_ms"] > 0 and run["gpu_idle"]["step"]["kernels_ms"] > 0 for run in runs.values())
    assert load_benchmark("host_phases").main([str(summary.parent), "--gpu"]) == 0
