"""The host's waits per MoE routing in profiled Mixtral steps (benchmarks/routing_waits.py; docs/host.md,
"One wait per routing"): one event wait per MoE layer forward and micro-batch on every code path."""

from __future__ import annotations

import json

from tests.conftest import load_benchmark


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, stream: int | None = None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
    if stream is not None:
        e["args"] = {"stream": stream}
    return e


def test_a_rank_summary_counts_the_waits_and_the_host_time_after_them() -> None:
    waits = load_benchmark("routing_waits")
    events = [
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 10, 2, stream=101),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 12, 2, stream=101),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 90, 2, stream=7),
        _x("cuda_runtime", "cudaEventSynchronize", 20, 30),
        _x("cuda_runtime", "cudaLaunchKernel", 45, 3, tid=2),  # another thread's launch: not the next one
        _x("cuda_runtime", "cudaLaunchKernel", 70, 3),
        _x("cuda_runtime", "cudaStreamSynchronize", 95, 4),
    ]
    assert waits.rank_summary(events) == {
        "dtoh_copies_by_stream": {"101": 2, "7": 1}, "event_syncs": 1, "event_sync_us_median": 30,
        "after_event_sync_to_launch_us_median": 20, "stream_syncs": 1, "stream_sync_us_median": 4}


def test_every_profiled_mixtral_path_waits_once_per_routing() -> None:
    """Round 34's one-GPU and TP 2 + SP raw traces and mixtral-ep2-mbs2-raw's (each committed as its summary):
    the routing copies on a side stream, 2 or 5 a routing, and one event wait per MoE layer forward and
    micro-batch (2 layers; 2, 4 and 1 micro-batches)."""
    waits = load_benchmark("routing_waits")
    runs = {s["run"]: s for f in waits.SUMMARIES for s in json.loads(f.read_text())}
    expected = {"mixtral-1gpu-s256-raw34": (2, 4), "mixtral-tp2-sp-s256-raw34": (5, 8), "mixtral-ep2-mbs2-raw": (5, 2)}
    for run, (copies, routings) in expected.items():
        for rank in runs[run]["ranks"].values():
            side = [n for s, n in rank["dtoh_copies_by_stream"].items() if s != "7"]
            assert side == [copies * routings] and rank["event_syncs"] == routings, (run, rank)


def test_a_dense_pipeline_step_has_no_routing_wait() -> None:
    """tests/data/h200-pp2-raw (gpt6.7b-pp2-mbs2, the raw traces the tree keeps): no side-stream copy, no event wait,
    only the optimizer's scalar reads on the compute stream, each waited for by a stream sync."""
    from tests.conftest import TEST_DATA

    waits = load_benchmark("routing_waits")
    summary = waits.summarize(TEST_DATA / "h200-pp2-raw")
    assert summary["run"] == "h200-pp2-raw" and sorted(summary["ranks"]) == ["0", "1"]
    for rank in summary["ranks"].values():
        assert list(rank["dtoh_copies_by_stream"]) == ["7"] and rank["event_syncs"] == 0
        assert rank["stream_syncs"] >= rank["dtoh_copies_by_stream"]["7"] > 0
