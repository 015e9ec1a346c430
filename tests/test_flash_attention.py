"""Flash attention (`--attention flash`): the converter's causal FLOPs, the generated kernels against the
profiled steps of the committed flash bundles, the memory estimate against their peaks, the round-17
predictions against what ran, and the bad inputs of the option."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from calib.bundle.io import load_bundles, read_bundle
from calib.calibration import Calibration
from calib.chakra.codec import read_et
from calib.cli import main
from calib.errors import CalibError
from calib.ops import causal_of, classify
from calib.project import default_calibration_path
from calib.stack import flash_runs, measured_stack, stack_summary
from calib.units import GIB
from calib.validation.engine import model_of, parallel_of
from calib.workload.memory import estimate
from calib.workload.ops import Op, layer_bwd, layer_fwd
from measure.campaigns.logs import read_log
from tests.conftest import TRACES

FLASH = sorted(p for gpu in ("h100", "h200") for p in (TRACES / gpu).glob("*-flash*") if (p / "manifest.json").is_file())
pytestmark = pytest.mark.skipif(not FLASH, reason="no flash-attention bundle committed")


def test_causal_flag_read_from_recorded_inputs() -> None:
    q, kv = [2, 2048, 32, 128], [2, 2048, 8, 128]
    values = [[], [], [], None, None, 2048, 2048, 0.0, True, False, 0.088]
    assert causal_of("aten::_flash_attention_forward", values) is True
    assert causal_of("aten::_flash_attention_forward", values[:8]) is None  # not recorded
    assert causal_of("aten::_efficient_attention_forward", [0] * 9 + [1]) is True  # custom_mask_type 1
    assert causal_of("aten::mm", values) is None
    types = ["Tensor(c10::BFloat16)"] * 3
    full = classify("aten::_flash_attention_forward", [q, kv, kv], types, causal=False)
    half = classify("aten::_flash_attention_forward", [q, kv, kv], types, causal=True)
    assert full.flops == 4.0 * 64 * 2048 * 2048 * 128 == 2 * half.flops


@pytest.mark.parametrize("bundle", FLASH, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_flash_bundle_records_causal_attention(bundle: Path) -> None:
    b = read_bundle(bundle)
    assert b.manifest.spec.attention == "flash" and b.manifest.spec.key().endswith("/attn-flash")
    k = b.table("kernels")
    att = k[k["op_class"] == "attention"]
    assert set(att["aten_op"]) == {"aten::_flash_attention_forward", "aten::_flash_attention_backward"}
    bwd = att["aten_op"].str.contains("backward").map({True: 2.5, False: 1.0})
    causal = 2.0 * att["batch"] * att["m"] * att["n"] * att["k"] * bwd
    assert (att["flops"] == causal).all()
    et = read_et(next(iter(b.et_files())))
    assert sum(n.attr("op_class") == "attention" for n in et.nodes) == len(att[att["rank"] == 0])


def _profiled_ops(bundle: Path) -> Counter:
    k = read_bundle(bundle).table("kernels")
    k = k[(k["step"] == k["step"].max()) & ~k["name"].str.startswith("Memset")]
    return Counter(k["aten_op"])


@pytest.mark.parametrize("name", ["llama8b-1gpu-mbs2-flash", "gpt1.3b-1gpu-mbs4-flash", "llama8b-1gpu-rcsel-flash",
                                  "gpt6.7b-1gpu-mbs4-rcsel-flash", "mixtral-1gpu-flash"])
def test_generated_attention_kernels_are_the_profiled_ones(name: str) -> None:
    """Per layer and micro-batch the generator emits what the profiled step launched for the core
    attention: the flash forward, the backward's three kernels, the two copies before it only at
    micro-batch > 1, the K/V gradient sums only with grouped-query attention, and no local-attention op."""
    bundle = TRACES / "h100" / name
    b = read_bundle(bundle)
    model, par = model_of(b.manifest.spec), parallel_of(b.manifest.spec)
    ops = [i for i in layer_fwd(model, par) + layer_bwd(model, par) if isinstance(i, Op)]
    per_layer = Counter()
    for o in ops:
        per_layer[o.aten_op] += o.kernels * o.repeat
    n = model.layers * par.num_microbatches
    prof = _profiled_ops(bundle)
    recompute = 2 if par.recompute == "selective" else 1
    assert prof["aten::_flash_attention_forward"] == n * recompute == n * per_layer["aten::_flash_attention_forward"]
    assert prof["aten::_flash_attention_backward"] == 3 * n == n * per_layer["aten::_flash_attention_backward"]
    for local in ("aten::baddbmm", "aten::bmm", "aten::triu"):
        assert prof[local] == 0 and per_layer[local] == 0
    flash = [o for o in ops if ".flash.bwd." in o.name and o.aten_op == "aten::copy_"]
    assert len(flash) == (2 if par.micro_batch > 1 else 0)
    sums = [o for o in ops if ".flash.bwd.gqa" in o.name]
    assert len(sums) == (2 if model.kv_groups < model.heads else 0)
    k = b.table("kernels")
    for o in flash + sums + [o for o in ops if o.op_class == "attention"]:
        rec = o.record()
        hit = k[(k["aten_op"] == rec["aten_op"]) & (k["bytes"] == rec["bytes"])]
        assert len(hit), o.name  # a measured kernel with the generated op's aten op and bytes
        if o.op_class == "attention":
            assert (hit[["m", "n", "k", "batch", "flops"]].iloc[0].tolist()
                    == [rec["m"], rec["n"], rec["k"], rec["batch"], rec["flops"]])


@pytest.mark.parametrize("bundle", FLASH, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_memory_estimate_without_scores(bundle: Path) -> None:
    """The estimate keeps no attention scores and no scores buffer under flash attention; it lands
    within 1.5 % under each run's peak allocated (the busiest rank's: a pipeline's stages differ), the
    EP runs too since the optimizer step's peak counts the expert parameters' optimizer apart (they read
    3.5 %, 1.2 GiB, over their peaks before: traces/README.md, round 20)."""
    b = read_bundle(bundle)
    model, par = model_of(b.manifest.spec), parallel_of(b.manifest.spec)
    est = estimate(model, par, 150 * GIB)
    peak = max(m.peak_allocated_bytes for m in b.manifest.memory)
    assert est.buffers_bytes == 0.0
    assert -0.015 < est.total_bytes / peak - 1 < 0.005


@pytest.mark.parametrize(("gpu", "round_", "limit"), [("h100", "x1-round17", 0.04), ("h200", "x1-round19", 0.05)])
def test_predictions_made_before_the_runs(gpu: str, round_: str, limit: float) -> None:
    """Rounds 17 (H100) and 19 (H200) were predicted with the calibration fitted before they ran
    (predictions.json, committed before them): each step within `limit`, each device peak inside its
    bracket, and a run that ran out of memory had been called tight or out of memory."""
    folder = TRACES / gpu / "_campaigns" / round_
    pred = json.loads((folder / "predictions.json").read_text())
    assert len(pred) >= 8
    ran = 0
    for rid, p in pred.items():
        if not (TRACES / gpu / rid / "manifest.json").is_file():
            assert "out of memory" in (read_log(folder, rid) or ""), rid
            assert p["memory_verdict"] in ("tight", "out of memory"), rid
            continue
        ran += 1
        b = read_bundle(TRACES / gpu / rid)
        steps = b.table("steps")
        measured = steps.loc[~steps["profiled"], "time_s"].median()
        assert abs(p["step_time_s"] / measured - 1) < limit, rid
        used = b.manifest.memory[0].device_used_bytes / GIB
        assert p["memory_verdict"] != "out of memory" and p["device_low_gib"] - 1.0 <= used <= p["device_high_gib"], rid
    assert ran >= 8


def test_refresh_halves_once_and_refuses_a_local_run(tmp_path: Path) -> None:
    from measure.reconvert import refresh_causal_attention

    src = TRACES / "h100" / "gpt13b-1gpu-mbs2-flash"
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    k = pd.read_parquet(copy / "kernels.parquet")
    att = k["op_class"] == "attention"
    k.loc[att, "flops"] *= 2  # as converted before the converter read is_causal
    k.to_parquet(copy / "kernels.parquet", index=False)
    assert refresh_causal_attention(copy) == int(att.sum())
    assert refresh_causal_attention(copy) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(copy / "kernels.parquet"), pd.read_parquet(src / "kernels.parquet"))
    with pytest.raises(CalibError, match="not a flash-attention run"):
        refresh_causal_attention(TRACES / "h100" / "gpt13b-1gpu-mbs2")


def test_stack_counts_the_attention_of_each_run() -> None:
    bundles = load_bundles([TRACES / "h100"])
    stack = measured_stack(bundles)
    flash = sum(b.manifest.kind == "training" and b.manifest.spec.attention == "flash" for b in bundles)
    assert flash_runs(stack) == flash >= 17 and stack["attention"]["local"] > 0
    assert "flash SDPA (" in stack_summary(stack)
    cal = Calibration.load(default_calibration_path("H100"))
    assert flash_runs(cal.software) >= 17


def test_project_attention_option(capsys: pytest.CaptureFixture) -> None:
    base = ["project", "--model", "llama3-8b@L4", "--gpus", "1", "--mbs", "1", "--gbs", "4", "--json"]
    assert main([*base, "--cluster", "h100-1", "--attention", "flash"]) == 0
    flash = json.loads(capsys.readouterr().out)
    assert main([*base, "--cluster", "h200-1"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert flash["inputs"]["parallel"]["attention"] == "flash" and local["inputs"]["parallel"]["attention"] == "local"
    assert flash["memory_gib_per_gpu"] < local["memory_gib_per_gpu"] / 2  # no 8192^2 scores kept
    assert not any("flash attention" in c for c in flash["configured"])  # the H100 calibration has flash runs
    assert main([*base, "--cluster", "h100-1", "--attention", "sdpa"]) == 2
    err = capsys.readouterr().err
    assert "--attention must be one of local, flash" in err and err.count("\n") == 1
    with pytest.raises(CalibError, match="attention must be one of"):
        parallel_of(read_bundle(FLASH[0]).manifest.spec).__class__(attention="math").check(
            model_of(read_bundle(FLASH[0]).manifest.spec))
