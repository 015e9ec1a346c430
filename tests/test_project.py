"""calib project: the projection report, its JSON, the error band, GPU checks, bad input, sweeps.

The calibration here is built inside the test from KNOWN synthetic functions (a kernel model fitted
on a known roofline-with-efficiency curve, fixed network and power parameters): it exercises the
projection machinery, it is not a measurement and no number here is an accuracy claim.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from calib.calibration import Calibration
from calib.cli import main
from calib.cluster import load_cluster
from calib.errors import CalibError
from calib.models.common import ErrorStat
from calib.models.kernel import KernelModel
from calib.models.peaks import PEAKS
from calib.models.power import PowerModel
from calib.project import project
from calib.report import plot_projection, projection_table
from calib.sweep import sweep
from calib.workload import ops as O
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig

POWER_W = {"compute": 640.0, "memory": 450.0, "comm": 300.0, "idle": 90.0}


def known_time(df: pd.DataFrame) -> np.ndarray:
    """Synthetic kernel time: GEMM efficiency saturating at 70% with size, memory at 85% of HBM, 3 us floor."""
    fl = df["flops"].to_numpy(float)
    by = df["bytes"].to_numpy(float)
    eff = 0.7 * fl / (fl + 5e9)
    gemm = df["op_class"].to_numpy() == "gemm"
    t = np.where(gemm, np.maximum(fl / (989.4e12 * np.maximum(eff, 1e-9)), by / (0.8 * 4.8e12)), by / (0.85 * 4.8e12))
    return 3e-6 + t


@pytest.fixture(scope="module")
def calibration() -> Calibration:
    rng = np.random.default_rng(0)
    ops = [O.gemm("g", *(int(2 ** rng.uniform(8, 15)) for _ in range(3)), "bf16") for _ in range(200)]
    ops += [O.memop("m", float(int(2 ** rng.uniform(16, 31))), "bf16", "aten::add") for _ in range(80)]
    x = pd.DataFrame([o.record() for o in ops])
    km = KernelModel(peaks=PEAKS["H200"]).fit(x, known_time(x))
    intra = {"topology": "Switch", "bandwidth_gbps": 300.0, "latency_ns": 2500.0, "endpoint_delay_ns": 10.0,
             "implementation": {"allreduce": "ring", "allgather": "ring", "reducescatter": "ring", "alltoall": "direct"}}
    return Calibration(
        gpu="NVIDIA H200", bundles=[{"id": "synthetic", "sha256": "0" * 64}], kernel=km.to_dict(),
        network={"astra_sim": {"intra": intra}}, power=PowerModel(dict(POWER_W), peak_power_w=700.0).to_dict(),
        errors={"kernel": ErrorStat(3.0, 9.0, 280, "5-fold"), "network": ErrorStat(5.0, 12.0, 40, "5-fold")},
        source="synthetic-test-calibration",
    )


MAIN = dict(tp=8, pp=16, dp=64, micro_batch=1, global_batch=1536)


@pytest.fixture(scope="module")
def main_result(calibration):
    return project(resolve_model("gpt3-175b"), ParallelConfig(**MAIN), load_cluster("dgx-h200"), calibration)


def test_projection_report_keys_and_consistency(main_result) -> None:
    r = main_result
    j = r.to_json()
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "breakdown_s", "memory_gib_per_gpu",
                "fits_in_memory", "memory_verdict", "energy_j_per_step", "avg_power_w", "peak_power_w", "error_band",
                "calibrated", "configured", "calibration_id", "inputs"):
        assert key in j
    # The synthetic calibration has no memory section: the verdict is the allocator estimate's, and says so.
    assert j["memory_verdict"] == "fits" and any("no calibrated memory model" in n for n in r.notes)
    json.dumps(j, allow_nan=False)
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-6)
    assert r.breakdown_s["pipeline_bubble"] > 0 and r.breakdown_s["exposed_dp"] > 0
    assert r.tokens_per_s == pytest.approx(1536 * 2048 / r.step_time_s)
    assert r.mfu == pytest.approx(r.tflops_per_gpu * 1e12 / 989.4e12)
    assert 0.05 < r.mfu < 0.8
    assert r.energy_j_per_step == pytest.approx(r.avg_power_w * r.step_time_s * 8192)
    assert POWER_W["idle"] < r.avg_power_w < POWER_W["compute"]
    assert r.fits_in_memory and r.sim["rank_classes"] == 16
    assert any(c.startswith("network.nvswitch.bandwidth") for c in r.calibrated)
    assert any(c.startswith("network.rail.bandwidth") for c in r.configured)
    assert r.calibration_id.startswith("NVIDIA H200-")
    # No held-out validation in this calibration: the band comes from the per-model errors, and says so.
    assert r.error_band["pct"] == 5.0 and "per-model" in r.error_band["from"]
    assert any("no held-out" in n for n in r.notes)
    assert projection_table(r).row_count > 10


def test_pipeline_bubble_holds_the_other_stages_whole_passes(calibration) -> None:
    """With the stages' sends and receives all but free, what a rank waits on them is the schedule's bubble: the other
    stages' passes, exposed TP communication included. So exposed pp is next to nothing (here the last stage's
    heavier passes, 0.6 % of the step) though TP is exposed; a bubble counted as compute alone left (PP - 1) /
    micro-batches of the exposed TP in exposed pp (4.6 %). With the transfers priced, exposed pp grows by what they add
    to the step."""
    import dataclasses

    base = load_cluster("dgx-h200")
    fast = dataclasses.replace(base, dims=[d if d.scope == "node" else dataclasses.replace(
        d, bandwidth=dataclasses.replace(d.bandwidth, value=1e15, calibrated=""),
        latency=dataclasses.replace(d.latency, value=0.0, calibrated="")) for d in base.dims])
    par = ParallelConfig(tp=8, pp=16, dp=1, micro_batch=1, global_batch=24)
    r = project(resolve_model("gpt3-175b"), par, fast, calibration)
    b = r.breakdown_s
    assert b["exposed_tp"] > 0.02 * r.step_time_s and b["pipeline_bubble"] > 0.2 * r.step_time_s
    assert b["exposed_pp"] < 0.01 * r.step_time_s
    assert sum(b.values()) == pytest.approx(r.step_time_s, rel=1e-6)
    priced = project(resolve_model("gpt3-175b"), par, base, calibration)
    added = priced.step_time_s - r.step_time_s
    assert added > 0.005 * r.step_time_s
    assert priced.breakdown_s["exposed_pp"] - b["exposed_pp"] == pytest.approx(added, rel=0.1)
    assert priced.breakdown_s["pipeline_bubble"] == pytest.approx(b["pipeline_bubble"], rel=0.02)


def test_error_band_from_validation(calibration) -> None:
    import dataclasses

    cal = dataclasses.replace(calibration, validation={"heldout_mape": 4.0, "heldout_max": 7.5, "heldout_count": 6})
    r = project(resolve_model("gpt3-1.3b"), ParallelConfig(tp=2, pp=2, dp=2, global_batch=16), load_cluster("h200-8"), cal)
    assert r.error_band["low"] == pytest.approx(r.step_time_s * 0.925)
    assert r.error_band["high"] == pytest.approx(r.step_time_s * 1.075)
    assert "held-out" in r.error_band["from"]


def test_error_band_is_the_projected_familys_worst_held_out_run(calibration) -> None:
    import dataclasses

    runs = [{"run": f"g{i}", "kind": "heldout", "model": "gpt3-13b@L4", "error_pct": e} for i, e in enumerate((2.0, -4.5, 3.0))]
    runs += [{"run": "m", "kind": "heldout", "model": "mixtral-8x7b@L2,S2048", "error_pct": 30.0},
             {"run": "g0", "kind": "replay", "model": "gpt3-13b@L4", "error_pct": 9.0}]
    val = {"heldout_mape": 9.9, "heldout_max": 30.0, "heldout_count": 4, "runs": runs}
    cal = dataclasses.replace(calibration, validation=val)
    par = ParallelConfig(tp=2, pp=2, dp=2, global_batch=16)
    gpt = project(resolve_model("gpt3-1.3b"), par, load_cluster("h200-8"), cal)
    assert gpt.error_band["pct"] == 4.5 and gpt.error_band["family"] == "gpt3" and gpt.error_band["all_pct"] == 30.0
    assert gpt.error_band["high"] == pytest.approx(gpt.step_time_s * 1.045)
    assert "3 measured gpt3 run(s)" in gpt.error_band["from"] and "all families: 30.0%" in gpt.error_band["from"]
    # Fewer than three held-out runs of its family (one Mixtral run): the worst over all runs.
    moe = project(resolve_model("mixtral-8x7b"), ParallelConfig(tp=1, ep=2, dp=2, pp=2, global_batch=16),
                  load_cluster("h200-8"), cal)
    assert moe.error_band["pct"] == 30.0 and "family" not in moe.error_band


def test_error_band_follows_the_runs_no_more_host_bound_than_the_projection(calibration) -> None:
    """With the validated runs' predicted host shares (calib validate keeps them), the band is the worst held-out
    error over the family's runs whose share is at most the projection's (or HOST_BOUND_SHARE, whichever is more);
    with fewer than REGIME_BAND_MIN_RUNS such runs it is the family's worst, as before."""
    import dataclasses

    from calib.project import HOST_BOUND_SHARE, REGIME_BAND_MIN_RUNS, host_share

    model, par, cluster = resolve_model("gpt3-1.3b"), ParallelConfig(tp=2, pp=2, dp=2, global_batch=16), load_cluster("h200-8")
    share = project(model, par, cluster, calibration).host_share
    assert share is not None and 0 <= share < 0.5
    gpu_bound = [{"run": f"g{i}", "kind": "heldout", "model": "gpt3-13b@L4", "error_pct": 1.0 + 0.1 * i,
                  "host_share": 0.0} for i in range(REGIME_BAND_MIN_RUNS)]
    host_bound = [{"run": f"h{i}", "kind": "heldout", "model": "gpt3-1.3b@L8", "error_pct": -20.0 - i,
                   "host_share": 0.6} for i in range(3)]
    val = {"heldout_mape": 6.0, "heldout_max": 22.0, "heldout_count": 13, "runs": gpu_bound + host_bound}
    r = project(model, par, cluster, dataclasses.replace(calibration, validation=val))
    assert r.error_band["pct"] == pytest.approx(1.0 + 0.1 * (REGIME_BAND_MIN_RUNS - 1))
    assert r.error_band["family_pct"] == 22.0 and r.error_band["all_pct"] == 22.0
    assert r.error_band["host_share_upto"] == max(HOST_BOUND_SHARE, share)
    assert f"{REGIME_BAND_MIN_RUNS} measured gpt3 run(s) whose predicted host share was at most" in r.error_band["from"]
    # One GPU-bound run fewer: too few alike, so the family's worst, host-paced runs included.
    val["runs"] = gpu_bound[1:] + host_bound
    assert project(model, par, cluster, dataclasses.replace(calibration, validation=val)).error_band["pct"] == 22.0
    assert host_share({"compute": 0.9, "other": 0.1}, 1.0) == pytest.approx(0.1)
    assert host_share({"compute": 1.0}, 1.0) is None and host_share({"other": 0.1}, None) is None


def test_gpu_mismatch_refused_unless_allowed(calibration) -> None:
    model, par, h100 = resolve_model("gpt3-1.3b"), ParallelConfig(tp=8, global_batch=8), load_cluster("dgx-h100")
    with pytest.raises(CalibError, match="fitted on NVIDIA H200 but cluster dgx-h100 has H100"):
        project(model, par, h100, calibration)
    r = project(model, par, h100, calibration, allow_gpu_mismatch=True)
    assert any("kernel model" in t for t in r.transferred) and any("power model" in t for t in r.transferred)


def test_largest_scale(calibration) -> None:
    r = project(resolve_model("gpt3-175b"), ParallelConfig(tp=8, pp=16, dp=256, global_batch=4096),
                load_cluster("dgx-h200"), calibration)
    assert r.inputs["gpus"] == 32768 and r.step_time_s > 0 and r.sim["simulated_ranks"] == 16


def test_plots(main_result, tmp_path) -> None:
    png = plot_projection(main_result, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = plot_projection(main_result, tmp_path / "p.html").read_text()
    assert "step time" in html and "pipeline_bubble" in html
    with pytest.raises(CalibError, match="must end in .png or .html"):
        plot_projection(main_result, tmp_path / "p.svg")


def test_cli_json_and_bad_input(calibration, tmp_path, capsys) -> None:
    cal_path = tmp_path / "cal.yaml"
    calibration.save(cal_path)
    base = ["project", "--model", "gpt3-1.3b", "--cluster", "dgx-h200", "--calibration", str(cal_path), "--gbs", "64"]
    assert main([*base, "--gpus", "16", "--tp", "2", "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"]["parallel"]["dp"] == 4 and out["step_time_s"] > 0
    bad = [
        (["--gpus", "12", "--tp", "2"], "not a multiple of the node size 8"),
        (["--gpus", "16", "--tp", "2", "--pp", "2", "--dp", "2"], "must equal TP x PP x DP"),
        (["--gpus", "16", "--tp", "3"], "is not a multiple of TP x PP"),
        (["--gpus", "24", "--tp", "3", "--pp", "1"], "TP 3 does not divide the 16 attention heads"),
        (["--gpus", "16", "--pp", "5", "--dp", "3", "--tp", "1"], "must equal TP x PP x DP"),
        (["--gpus", "16", "--tp", "1", "--pp", "16"], "PP 16 does not divide the 24 layers"),
        (["--gpus", "16", "--tp", "2", "--ep", "2"], "needs a mixture-of-experts model"),
    ]
    for args, message in bad:
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    moe = ["project", "--model", "mixtral-8x7b", "--cluster", "dgx-h200", "--calibration", str(cal_path), "--gbs", "64"]
    assert main([*moe, "--gpus", "48", "--tp", "1", "--ep", "5"]) == 2
    assert "EP 5 must divide DP 48" in capsys.readouterr().err
    for args, message in (
        (["--model", "gpt5"], "unknown model 'gpt5'"),
        (["--cluster", "nowhere"], "unknown cluster 'nowhere'"),
        (["--cluster", "dgx-h100"], "pass --allow-gpu-mismatch"),
    ):
        full = ["project", "--model", "gpt3-1.3b", "--cluster", "dgx-h200", "--calibration", str(cal_path),
                "--gbs", "64", "--gpus", "8", "--tp", "8", *args]
        assert main(full) == 2
        assert message in capsys.readouterr().err


def test_sweep_ranks_and_discards_out_of_memory(calibration) -> None:
    model = resolve_model("gpt3-6.7b")
    seen: list[tuple[int, int]] = []
    ranked, oom, notes = sweep(model, 16, ParallelConfig(global_batch=16), load_cluster("dgx-h100"), calibration,
                               allow_gpu_mismatch=True, max_configs=8, workers=2,
                               progress=lambda d, t: seen.append((d, t)))
    assert ranked and oom and len(ranked) <= 12
    steps = [r.step_time_s for r in ranked]
    assert steps == sorted(steps) and all(math.isfinite(s) for s in steps)
    assert all(r.fits for r in ranked) and not any(r.fits for r in oom)
    assert all(r.par.gpus == 16 for r in ranked + oom)
    assert seen[-1][0] == seen[-1][1] == len(ranked)
    assert any("out of memory" in n for n in notes)


def test_emit_astra_sim_files(calibration, tmp_path) -> None:
    from calib.chakra.codec import read_et
    from calib.chakra.validate import problems

    out = tmp_path / "astra"
    project(resolve_model("gpt3-1.3b@L4"), ParallelConfig(tp=2, pp=2, dp=4, global_batch=8), load_cluster("dgx-h200"),
            calibration, emit_astra_sim=out)
    names = {p.name for p in out.iterdir()}
    assert {"system.json", "network.yml", "memory.json", "comm_groups.json", "run.sh"} <= names
    assert {f"workload.{r}.et" for r in range(16)} <= names
    assert problems(read_et(out / "workload.13.et")) == []
    assert "--comm-group-configuration=comm_groups.json" in (out / "run.sh").read_text()


def test_cli_sweep_json(calibration, tmp_path, capsys) -> None:
    cal_path = tmp_path / "cal.yaml"
    calibration.save(cal_path)
    args = ["project", "--model", "gpt3-1.3b", "--gpus", "16", "--gbs", "32", "--cluster", "dgx-h200",
            "--calibration", str(cal_path), "--sweep", "--sweep-max", "3", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["ranked"]) == 3 and out["ranked"][0]["step_time_s"] <= out["ranked"][-1]["step_time_s"]
    assert any("best by FLOPs" in n for n in out["notes"])


def test_readme_command_on_the_bundled_calibration(capsys) -> None:
    from calib.project import default_calibration_path

    if not default_calibration_path("H200").is_file():
        pytest.skip("no bundled H200 calibration yet")
    argv = ["project", "--model", "gpt3-175b", "--gpus", "8192", "--tp", "8", "--pp", "16", "--mbs", "1",
            "--gbs", "1536", "--cluster", "dgx-h200", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["calibration_id"].startswith("NVIDIA H200") and out["fits_in_memory"]
    assert sum(out["breakdown_s"].values()) == pytest.approx(out["step_time_s"], rel=1e-6)
    assert any(c.startswith("kernel times") for c in out["calibrated"])
    assert out["error_band"]["low"] < out["step_time_s"] < out["error_band"]["high"]


def test_host_costs_follow_the_code_path_up_to_the_longest_measured(calibration) -> None:
    import dataclasses

    from calib.models.host import HostModel

    def run(gpus: int, tp: int = 1, pp: int = 1, fitted: tuple[float, ...] = (0.0, 1.5)):
        host = HostModel(20e-6, 1e-4, pace_per_path=1.5, fitted_paths=list(fitted))
        cal = dataclasses.replace(calibration, host=host.to_dict())
        dp = gpus // (tp * pp)
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=2 * dp)
        return project(resolve_model("gpt3-1.3b").scaled_down(2, 1024), par, load_cluster("dgx-h200"), cal)

    one, dp16, tp2, pp2, tp2pp2 = run(1), run(16), run(2, tp=2), run(2, pp=2), run(8, tp=2, pp=2)
    line = lambda r: next(c for c in r.calibrated if c.startswith("host:"))  # noqa: E731
    # Data and tensor parallelism take the one-GPU path however many GPUs share a host (TP's own cost is
    # its rendezvous); PP takes its weight of 1.5.
    assert all("20.0 us per kernel launch" in line(r) for r in (one, dp16, tp2))
    assert "TP 2 / PP 1 / EP 1" in line(tp2)
    assert f"{20 * 1.5**1.5:.1f} us per kernel launch" in line(pp2) and line(tp2pp2) == line(pp2).replace("TP 1", "TP 2")
    assert not any("longest code path measured" in n for r in (tp2, pp2, tp2pp2) for n in r.notes)
    # PP beyond the longest path measured (one GPU only): held there, and the report says so.
    held = run(2, pp=2, fitted=(0.0,))
    assert "20.0 us per kernel launch" in line(held)
    assert any("longest code path measured" in n for n in held.notes)


def test_energy_counts_the_generated_gemm_and_attention_work(calibration, main_result) -> None:
    """The power model's FLOP term adds energy_per_flop_j x the generated step's GEMM/attention FLOPs
    (every GPU's): against the model's FLOPs per step (Megatron's formula) within a few percent."""
    per_flop = 3.6e-13
    power = PowerModel(dict(POWER_W), peak_power_w=700.0, energy_per_flop_j=per_flop).to_dict()
    cal = Calibration(**{**calibration.__dict__, "power": power})
    r = project(resolve_model("gpt3-175b"), ParallelConfig(**MAIN), load_cluster("dgx-h200"), cal)
    assert r.step_time_s == pytest.approx(main_result.step_time_s)
    extra = r.energy_j_per_step - main_result.energy_j_per_step
    assert extra == pytest.approx(per_flop * r.sim["hardware_flops_per_step"], rel=0.05)


def test_pipeline_waits_draw_communication_power() -> None:
    """A stage's send/recv wait is communication in the projected shares, as in the fitted ones."""
    from types import SimpleNamespace

    from calib.project import _activity_shares

    gen = SimpleNamespace(stage_compute_s=[0.5], stage_memory_s=[0.2])
    result = SimpleNamespace(exposed_ns=[{"tp": 1e8, "pp": 2e8}])
    shares = _activity_shares(gen, result, 0, 0, 1.0)  # type: ignore[arg-type]
    assert shares == pytest.approx({"compute": 0.3, "memory": 0.2, "comm": 0.3, "idle": 0.2})


def test_tp_rendezvous_is_reported_and_its_micro_batch_range_noted(calibration) -> None:
    import dataclasses

    from calib.models.host import HostModel

    model = resolve_model("gpt3-1.3b").scaled_down(2, 1024)
    cluster = load_cluster("dgx-h200")
    host = HostModel(1e-6, 1e-4, tp_rendezvous_s=80e-6, tp_rendezvous_microbatches=8)  # GPU-bound: nothing hides it
    cal = dataclasses.replace(calibration, host=host.to_dict())
    bare = dataclasses.replace(calibration, host=HostModel(1e-6, 1e-4).to_dict())

    def run(c: Calibration, gbs: int, tp: int = 2):
        return project(model, ParallelConfig(tp=tp, dp=1, micro_batch=1, global_batch=gbs), cluster, c)

    eight, many, one_gpu = run(cal, 8), run(cal, 32), run(cal, 8, tp=1)
    assert any("TP rendezvous: 80 us" in c for c in eight.calibrated)
    assert not any("TP rendezvous" in n for n in eight.notes)
    assert any("at most 8 micro-batches, this one has 32" in n for n in many.notes)
    assert not any("TP rendezvous" in c for c in one_gpu.calibrated)
    # It lengthens the TP step: every blocking TP collective waits 80 us more.
    assert eight.step_time_s > run(bare, 8).step_time_s
