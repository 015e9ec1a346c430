"""calib validate: measured step times, replay preparation, thresholds, reports, the --check verdict.

Mechanics are tested on small CPU bundles built here (they never count in an error figure, and the
tests check that they do not) and on the shared H200 sample traces; the figures on the committed
GPU bundles are tested in test_validate_traces.py, which skips when traces/ has none.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from calib.bundle import BundleWriter, GpuInfo, Manifest, RunSpec, StepsInfo, read_bundle
from calib.chakra.model import Attr, CommType, ExecutionTrace, Node, NodeType
from calib.cli import main
from calib.errors import CalibError
from calib.validate import run_validation
from calib.validation.measured import et_breakdown_s, is_real_gpu, measured_step, parallelism_type
from calib.validation.replay import replay_trace
from calib.validation.report import markdown, summary_lines, write_reports
from calib.validation.thresholds import Thresholds, load_thresholds, violations
from calib.validation.types import HELDOUT, REPLAY, RunError, ValidationReport, summarize
from tests.conftest import ROOT


def cpu_bundle(path: Path, times: dict[int, list[float]], profiled_time: float | None = None) -> Path:
    """A CPU (gloo) training bundle whose per-rank step times are given; optionally one profiled step
    at the end (its ETs are not written: read it with read_bundle, which does not check them)."""
    spec = RunSpec(model="gpt3-1.3b@L2", tp=1, pp=1, dp=len(times), global_batch=len(times), seq_length=2048)
    n = len(next(iter(times.values())))
    m = Manifest(kind="training", gpu=GpuInfo(name="cpu", count=len(times), vendor="cpu"), spec=spec,
                 steps=StepsInfo(warmup=2, measured=n, profiled=[2 + n] if profiled_time else []))
    w = BundleWriter(path, m)
    rows = []
    for rank, ts in times.items():
        start = 0.0
        for i, t in enumerate(ts):
            rows.append({"rank": rank, "step": 2 + i, "start_s": start, "time_s": t, "profiled": False})
            start += t
        if profiled_time:
            rows.append({"rank": rank, "step": 2 + n, "start_s": start, "time_s": profiled_time, "profiled": True})
    w.write_table("steps", pd.DataFrame(rows))
    return w.finish()


def test_measured_step_is_median_over_steps_of_slowest_rank(tmp_path: Path) -> None:
    # per-step max over ranks: 1.0, 1.2, 1.1, 3.0 (an outlier), 1.05 -> median 1.1; the profiled 9 s step is out
    b = read_bundle(cpu_bundle(tmp_path / "b", {0: [1.0, 1.2, 1.0, 3.0, 1.05], 1: [0.9, 1.1, 1.1, 1.0, 1.0]}, 9.0))
    ms = measured_step(b)
    assert ms.time_s == pytest.approx(1.1)
    assert ms.steps == 5
    assert ms.spread == pytest.approx((2.28 - 1.02) / 1.1)  # (p90 - p10) / median, linear percentiles
    assert not is_real_gpu(b)


def test_measured_step_needs_unprofiled_steps(tmp_path: Path) -> None:
    spec = RunSpec(model="gpt3-1.3b@L2")
    w = BundleWriter(tmp_path / "b", Manifest(kind="training", gpu=GpuInfo(vendor="cpu"), spec=spec))
    w.write_table("steps", pd.DataFrame([{"rank": 0, "step": 0, "start_s": 0.0, "time_s": 1.0, "profiled": True}]))
    with pytest.raises(CalibError, match="no measured"):
        measured_step(read_bundle(w.finish()))


def test_parallelism_labels() -> None:
    assert parallelism_type(RunSpec(tp=2, dp=4)) == "TP+DP"
    assert parallelism_type(RunSpec(dp=8, ep=8)) == "DP+EP"
    assert parallelism_type(RunSpec()) == "single"


def _et() -> ExecutionTrace:
    return ExecutionTrace(nodes=[
        Node(1, "aten::mm", NodeType.COMP_NODE, duration_micros=500, attrs=[Attr("is_cpu_op", True)]),
        Node(2, "gemm", NodeType.COMP_NODE, data_deps=[1], duration_micros=3,
             attrs=[Attr("is_cpu_op", False), Attr("duration_ns", 2600), Attr("category", "compute")]),
        Node(3, "allreduce", NodeType.COMM_COLL_NODE, data_deps=[2], duration_micros=90,
             attrs=[Attr("is_cpu_op", False), Attr("comm_type", int(CommType.ALL_REDUCE)), Attr("comm_size", 1 << 20),
                    Attr("duration_ns", 90_000), Attr("wait_ns", 70_000), Attr("transfer_ns", 20_000),
                    Attr("category", "tp")]),
    ])


def test_replay_drops_cpu_time_and_wait_keeps_kernels() -> None:
    et = _et()
    r = replay_trace(et)
    by = r.by_id()
    assert by[1].duration_ns == 0 and by[1].duration_micros == 0  # profiled host op: not replayed
    assert by[2].duration_ns == 2600  # kernel as measured
    assert by[3].duration_ns == 20_000 and by[3].duration_micros == 20  # transfer part only
    assert by[3].data_deps == [2]
    assert et.by_id()[1].duration_micros == 500 and et.by_id()[3].duration_ns == 90_000  # input untouched


def test_et_breakdown_counts_kernels_transfer_and_wait() -> None:
    bd = et_breakdown_s({0: _et(), 1: _et()})
    assert bd["compute"] == pytest.approx(2.6e-6)
    assert bd["tp"] == pytest.approx(20e-6)
    assert bd["wait"] == pytest.approx(70e-6)
    assert "cpu" not in bd


def _run(run: str, kind: str, measured: float, predicted: float | None, par: str = "TP") -> RunError:
    from calib.validation.types import relative_error_pct

    return RunError(run=run, config=f"cfg-{run}", model="m", gpus=2, tp=2, pp=1, dp=1, ep=1, parallelism=par,
                    kind=kind, measured_step_s=measured, measured_steps=10, predicted_step_s=predicted,
                    error_pct=relative_error_pct(predicted, measured),
                    breakdown_measured_s={"compute": 0.8 * measured, "tp": 0.1 * measured},
                    breakdown_predicted_s={"compute": 0.8 * measured, "tp": 0.12 * measured})


def test_summary_statistics() -> None:
    runs = [_run("a", HELDOUT, 1.0, 1.02), _run("b", HELDOUT, 2.0, 1.9), _run("a", REPLAY, 1.0, 0.99),
            _run("c", HELDOUT, 1.0, None)]
    s = summarize(runs, real_bundles=3)
    assert s["heldout_mape"] == pytest.approx(3.5)  # (2 + 5) / 2
    assert s["heldout_max"] == pytest.approx(5.0)
    assert s["heldout_count"] == 2 and s["heldout_missing"] == 1
    assert s["replay_mape"] == pytest.approx(1.0) and s["replay_count"] == 1


def test_the_configuration_floor_is_the_least_error_of_one_step_per_configuration(tmp_path: Path) -> None:
    """No single step per configuration has a lower mean error on its runs than the floor's, which a
    configuration measured once does not raise; the summary and the reports carry it."""
    import dataclasses

    import numpy as np

    from calib.validation.report import FLOOR_LABEL
    from calib.validation.types import config_floor

    steps = [1.0, 1.1, 1.45, 1.2]
    runs = [dataclasses.replace(_run(f"a{i}", HELDOUT, m, m), config="cfg-a") for i, m in enumerate(steps)]
    runs += [_run("b", HELDOUT, 2.0, 2.6), _run("a0", REPLAY, 1.0, 1.3)]
    by_config = config_floor(runs)
    assert sorted(by_config) == ["cfg-a", runs[4].config] and by_config[runs[4].config] == [0.0]  # b alone: 0
    floor = [e for errs in by_config.values() for e in errs]
    assert len(floor) == 5 and sorted(by_config["cfg-a"])[0] == 0.0  # the step chosen among a's
    grid = np.linspace(0.9, 1.6, 1401)
    best = min(np.mean([abs(p - m) / m for m in steps]) for p in grid)
    assert sum(floor) / 4 == pytest.approx(100 * best, abs=1e-3)
    s = summarize(runs, real_bundles=5)
    assert s["config_floor_mape"] == pytest.approx(sum(floor) / 5) and s["config_floor_max"] == pytest.approx(max(floor))
    assert s["config_floor_count"] == 5 and s["config_floor_configs"] == 2
    md = write_reports(ValidationReport(runs=runs, models=[], summary=s, calibration={}), tmp_path)["md"].read_text()
    assert FLOOR_LABEL in md


def test_repeated_configurations_are_reported_with_their_spread(tmp_path: Path) -> None:
    """Runs sharing a configuration (twins, repeats) give the spread between their measured steps, in the
    summary and in the reports; a configuration measured once gives none."""
    import dataclasses

    from calib.validation.types import repeats

    twin = dataclasses.replace(_run("a2", HELDOUT, 1.2, 1.1), config="cfg-a")
    runs = [_run("a", HELDOUT, 1.0, 1.1), _run("a", REPLAY, 1.0, 1.0), twin, _run("b", HELDOUT, 2.0, 2.0)]
    rep = repeats(runs)
    assert [(r["config"], r["runs"]) for r in rep] == [("cfg-a", ["a", "a2"])]
    assert rep[0]["spread_pct"] == pytest.approx(20.0)
    s = summarize(runs, real_bundles=3)
    assert s["repeat_configs"] == 1 and s["repeat_spread_max"] == pytest.approx(20.0)
    assert summarize(runs[:2], real_bundles=1)["repeat_spread_mean"] is None
    report = ValidationReport(runs=runs, models=[], summary=s, calibration={})
    paths = write_reports(report, tmp_path)
    md = paths["md"].read_text()
    assert "## Repeated configurations" in md and "| cfg-a | a, a2 | 1000.00, 1200.00 | 20.00% | +10.00%, -8.33% |" in md
    assert "Repeated configurations" in paths["html"].read_text()


def test_runs_sampled_for_their_host_pace_get_a_section(tmp_path: Path) -> None:
    """Runs whose bundle carries the host's pace (the sampler's work, the trainer's own launch pace, or both)
    are listed with it beside their held-out and replay errors, slower host last within a configuration; runs
    without either are left out, and with none sampled there is no section."""
    import dataclasses

    slow = dataclasses.replace(_run("a", HELDOUT, 1.0, 1.1), host_work_s=2.4e-3, own_launch_s=11.5e-6,
                               profiled_span_s=150e-6)
    fast = dataclasses.replace(_run("a2", HELDOUT, 0.8, 1.1), config="cfg-a", host_work_s=1.2e-3)
    own_only = dataclasses.replace(_run("c", HELDOUT, 0.5, 0.5), config="cfg-c", own_launch_s=6.7e-6)
    runs = [slow, fast, dataclasses.replace(_run("a", REPLAY, 1.0, 1.05), host_work_s=2.4e-3), own_only,
            _run("b", HELDOUT, 2.0, 2.0)]
    report = ValidationReport(runs=runs, models=[], summary=summarize(runs, real_bundles=4), calibration={})
    paths = write_reports(report, tmp_path)
    md = paths["md"].read_text()
    section = md.split("## Host pace", 1)[1]
    assert "| a2 | cfg-a | 800.00 | n/a | 1.20 | - | - | +37.50% | n/a |" in section
    assert "| a | cfg-a | 1000.00 | n/a | 2.40 | 11.50 | 150.0 | +10.00% | +5.00% |" in section
    assert "| c | cfg-c | 500.00 | n/a | - | 6.70 | - | +0.00% | n/a |" in section  # timed by the trainer alone
    assert section.index("| a2 |") < section.index("| a |") and "| b |" not in section
    assert "Host pace" in paths["html"].read_text()
    plain = ValidationReport(runs=runs[4:], models=[], summary=summarize(runs[4:], real_bundles=1), calibration={})
    assert "## Host pace" not in write_reports(plain, tmp_path / "plain")["md"].read_text()


def test_bias_by_parallelism_takes_the_signed_mean_of_the_steady_runs(tmp_path: Path) -> None:
    """Steady runs (step spread under 5 %) give each parallelism type's signed mean error and how many are
    predicted short; unsteady runs only their mean absolute error beside it."""
    import dataclasses

    def run(name: str, kind: str, measured: float, predicted: float, par: str, spread: float) -> RunError:
        return dataclasses.replace(_run(name, kind, measured, predicted, par), measured_spread=spread)

    runs = [run("t1", HELDOUT, 1.0, 0.96, "TP", 0.01), run("t2", HELDOUT, 1.0, 0.98, "TP", 0.02),
            run("t1", REPLAY, 1.0, 0.99, "TP", 0.01), run("t2", REPLAY, 1.0, 0.97, "TP", 0.02),
            run("t3", HELDOUT, 1.0, 1.30, "TP", 0.30), run("s1", HELDOUT, 1.0, 1.01, "single", 0.01)]
    report = ValidationReport(runs=runs, models=[], summary=summarize(runs, real_bundles=4), calibration={})
    md = write_reports(report, tmp_path)["md"].read_text()
    section = md.split("## Bias by parallelism", 1)[1]
    assert "3 steady and 1 unsteady runs held out." in section
    assert "| TP | 2 | -3.00% | 2 of 2 | -2.00% | 1 | 30.00% |" in section
    assert "| single | 1 | +1.00% | 0 of 1 | n/a | 0 | n/a |" in section


def test_depth_series_fit_a_line_per_configuration_and_score_its_slope(tmp_path: Path) -> None:
    """Runs of one configuration at several layer counts make a series: the measured line, how far the
    steps stray from it, the held-out line and its per-layer error; a configuration measured at one
    depth, or a model that is not a preset, makes none."""
    import dataclasses

    from calib.validation.depth import depth_series, depth_summary

    rest = "tp1/pp1/dp1/ep1/vpp1/sp0/mbs2/gbs8/seq2048/bf16/rc-none/og0/op0/do0"

    def at(layers: int, measured: float, predicted: float, run: str = "") -> RunError:
        model = f"llama3-8b@L{layers},S2048"
        return dataclasses.replace(_run(run or f"l{layers}", HELDOUT, measured, predicted), model=model,
                                   config=f"{model}/{rest}")

    # measured 0.1 + 0.075 x L except L8 at +1 %; held-out 0.1 + 0.08 x L
    runs = [at(2, 0.25, 0.26), at(4, 0.40, 0.42), at(4, 0.40, 0.42, run="l4-again"), at(8, 0.707, 0.74),
            at(16, 1.30, 1.38), _run("other", HELDOUT, 1.0, 1.0),
            dataclasses.replace(_run("l4", REPLAY, 0.40, 9.0), model="llama3-8b@L4,S2048",
                                config=f"llama3-8b@L4,S2048/{rest}")]
    [s] = depth_series(runs)
    assert s.series == f"llama3-8b@L*,S2048/{rest}"
    assert [p.layers for p in s.points] == [2, 4, 8, 16] and s.points[1].runs == ["l4", "l4-again"]
    assert s.per_layer_s == pytest.approx(0.075, rel=0.01) and s.fixed_s == pytest.approx(0.1, rel=0.05)
    assert 0.5 < s.linearity_pct < 1.5
    assert s.heldout_per_layer_s == pytest.approx(0.08, rel=1e-6)
    assert s.per_layer_error_pct == pytest.approx(100 * (0.08 - s.per_layer_s) / s.per_layer_s)
    assert s.points[0].compute_share == pytest.approx(0.8)
    assert depth_series([at(4, 0.4, 0.42), _run("other", HELDOUT, 1.0, 1.0)]) == []
    # Without held-out records (--no-heldout) the measured line is still drawn from the other records.
    [m] = depth_series([dataclasses.replace(r, kind=REPLAY, predicted_step_s=9.0) for r in runs[:5]])
    assert (m.per_layer_s, m.linearity_pct) == pytest.approx((s.per_layer_s, s.linearity_pct))
    assert m.heldout_per_layer_s is None and m.per_layer_error_pct is None and m.points[0].heldout_step_s is None
    summary = summarize(runs, real_bundles=6) | depth_summary([s])
    assert summary["depth_series"] == 1 and summary["depth_per_layer_error_max"] == pytest.approx(
        abs(s.per_layer_error_pct))
    assert depth_summary([])["depth_linearity_max"] is None
    report = ValidationReport(runs=runs, models=[], summary=summary, calibration={}, depth=[s.to_dict()])
    paths = write_reports(report, tmp_path)
    md = paths["md"].read_text()
    assert "## Scaled-down models (depth series)" in md and "| 16 | l16 | 1300.00 | 80% | 1380.00 | +6.15% |" in md
    assert "scaled-down models by depth" in paths["html"].read_text()
    assert json.loads(paths["json"].read_text())["depth_series"][0]["points"][3]["layers"] == 16


def _with_other(run: RunError, other_share: float) -> RunError:
    """`run` with a predicted breakdown that leaves `other_share` of its step to the host ("other")."""
    run.breakdown_predicted_s = {"compute": run.predicted_step_s * (1 - other_share),
                                 "other": run.predicted_step_s * other_share}
    return run


def test_the_held_out_runs_predicted_gpu_bound_are_scored_apart() -> None:
    """heldout_gpu_bound_*: the held-out runs whose own prediction leaves at most HOST_BOUND_SHARE of the step to the
    host (the breakdown's "other"); a replay (no "other") and a run without a prediction are not among them, and a
    threshold on them fails the check like any other."""
    from calib.project import HOST_BOUND_SHARE

    runs = [_with_other(_run("a", HELDOUT, 1.0, 1.02), 0.01), _with_other(_run("b", HELDOUT, 1.0, 1.04), HOST_BOUND_SHARE),
            _with_other(_run("c", HELDOUT, 1.0, 0.8), 0.4), _with_other(_run("a", REPLAY, 1.0, 1.3), 0.0),
            _run("d", HELDOUT, 1.0, None)]
    assert runs[0].host_share == pytest.approx(0.01) and runs[4].host_share is None
    assert _run("e", HELDOUT, 1.0, 1.0).host_share is None  # a breakdown without "other"
    s = summarize(runs, real_bundles=4)
    assert s["heldout_count"] == 3 and s["heldout_max"] == pytest.approx(20.0)
    assert s["heldout_gpu_bound_count"] == 2 and s["heldout_gpu_bound_configs"] == 2
    assert s["heldout_gpu_bound_mape"] == pytest.approx(3.0) and s["heldout_gpu_bound_max"] == pytest.approx(4.0)
    assert s["heldout_gpu_bound_share"] == HOST_BOUND_SHARE
    t = Thresholds(limits={"heldout_gpu_bound": {"mean_pct": 3.5, "max_pct": 3.9}})
    assert violations(s, t) == ["heldout_gpu_bound max step-time error 4.00% exceeds the threshold 3.90% (2 runs; )"]
    report = ValidationReport(runs=runs, models=[], summary=s, calibration={})
    assert any(row[0].startswith("held-out, predicted GPU-bound (host share <= 5%)") and row[3] == "2"
               for row in summary_lines(report))
    assert [r.to_dict()["host_share"] for r in runs[:2]] == pytest.approx([0.01, HOST_BOUND_SHARE])


def test_the_replays_of_the_runs_predicted_gpu_bound_are_scored_apart() -> None:
    """replay_gpu_bound_*: the replays of the runs whose held-out prediction is GPU-bound, chosen by that prediction
    and not by the replay's own error; a replay of a host-bound run is not among them, one that could not be replayed
    counts as missing, and a threshold on them fails the check like any other."""
    runs = [_with_other(_run("a", HELDOUT, 1.0, 1.02), 0.01), _with_other(_run("b", HELDOUT, 1.0, 1.04), 0.02),
            _with_other(_run("c", HELDOUT, 1.0, 0.8), 0.4), _run("a", REPLAY, 1.0, 1.01), _run("b", REPLAY, 1.0, None),
            _run("c", REPLAY, 1.0, 1.5)]
    s = summarize(runs, real_bundles=3)
    assert s["replay_count"] == 2 and s["replay_max"] == pytest.approx(50.0)
    assert s["replay_gpu_bound_count"] == 1 and s["replay_gpu_bound_mape"] == pytest.approx(1.0)
    assert s["replay_gpu_bound_missing_runs"] == ["b"]
    t = Thresholds(limits={"replay_gpu_bound": {"mean_pct": 0.5}})
    assert violations(s, t) == [
        "replay_gpu_bound: 1 run(s) have no replay_gpu_bound error (b); the threshold allows 0 (; the reports say why)",
        "replay_gpu_bound mean step-time error 1.00% exceeds the threshold 0.50% (1 runs; )"]
    labels = [row[0] for row in summary_lines(ValidationReport(runs=runs, models=[], summary=s, calibration={}))]
    assert labels[:4] == ["held-out", "held-out, predicted GPU-bound (host share <= 5%)", "replay",
                          "replay, predicted GPU-bound (host share <= 5% held out)"]


def test_thresholds_file_is_valid_and_goals_not_enforced() -> None:
    t = load_thresholds(ROOT / "validation-thresholds.yaml")
    assert set(t.limits) >= {"heldout", "replay"}
    assert t.goals["heldout"] == {"mean_pct": 3.0, "max_pct": 6.0}
    assert t.goals["replay"]["mean_pct"] == 2.0


def test_a_gpu_family_can_have_limits_of_its_own(tmp_path: Path) -> None:
    """`by_gpu` replaces the common limits for that family's bundles only; a bad entry is one clear error."""
    f = tmp_path / "t.yaml"
    f.write_text("schema: calib.validation-thresholds/1\nthresholds:\n  heldout: {mean_pct: 3.5, max_pct: 27.0}\n"
                 "  replay: {mean_pct: 3.2, max_pct: 20.0, missing: 0}\n"
                 "by_gpu:\n  h100: {heldout: {mean_pct: 4.8}, replay: {max_pct: 25.6}}\n")
    t = load_thresholds(f)
    h100 = t.for_family("h100")
    assert h100.limits["heldout"] == {"mean_pct": 4.8, "max_pct": 27.0}
    assert h100.limits["replay"] == {"mean_pct": 3.2, "max_pct": 25.6, "missing": 0.0}
    assert t.for_family("h200") is t and t.for_family(None) is t and t.limits["heldout"]["mean_pct"] == 3.5
    summary = summarize([_run("a", HELDOUT, 1.0, 1.045), _run("a", REPLAY, 1.0, 1.01)], real_bundles=1)
    assert violations(summary, h100) == [] and len(violations(summary, t)) == 1
    f.write_text("schema: calib.validation-thresholds/1\nthresholds:\n  heldout: {mean_pct: 3.5}\n"
                 "by_gpu:\n  h100: {heldout: {mean: 4.8}}\n")
    with pytest.raises(CalibError, match="by_gpu.h100.heldout.mean is not one of"):
        load_thresholds(f)


def test_check_fails_when_a_mean_or_max_exceeds_its_threshold() -> None:
    t = Thresholds(limits={"heldout": {"mean_pct": 3.0, "max_pct": 4.0}, "replay": {"mean_pct": 2.0}})
    ok = summarize([_run("a", HELDOUT, 1.0, 1.02), _run("a", REPLAY, 1.0, 1.01)], real_bundles=1)
    assert violations(ok, t) == []
    bad_max = summarize([_run("a", HELDOUT, 1.0, 1.0), _run("b", HELDOUT, 1.0, 1.05),
                         _run("a", REPLAY, 1.0, 1.01)], real_bundles=2)
    lines = violations(bad_max, t)
    assert len(lines) == 1 and lines[0].startswith("heldout max step-time error 5.00% exceeds the threshold 4.00%")
    no_replay = summarize([_run("a", HELDOUT, 1.0, 1.0)], real_bundles=1)
    assert any("no replay error" in v for v in violations(no_replay, t))
    # a run without a figure fails the check unless the thresholds allow that many missing runs
    one_missing = summarize([_run("a", HELDOUT, 1.0, 1.0), _run("b", HELDOUT, 1.0, None),
                             _run("a", REPLAY, 1.0, 1.0)], real_bundles=2)
    assert violations(one_missing, t) == [
        "heldout: 1 run(s) have no heldout error (b); the threshold allows 0 (; the reports say why)"]
    t.limits["heldout"]["missing"] = 1
    assert violations(one_missing, t) == []
    assert violations(summarize([], real_bundles=0), t) == [
        "no real GPU training bundles to validate (CPU bundles never count)"]


@pytest.mark.parametrize(("text", "msg"), [
    ("schema: other\n", "schema must be"),
    ("schema: calib.validation-thresholds/1\nthresholds: {heldout: {mean_pct: -1}}\n", "positive percentage"),
    ("schema: calib.validation-thresholds/1\nthresholds: {heldout: {avg: 1}}\n", "is not one of mean_pct"),
    ("schema: calib.validation-thresholds/1\nthresholds: {replay: {missing: 1.5}}\n", "must be a count"),
    ("schema: [\n", "not valid YAML"),
])
def test_bad_thresholds_file_is_one_line(tmp_path: Path, text: str, msg: str) -> None:
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(CalibError, match=msg):
        load_thresholds(p)


def test_reports_are_written_with_embedded_plots(tmp_path: Path) -> None:
    runs = [_run("a", HELDOUT, 1.0, 1.02, "TP"), _run("b", HELDOUT, 2.0, 1.9, "TP+DP"),
            _run("a", REPLAY, 1.0, 0.99, "TP"), _run("b", REPLAY, 2.0, None, "TP+DP")]
    runs[-1].note = "bundle has no converted ETs"
    runs[0].measured_spread = 0.2345
    rep = ValidationReport(runs=runs, models=[], summary=summarize(runs, 2), calibration={"path": "c.yaml"},
                           thresholds={"heldout": {"mean_pct": 4.0}}, goals={"heldout": {"mean_pct": 3.0}})
    paths = write_reports(rep, tmp_path / "reports")
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["heldout_mape"] == pytest.approx(3.5) and data["summary"]["replay_count"] == 1
    assert [r["kind"] for r in data["runs"]] == ["heldout", "heldout", "replay", "replay"]
    assert data["runs"][3]["predicted_step_s"] is None and data["runs"][3]["note"]
    page = paths["html"].read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 4  # predicted vs measured, per-run error, by parallelism, breakdown
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    md = paths["md"].read_text()
    assert "| held-out | 3.50% | 5.00% | 2 | 2 |" in md and "goal: mean 3%" in md
    assert "bundle has no converted ETs" in markdown(rep)
    assert "| 1000.00 (10) | 23.45% | 1020.00 |" in md and data["runs"][0]["measured_spread"] == 0.2345
    assert not list((tmp_path / "reports").glob(".*tmp*"))  # no temp files left behind


def test_cpu_bundles_never_count_and_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = cpu_bundle(tmp_path / "traces" / "cpu-run", {0: [1.0, 1.1, 1.0], 1: [1.0, 1.0, 1.0]})
    rep = run_validation([b.parent], out_dir=tmp_path / "out", write_calibration=False)
    assert rep.runs == [] and rep.summary["real_bundles"] == 0
    assert rep.excluded[0]["run"] == "cpu-run" and "never counts" in rep.excluded[0]["why"]
    assert (tmp_path / "out" / "validation.json").is_file()
    # the command refuses, with or without --check, before writing anything: nothing to validate
    for extra in (["--check"], []):
        rc = main(["validate", str(b.parent), "--out", str(tmp_path / "out2"), *extra, "--no-write-calibration"])
        assert rc == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: nothing to validate: no real GPU training bundle")
        assert not (tmp_path / "out2").exists()


def test_missing_bundle_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: ")


def test_replay_of_converted_sample_keeps_measured_kernels(samples: Path) -> None:
    """The shared H200 collectives sample, converted and replayed: every kernel's measured time is
    simulated as is, so each rank's simulated compute busy time equals the sum of its kernels and the
    step cannot be shorter than that."""
    convert = pytest.importorskip("calib.convert")
    sim = pytest.importorskip("calib.sim")
    if not hasattr(sim, "simulate"):
        pytest.skip("calib.sim.simulate has not landed")
    from calib.sim.config import Dim, NetworkConfig, SystemConfig
    from calib.validation.replay import RunTraces, replay_workload

    d = samples / "h200x2-collectives"
    conv = convert.convert_traces({r: d / f"host.{r}.json.gz" for r in (0, 1)},
                                  {r: d / f"device.{r}.json.gz" for r in (0, 1)})
    run = RunTraces(conv.traces, conv.comm_groups)
    wl = replay_workload(run)
    # configured (not calibrated) NVLink-like values: this checks the replay mechanics only
    net = NetworkConfig((Dim("Switch", 2, 300.0, 500.0),))
    res = sim.simulate(wl, net, SystemConfig())
    assert len(res.finish_ns) == 2
    for rank, trace in conv.traces.items():
        kernels_ns = sum(n.duration_ns for n in trace.nodes
                         if n.type == NodeType.COMP_NODE and not n.is_cpu_op)
        assert res.finish_ns[rank] >= kernels_ns
        if res.busy_ns:
            assert sum(v for k, v in res.busy_ns[rank].items() if k not in ("tp", "pp", "dp", "ep", "comm", "cpu")) \
                == pytest.approx(kernels_ns, rel=1e-6)


def test_orchestrator_on_synthetic_bundles(tmp_path: Path) -> None:
    """The whole job on bundles generated from known functions (tests/fitdata.py; never data): every
    run gets a held-out, in-sample and replay entry, the held-out fit excludes the run's own
    configuration, CPU bundles stay out, and the calibration file's validation section is written."""
    from calib.calibration import Calibration
    from calib.fit import fit_calibration
    from tests import fitdata as F

    root = F.write_validation_set(tmp_path / "traces")
    cpu_bundle(root / "cpu", {0: [1.0, 1.0], 1: [1.0, 1.0]})
    cal_path = tmp_path / "cal.yaml"
    fit_calibration(load_bundles_real(root)).save(cal_path)
    rep = run_validation([root], calibration_path=cal_path, out_dir=None, jobs=1)  # reports: tested above
    kinds = sorted((r.run, r.kind) for r in rep.runs)
    assert kinds == [(t, k) for t in ("t1", "t2", "t3") for k in ("heldout", "in-sample", "replay")]
    for r in rep.of_kind(HELDOUT):
        assert r.run not in r.fitted_on and "cpu" not in r.fitted_on and {"k", "c"} <= set(r.fitted_on)
        assert r.predicted_step_s and r.predicted_step_s > 0
    for r in rep.of_kind(REPLAY):  # the synthetic ETs are empty: no replay figure, and it says why
        assert r.error_pct is None and "no GPU work" in r.note
    assert [e["run"] for e in rep.excluded] == ["cpu"]
    assert rep.summary["real_bundles"] == 3 and rep.summary["heldout_count"] == 3
    assert rep.summary["replay_missing_runs"] == ["t1", "t2", "t3"]
    assert any(v.startswith("replay: no replay error could be computed") for v in rep.violations)
    val = Calibration.load(cal_path).validation
    assert val["heldout_mape"] == pytest.approx(rep.summary["heldout_mape"], rel=1e-5)
    assert val["heldout_count"] == 3 and len(val["runs"]) == 9


def load_bundles_real(root: Path) -> list:
    from calib.bundle import load_bundles

    return [b for b in load_bundles([root]) if is_real_gpu(b)]


def test_variable_size_collectives_are_replayed_at_the_largest_size() -> None:
    from calib.validation.replay import even_variable_collectives

    def a2a(nid: int, size: int, pg: str = "5") -> Node:
        return Node(nid, "a2a", NodeType.COMM_COLL_NODE, attrs=[
            Attr("comm_type", int(CommType.ALL_TO_ALL)), Attr("comm_size", size), Attr("pg_name", pg)])

    def ar(nid: int, size: int) -> Node:
        return Node(nid, "ar", NodeType.COMM_COLL_NODE, attrs=[
            Attr("comm_type", int(CommType.ALL_REDUCE)), Attr("comm_size", size), Attr("pg_name", "5")])

    t0 = ExecutionTrace(nodes=[a2a(1, 100), ar(2, 64), a2a(3, 10), ar(4, 8)])
    t1 = ExecutionTrace(nodes=[a2a(7, 300), ar(8, 64), a2a(9, 10), ar(10, 16)])
    assert even_variable_collectives({0: t0, 1: t1}) == 1
    assert [n.attr("comm_size") for n in t0.nodes] == [300, 64, 10, 8]
    assert [n.attr("comm_size") for n in t1.nodes] == [300, 64, 10, 16]  # an all-reduce is never evened


def test_committed_traces_split_by_gpu_family() -> None:
    """Each GPU model is validated against its own calibration, the one with most training runs first."""
    from calib.bundle.io import read_bundle
    from calib.validate import family_groups
    from calib.validation.engine import gpu_family

    groups = family_groups(None)
    assert [fam for fam, _ in groups] == ["h200", "h100"]
    for fam, paths in groups:
        assert {gpu_family(read_bundle(p).manifest.gpu.name) for p in paths} == {fam}


def test_fit_errors_are_labelled_by_how_they_were_obtained():
    """The report's model table says which fit errors are cross-validated, which in-sample, and which
    compare measurements with measurements (network.host_repeat: no model at all)."""
    from types import SimpleNamespace

    from calib.validate import _calibration_model_errors
    from calib.validation.types import IN_SAMPLE, MODEL_FREE

    cal = SimpleNamespace(errors={
        "kernel": {"mape": 3.2, "max": 40.0, "count": 900, "method": "5-fold over distinct shapes"},
        "power.energy_per_step": {"mape": 2.1, "max": 6.0, "count": 70, "method": "in-sample (one configuration)"},
        "network.host_repeat": {"mape": 6.7, "max": 62.0, "count": 110,
                                "method": "no model: a microbenchmark harness run again on another host"},
        "memory.peak": {"mape": 1.0, "max": 3.0, "count": 9, "method": "no fitted parameter: estimate against peak"},
    })
    kinds = {m.model: m.kind for m in _calibration_model_errors(cal)}
    assert kinds == {"kernel": "cross-validated", "power.energy_per_step": IN_SAMPLE,
                     "network.host_repeat": MODEL_FREE, "memory.peak": MODEL_FREE}
