"""The shared specs: model presets, parallel config rules, rank layout, bundle schema."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from calib.bundle import BundleWriter, Manifest, RunSpec, check_bundle, load_bundles, read_bundle
from calib.cli import main
from calib.errors import CalibError
from calib.workload.models import PRESETS, resolve_model
from calib.workload.parallel import ParallelConfig, coords, dp_group, ep_group, rank_of, tp_group


def test_presets_have_published_shapes() -> None:
    g = PRESETS["gpt3-175b"]
    assert (g.layers, g.hidden, g.heads, g.seq_length, g.ffn_hidden) == (96, 12288, 96, 2048, 49152)
    # GPT-3 175B's published parameter count is 175B; the formula must land within 1%.
    assert abs(g.param_count() / 175e9 - 1) < 0.01
    llama = PRESETS["llama3-70b"]
    assert abs(llama.param_count() / 70.6e9 - 1) < 0.01
    assert abs(PRESETS["llama3-8b"].param_count() / 8.03e9 - 1) < 0.01
    assert abs(PRESETS["mixtral-8x7b"].param_count() / 46.7e9 - 1) < 0.01


def test_scaled_down_keeps_layer_shapes() -> None:
    full = PRESETS["llama3-70b"]
    small = resolve_model("llama3-70b@L2,S2048")
    assert small.layers == 2 and small.seq_length == 2048
    assert small.layer_params() == full.layer_params()
    assert resolve_model("llama3-70b", layers=4).name == "llama3-70b@L4"


def test_unknown_model_is_one_line() -> None:
    with pytest.raises(CalibError, match="unknown model 'gpt5'"):
        resolve_model("gpt5")


@pytest.mark.parametrize(
    ("cfg", "gpus", "msg"),
    [
        (ParallelConfig(tp=5, dp=1), 5, "does not divide the 32 attention heads"),
        (ParallelConfig(pp=3, dp=1), 3, "does not divide the 32 layers"),
        (ParallelConfig(tp=2, dp=2), 8, "must equal TP x PP x DP"),
        (ParallelConfig(dp=4, ep=2), 4, "needs a mixture-of-experts model"),
    ],
)
def test_impossible_configs_fail_with_reason(cfg: ParallelConfig, gpus: int, msg: str) -> None:
    with pytest.raises(CalibError, match=msg):
        cfg.check(PRESETS["llama3-8b"], gpus)


def test_rank_layout_is_megatron_order() -> None:
    cfg = ParallelConfig(tp=2, pp=2, dp=4, ep=2, global_batch=8)
    assert coords(13, cfg) == (1, 2, 1)
    assert rank_of(1, 2, 1, cfg) == 13
    assert tp_group(5, cfg) == [4, 5]
    assert dp_group(5, cfg) == [1, 3, 5, 7]
    assert ep_group(5, cfg) == [5, 7]


def test_bundle_written_atomically_and_failed_bundle_refused(tmp_path) -> None:
    spec = RunSpec(model="llama3-8b@L2", tp=2, dp=1)
    w = BundleWriter(tmp_path / "b1", Manifest(kind="training", spec=spec))
    w.write_table("steps", pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_s": [0.0, 0.0], "time_s": [1.0, 1.0], "profiled": [False, False]}))
    assert not (tmp_path / "b1").exists() and (tmp_path / "b1.partial").is_dir()
    w.finish()
    b = read_bundle(tmp_path / "b1")
    assert b.manifest.spec.tp == 2 and check_bundle(b) == []
    w2 = BundleWriter(tmp_path / "b2", Manifest(kind="training", spec=spec))
    w2.fail("CUDA out of memory on rank 1")
    with pytest.raises(CalibError, match="failed run: CUDA out of memory"):
        read_bundle(tmp_path / "b2")
    assert [x.id for x in load_bundles([tmp_path])] == ["b1"]


def test_bundle_missing_rank_and_schema(tmp_path) -> None:
    spec = RunSpec(model="llama3-8b@L2", tp=2, dp=1)
    w = BundleWriter(tmp_path / "b", Manifest(kind="training", spec=spec))
    w.write_table("steps", pd.DataFrame({"rank": [0], "step": [0], "start_s": [0.0], "time_s": [1.0], "profiled": [False]}))
    w.finish()
    with pytest.raises(CalibError, match=r"no rows for rank\(s\) \[1\]"):
        load_bundles([tmp_path / "b"])
    mf = tmp_path / "b" / "manifest.json"
    data = json.loads(mf.read_text())
    data["schema"] = "calib.bundle/99"
    mf.write_text(json.dumps(data))
    with pytest.raises(CalibError, match="not supported"):
        read_bundle(tmp_path / "b")


def test_cli_prints_one_line_error(capsys) -> None:
    assert main(["--help"]) == 0
