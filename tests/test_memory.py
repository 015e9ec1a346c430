"""The memory model (calib.models.memory): the allocator's reserve, the memory outside it and the
device's capacity, fitted on the committed bundles, and the out-of-memory verdict they give.

The verdict is checked against what happened on the H100: `llama8b-1gpu-mbs2-L8` ran out of memory
there (its campaign log is committed, traces/h100/_campaigns/x1-round12/logs.tar.xz) and `llama8b-1gpu-mbs2-L2`
ran (traces/h100/llama8b-1gpu-mbs2-L2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calib.bundle import read_bundle
from calib.calibration import Calibration
from calib.cluster import load_cluster
from calib.errors import CalibError
from calib.fit import _fit_memory_section, memory_points
from calib.models.memory import MemoryModel, MemoryPoint, device_memory, memory_errors
from calib.project import project
from calib.units import GIB
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig
from measure.campaigns.logs import read_log
from tests.conftest import ROOT, TRACES


def _training(gpu: str) -> list:
    out = []
    for manifest in sorted((TRACES / gpu).glob("*/manifest.json")):
        b = read_bundle(manifest.parent)
        if b.manifest.kind == "training" and b.manifest.status == "complete":
            out.append(b)
    return out


H100 = _training("h100")
needs_h100 = pytest.mark.skipif(not any(b.id.endswith("-r13") for b in H100), reason="no round-13 H100 bundles")


@needs_h100
def test_fit_on_the_h100_bundles_counts_what_the_device_held() -> None:
    points = memory_points(H100)
    model = MemoryModel.fit(points)
    recorded = [p for p in points if p.outside_bytes is not None]
    assert recorded and model.outside_runs == len(recorded)
    # The most any rank held outside the allocator, and the largest reserve ratio, are the model's.
    assert model.outside_allocator_bytes == max(p.outside_bytes for p in recorded)
    assert model.reserve_ratio == pytest.approx(max(p.reserve_ratio for p in points))
    assert 1.0 <= model.reserve_ratio_median <= model.reserve_ratio
    # What a process may use as CUDA saw it (the probes' total from round 15 on, 0.5 GiB under the
    # device total the manifests record), not the datasheet's 80e9 bytes.
    usable = [p.capacity_bytes for p in points if p.capacity_bytes < max(b.manifest.gpu.memory_bytes for b in H100)]
    if usable:
        assert model.capacity_bytes == min(usable) == pytest.approx(79.18 * GIB, abs=0.01 * GIB)
    else:
        assert model.capacity_bytes == min(b.manifest.gpu.memory_bytes for b in H100)
    assert model.capacity_bytes > load_cluster("h100-1").hbm_bytes
    errors, held = memory_errors(points)
    assert errors["memory"].count == len(points) and errors["memory"].max < 10.0
    assert errors["memory.device_peak"].count == held["runs"] == len(recorded)
    assert 0 <= held["within"] <= held["runs"]


def test_the_bundled_calibrations_verdicts_match_what_ran_on_the_h100() -> None:
    cal = Calibration.load(ROOT / "calib" / "data" / "calibration-h100.yaml")
    if cal.memory_model() is None:
        pytest.skip("the bundled H100 calibration has no memory section")
    cluster = load_cluster("h100-1")
    par = ParallelConfig(micro_batch=2, global_batch=8)
    failed = project(resolve_model("llama3-8b@L8,S2048"), par, cluster, cal)
    ran = project(resolve_model("llama3-8b@L2,S2048"), par, cluster, cal)
    assert "out of memory" in (read_log(TRACES / "h100" / "_campaigns" / "x1-round12", "llama8b-1gpu-mbs2-L8") or "")
    assert (TRACES / "h100" / "llama8b-1gpu-mbs2-L2").is_dir()
    # The allocator estimate alone said the failed run fits the datasheet's 80 GB; the device peak does not.
    assert failed.memory_gib_per_gpu * GIB < cluster.hbm_bytes
    assert failed.memory_verdict == "tight" and failed.fits_in_memory
    assert failed.memory_detail_gib["device_high"] > failed.memory_detail_gib["capacity"]
    assert ran.memory_verdict == "fits"
    assert any(c.startswith("memory.hbm_bytes") for c in failed.calibrated)
    assert not any(c.startswith("memory.hbm_bytes") for c in failed.configured)


CAMPAIGNS = TRACES / "h100" / "_campaigns"


@pytest.mark.parametrize("round_", ["x1-round14", "x1-round15"])
def test_verdicts_against_the_h100_runs_at_the_memory_edge(round_: str) -> None:
    """Rounds 14 and 15 ran one-GPU depths around the H100's memory edge, each verdict given before the
    run (traces/README.md; round 15's in its predictions.json): every run said to fit ran, every run said
    to be out of memory ran out, and a tight one may go either way."""
    import json

    from measure.campaigns.h200 import TRAININGS

    folder = CAMPAIGNS / round_
    if not (folder / "campaign.json").is_file():
        pytest.skip(f"no {round_} campaign record")
    cal = Calibration.load(ROOT / "calib" / "data" / "calibration-h100.yaml")
    if cal.memory_model() is None:
        pytest.skip("the bundled H100 calibration has no memory section")
    specs = {s[0]: s for s in TRAININGS}
    outcome: dict[str, list[bool]] = {}
    for job in json.loads((folder / "campaign.json").read_text()):
        log = read_log(folder, job["id"]) or ""
        ran = job["rc"] == 0 and (TRACES / "h100" / job["id"] / "manifest.json").is_file()
        assert ran or "out of memory" in log, job["id"]
        _, model, tp, pp, dp, ep, mbs, gbs, rc, _ = specs[job["id"]]
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=mbs, global_batch=gbs, recompute=rc)
        verdict = project(resolve_model(model), par, load_cluster("h100-1"), cal).memory_verdict
        outcome.setdefault(verdict, []).append(ran)
    assert all(outcome.get("fits", [])) and not any(outcome.get("out of memory", []))
    assert outcome.get("out of memory") and len(outcome.get("tight", [])) >= 3


def test_verdict_brackets_the_device_peak() -> None:
    model = MemoryModel(reserve_ratio=1.2, reserve_ratio_median=1.05, outside_allocator_bytes=9 * GIB, runs=3,
                        outside_runs=1, capacity_bytes=80 * GIB)
    assert model.device_bytes(50 * GIB) == (59 * GIB, 69 * GIB)
    assert model.verdict(50 * GIB, 80 * GIB) == "fits"  # 69 GiB at the measured reserve
    assert model.verdict(65 * GIB, 80 * GIB) == "tight"  # 74-87 GiB
    assert model.verdict(72 * GIB, 80 * GIB) == "out of memory"  # 81 GiB even fully packed
    none = device_memory(72 * GIB, 80 * GIB, None)  # no memory model: the estimate alone, as before
    assert none.verdict == "fits" and not none.calibrated and none.outside_bytes == 0
    assert not device_memory(72 * GIB, 80 * GIB, model).fits


def test_held_out_bracket_and_refusals() -> None:
    g = GIB
    pts = [MemoryPoint("a", "A", 30 * g, 30 * g, 33 * g, 9 * g), MemoryPoint("b", "B", 40 * g, 40 * g, 42 * g, 9 * g),
           MemoryPoint("c", "C", 20 * g, 20 * g, 26 * g, None)]
    errors, held = memory_errors(pts)
    # Held out, a's bracket is 30 x 1.3 + 9 = 48 >= its 42 GiB; b's is 40 x 1.3 + 9 = 61 >= 51.
    assert held == {"runs": 2, "within": 2, "worst_excess_pct": 0.0}
    assert errors["memory"].mape == 0.0 and errors["memory.device_peak"].count == 2
    # A run with more reserve than every other configuration's exceeds the bracket fitted without it.
    pts.append(MemoryPoint("d", "D", 40 * g, 40 * g, 60 * g, 9 * g))
    _, held = memory_errors(pts)
    assert held["within"] == 2 and held["worst_excess_pct"] == pytest.approx(100 * (69 - (40 * 1.3 + 9)) / 69, abs=1e-3)
    with pytest.raises(CalibError, match="peak allocated"):
        MemoryModel.fit([MemoryPoint("x", "X", 1.0, 0.0, 0.0, None)])


def test_memory_outside_the_allocator_follows_the_gpu_count() -> None:
    """Ranks of a 4-GPU run hold more outside the allocator (a communicator's buffers per group and peer)
    than those of 1- or 2-GPU runs: each count keeps its own, a count between two takes the lower's, one
    beyond the largest the largest's, and a file without the counts one value for all."""
    g, mb = GIB, 2**20
    one, two, four, other_four = 9114 * mb, 9011 * mb, 16282 * mb, 13312 * mb
    pts = [MemoryPoint("a", "A", 30 * g, 30 * g, 33 * g, one, 0.0, 1), MemoryPoint("b", "B", 40 * g, 40 * g, 42 * g, two, 0.0, 2),
           MemoryPoint("c", "C", 20 * g, 20 * g, 22 * g, four, 0.0, 4), MemoryPoint("d", "D", 20 * g, 20 * g, 22 * g, other_four, 0.0, 4)]
    model = MemoryModel.fit(pts)
    assert [model.outside_for(n) for n in (1, 2, 3, 4, 8192)] == [one, two, two, four, four]
    assert model.outside_for(None) == model.outside_allocator_bytes == four
    assert device_memory(50 * g, 80 * g, model, 1).outside_bytes == one
    back = MemoryModel.from_dict(model.to_dict())
    assert back.outside_by_gpus == model.outside_by_gpus
    old = {k: v for k, v in model.to_dict().items() if k != "outside_allocator_bytes_by_gpus"}
    assert MemoryModel.from_dict(old).outside_for(1) == four
    # Held out, each 4-GPU run is predicted with the other's memory outside (its own count), not the
    # 1-GPU run's: d, at 22 GiB reserved + 13 outside, is 16282 - 13312 MiB over, the largest error.
    errors, _ = memory_errors(pts)
    assert errors["memory.device_peak"].count == 4
    assert errors["memory.device_peak"].max == pytest.approx(100 * (four - other_four) / (22 * g + other_four), rel=1e-6)


@needs_h100
def test_capacity_is_what_a_process_may_use_where_the_probes_recorded_it(tmp_path: Path) -> None:
    """Round 15's probes record cudaMemGetInfo's total; the capacity is the smallest of those, else the
    device total of the manifest (round 13-14 bundles)."""
    import json
    import shutil

    src = next(b for b in H100 if b.id.endswith("-r13"))
    assert memory_points([src])[0].capacity_bytes == src.manifest.gpu.memory_bytes
    dst = tmp_path / src.id
    shutil.copytree(src.path, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for rank in manifest["memory"]:
        for i, probe in enumerate(rank["probes"]):
            probe["total_bytes"] = int(79.18 * GIB) + i
    (dst / "manifest.json").write_text(json.dumps(manifest))
    [point] = memory_points([read_bundle(dst)])
    assert point.capacity_bytes == int(79.18 * GIB) < src.manifest.gpu.memory_bytes


def test_calibration_round_trip_and_malformed_section(tmp_path: Path) -> None:
    cal = Calibration(gpu="NVIDIA H100 80GB HBM3")
    _fit_memory_section(cal, H100 or [])
    if not H100:
        assert "memory" in cal.provenance
        return
    path = cal.save(tmp_path / "c.yaml")
    back = Calibration.load(path)
    assert back.memory == cal.memory and back.memory_model() == MemoryModel.from_dict(cal.memory)
    assert "memory.device_peak" in back.errors
    text = path.read_text().replace("reserve_ratio:", "reserve_ratioo:", 1)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(CalibError, match="memory"):
        Calibration.load(tmp_path / "bad.yaml")


PROBE = TRACES / "h200" / "_probes" / "memory-peak"


def _probe_runs() -> list[dict]:
    """The probe's runs, each call's JSON committed xz-compressed (the fiftieth session, for room in the tree)."""
    import json
    import lzma

    return [r for f in sorted(PROBE.glob("*.json.xz")) for r in json.loads(lzma.decompress(f.read_bytes())).values()
            if "error" not in r]


@pytest.mark.skipif(not PROBE.is_dir(), reason="no memory-peak probe committed")
def test_estimate_matches_the_allocator_history_at_the_peak() -> None:
    """measure.probes.memory_peak recorded, on one H200, the allocated peak of GPT-3 6.7B without,
    with selective and with full recomputation, GPT-3 1.3B and Llama-3 8B, and the attention buffer
    megatron-core keeps between steps: the estimate's parts are what it read there."""
    from calib.workload.memory import attention_buffer_bytes, estimate

    runs = _probe_runs()
    assert {r["recompute"] for r in runs} == {"none", "selective", "full"}
    for r in runs:
        model = resolve_model(r["model"])
        par = ParallelConfig(micro_batch=r["micro_batch"], global_batch=r["global_batch"], recompute=r["recompute"])
        est = estimate(model, par, 150 * GIB)
        assert est.total_bytes == pytest.approx(r["peak_allocated_bytes"], rel=0.01), r["label"]
        buffer = sum(g["bytes"] for g in r["held_between_steps"] if "get_tensor" in g["where"])
        assert est.buffers_bytes == attention_buffer_bytes(model, par) == pytest.approx(buffer, rel=1e-3), r["label"]


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_estimate_against_every_committed_run(gpu: str) -> None:
    """The estimate against each run's peak allocated (the `memory` error of `calib fit`): within 4 %
    for every run, and 1 % on average (before the probe: 2.3 / 8.3 % on the H200)."""
    points = memory_points(_training(gpu))
    errs = [abs(p.estimate_bytes / p.allocated_bytes - 1) for p in points]
    assert len(errs) >= 20
    assert max(errs) < 0.04 and sum(errs) / len(errs) < 0.01


def test_campaign_predictions_pass_every_modelled_flag() -> None:
    """measure.campaigns.predict builds each job's configuration with the flags the projection models:
    round 20 predicted gpt13b-dp2-distopt-og without its distributed optimizer, 30 % over its peak."""
    from measure.campaigns.predict import predict

    bundle = read_bundle(TRACES / "h100" / "gpt13b-dp2-distopt-og")
    got = predict(["gpt13b-dp2-distopt-og", "llama8b-pp2vpp2dp2"], "h200-4")
    distopt = got["gpt13b-dp2-distopt-og"]
    assert "--distributed-optimizer --overlap-grad-reduce" in distopt["command"]
    assert "--vpp 2" in got["llama8b-pp2vpp2dp2"]["command"]
    peak = bundle.manifest.memory[0].peak_allocated_bytes / GIB
    assert distopt["memory_gib_per_gpu"] == pytest.approx(peak, rel=0.02)
