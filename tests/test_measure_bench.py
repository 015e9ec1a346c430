"""Microbenchmark plumbing without a GPU: nccl-tests conventions, kernel shapes, campaign plans."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from calib.workload.models import PRESETS
from measure.conventions import bandwidths_gbps, bus_factor
from measure.kernels import attention_cases, default_cases, gemm_cases, memory_cases


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("all_to_all", 4) == pytest.approx(3 / 4)
    assert bus_factor("send_recv", 2) == 1.0
    assert bus_factor("allreduce", 4) == bus_factor("all_reduce", 4)  # the converter's spelling
    assert math.isnan(bus_factor("gather", 4))


def test_all_gather_is_sized_by_its_total_output() -> None:
    # 8 ranks each contribute 128 MiB: nccl-tests calls this a 1 GiB all-gather.
    per_rank, n, t = 2**27, 8, 0.003
    alg, bus = bandwidths_gbps("all_gather", n, per_rank * n, t)
    assert alg == pytest.approx(2**30 / t / 1e9)
    assert bus == pytest.approx(alg * 7 / 8)
    # sized by the per-rank input, busbw would come out n times lower: the pitfall
    _, wrong = bandwidths_gbps("all_gather", n, per_rank, t)
    assert bus / wrong == pytest.approx(n)


def test_gemm_shapes_are_megatrons_tp_split() -> None:
    llama = PRESETS["llama3-8b"]
    cases = {c.label: c for c in gemm_cases([llama], (2,), (4096,))}
    qkv = cases["llama3-8b/tp2/tokens4096/qkv/fwd"].record()
    # Q (4096) + K and V (8 KV groups x 128) split over TP 2: n = (4096 + 2048) / 2
    assert (qkv["m"], qkv["n"], qkv["k"]) == (4096, 3072, 4096)
    fc1 = cases["llama3-8b/tp2/tokens4096/fc1/fwd"].record()
    assert (fc1["n"], fc1["k"]) == (2 * 14336 // 2, 4096)  # SwiGLU: gate and up projections together
    wgrad = cases["llama3-8b/tp2/tokens4096/fc1/wgrad"].record()
    assert (wgrad["m"], wgrad["n"], wgrad["k"]) == (14336, 4096, 4096)
    assert qkv["flops"] == 2.0 * 4096 * 3072 * 4096 and qkv["op_class"] == "gemm"


def test_attention_and_memory_cases_carry_op_records() -> None:
    att = attention_cases([PRESETS["mixtral-8x7b"]], (4,), (2048,))
    sdpa = [c.record() for c in att if "sdpa" in c.label][0]
    assert sdpa["op_class"] == "attention" and (sdpa["m"], sdpa["n"], sdpa["k"], sdpa["batch"]) == (2048, 2048, 128, 8)
    mem = memory_cases((2**20,))
    assert {c.record()["op_class"] for c in mem} == {"memory"}
    assert all(c.record()["bytes"] >= 2**20 for c in mem)


def test_default_case_list_covers_every_preset_and_tp() -> None:
    cases = default_cases()
    labels = " ".join(c.label for c in cases)
    for name in PRESETS:
        assert f"{name}/tp1/" in labels
    assert "/tp8/" in labels
    assert len({(c.aten_op, c.shapes) for c in cases}) == len(cases)  # no shape timed twice


def test_campaign_plans_fit_the_hosts(tmp_path: Path) -> None:
    from measure.campaigns.h200 import TRAININGS, plan

    for gpus in (4, 8):
        jobs = plan(tmp_path, False, True, 3, 10, 150, gpus)
        assert all(j.gpus <= gpus for j in jobs)
        ids = [j.id for j in jobs]
        assert len(ids) == len(set(ids))
    families = {spec[1].split("-")[0] for spec in TRAININGS}
    assert families == {"llama3", "gpt3", "mixtral"}


def test_kernel_timing_keeps_each_cases_timed_window_and_names_it() -> None:
    """Case i's timed calls run inside its annotation between two device synchronizations: only kernels that
    start on the GPU inside it are rows, each labelled with its case; the windows come from the Kineto trace's
    annotations on the converter's clock; a case without a window or without a kernel is one clear error."""
    import pandas as pd

    from calib.errors import CalibError
    from measure.kernels import CASE_MARK, case_windows, timed_windows

    base_ns = 1_700_000_000_000_000_000
    trace = {"baseTimeNanoseconds": base_ns, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": f"{CASE_MARK}0", "ts": 1_000_000.0, "dur": 500_000.0},
        {"ph": "X", "cat": "user_annotation", "name": f"{CASE_MARK}1", "ts": 3_000_000.0, "dur": 500_000.0},
        {"ph": "X", "cat": "user_annotation", "name": "other", "ts": 0.0, "dur": 9e9},
    ]}
    windows = case_windows(trace)
    t = base_ns * 1e-9
    assert windows[0] == pytest.approx((t + 1.0, t + 1.5)) and set(windows) == {0, 1}

    def row(start: float, name: str) -> dict:
        return {"rank": 0, "step": None, "stream": 7, "name": name, "op_class": "gemm", "start_s": t + start, "time_s": 1e-5}

    table = pd.DataFrame([row(0.5, "randn"), row(1.1, "gemm_a"), row(1.2, "gemm_a"), row(2.0, "warm-up"),
                          row(3.1, "flash_fwd"), row(3.2, "flash_bwd"), row(4.0, "stray")])
    out = timed_windows(table, windows, ["a/tp1/fc1", "a/tp1/sdpa"])
    assert out["name"].tolist() == ["gemm_a", "gemm_a", "flash_fwd", "flash_bwd"]
    assert out["case"].tolist() == ["a/tp1/fc1", "a/tp1/fc1", "a/tp1/sdpa", "a/tp1/sdpa"]
    assert out["step"].tolist() == [0, 0, 1, 1]
    with pytest.raises(CalibError, match="lacks the timed-window annotation of 1 case.*third"):
        timed_windows(table, windows, ["a/tp1/fc1", "a/tp1/sdpa", "third"])
    with pytest.raises(CalibError, match="1 case\\(s\\) launched no kernel.*a/tp1/sdpa"):
        timed_windows(table[table["start_s"] < t + 3.0], windows, ["a/tp1/fc1", "a/tp1/sdpa"])


def test_kernel_timing_adds_sequence_8192_attention() -> None:
    from measure.kernels import EVENT_SEQS, KERNEL_SEQS

    events = {c.label for c in default_cases(seqs=EVENT_SEQS)}
    kernel = {c.label for c in default_cases(seqs=KERNEL_SEQS)}
    assert events < kernel
    assert {lbl.split("/")[2] for lbl in kernel - events} == {"seq8192"}


def test_training_like_cases_lay_out_gemm_operands_per_pass() -> None:
    """The kernel-timed bundle times each GEMM with the operand layout its pass has in megatron-core's local linear
    layers (forward X W^T, data gradient dY W, weight gradient dY^T X); a shape is timed once per layout."""
    from measure.kernels import KERNEL_SEQS, PASS_LAYOUTS

    cases = [c for c in default_cases(seqs=KERNEL_SEQS, training_like=True) if c.aten_op == "aten::mm"]
    assert all(c.layout == PASS_LAYOUTS[c.label.rsplit("/", 1)[1]] for c in cases)
    assert len({(c.shapes, c.layout) for c in cases}) == len(cases)
    assert {c.layout for c in default_cases() if c.aten_op == "aten::mm"} == {""}
    sdpa = [c for c in default_cases(seqs=KERNEL_SEQS, training_like=True) if c.label == "llama3-8b/tp2/seq8192/sdpa"][0]
    assert sdpa.shapes == ((1, 16, 8192, 128), (1, 4, 8192, 128), (1, 4, 8192, 128))  # 8 KV groups over TP 2
