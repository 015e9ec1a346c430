"""A run's host pace from its profiled step (calib.models.profiled_pace), for the runs that did not time their own."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

from calib.bundle.io import read_bundle
from calib.errors import CalibError
from calib.models.host import HostModel, own_pace_factor, run_own_launch, run_paces
from calib.models.profiled_pace import (
    MIN_RUNS,
    PROFILED,
    TIMED,
    ProfiledPace,
    fit_profiled_pace,
    own_launch_of,
)
from calib.validation.measured import measured_own_launch_s, measured_step, profiled_span_per_node_s
from tests.conftest import TRACES

H200 = TRACES / "h200"
H100 = TRACES / "h100"


class _Paced:
    """A prepared run (calib.models.host.prepare_run) as run_paces reads it: half its measured step is host time."""

    def __init__(self, bundle: object) -> None:
        self.measured_s = measured_step(bundle).time_s
        self.key = bundle.manifest.spec.key()  # its configuration, whose runs' exposure it shares

    def step(self, launch_s: float, sync_s: float, p2p_s: float) -> float:
        return self.measured_s * (0.5 if launch_s == sync_s == p2p_s == 0 else 1.0)


def test_the_line_is_least_squares_in_log_log_over_the_timed_runs_only():
    spans = [100e-6 * 1.1**i for i in range(MIN_RUNS)]
    paces = [3e-4 * s**0.5 for s in spans]  # exactly on a line of slope 0.5
    line = fit_profiled_pace([*spans, 5e-4, None], [*paces, None, 9e-6])  # an untimed run and one without ETs
    assert line is not None and line.runs == MIN_RUNS
    assert line.slope == pytest.approx(0.5) and line.r == pytest.approx(1.0)
    assert line.own_launch_s(400e-6) == pytest.approx(3e-4 * 400e-6**0.5)


def test_a_pipelined_run_is_left_out_of_the_line():
    """A timed run with pipeline parallelism, far off the line (its span waits for the other stages), does not bend
    it when `pipelined` says so; without the mask it does."""
    spans = [100e-6 * 1.1**i for i in range(MIN_RUNS)]
    paces = [3e-4 * s**0.5 for s in spans]
    spans_pp, paces_pp = [*spans, 430e-6], [*paces, 3e-4 * 150e-6**0.5]  # a pipeline: long span, an ordinary pace
    line = fit_profiled_pace(spans_pp, paces_pp, pipelined=[False] * MIN_RUNS + [True])
    assert line is not None and line.runs == MIN_RUNS and line.slope == pytest.approx(0.5)
    bent = fit_profiled_pace(spans_pp, paces_pp)
    assert bent is not None and bent.runs == MIN_RUNS + 1 and bent.slope < 0.4


def test_too_few_timed_runs_or_no_slope_leave_the_line_unfitted():
    spans = [100e-6 * 1.1**i for i in range(MIN_RUNS)]
    assert fit_profiled_pace(spans[:-1], [1e-5] * (MIN_RUNS - 1)) is None
    assert fit_profiled_pace(spans, [1e-5 / (1 + i) for i in range(MIN_RUNS)]) is None  # pace falls with the span
    assert fit_profiled_pace([1e-4] * MIN_RUNS, [1e-5 * (1 + i) for i in range(MIN_RUNS)]) is None  # one span


def test_a_timed_pace_wins_and_an_untimed_run_without_a_line_stays_at_the_reference():
    line = ProfiledPace(slope=0.66, log_intercept=-5.75, runs=40, r=0.69)
    assert own_launch_of(8e-6, 1e-4, line) == (8e-6, TIMED)
    pace, source = own_launch_of(None, 1e-4, line)
    assert source == PROFILED and pace == pytest.approx(math.exp(-5.75 + 0.66 * math.log(1e-4)))
    assert own_launch_of(None, 1e-4, None) == (None, None)
    assert own_launch_of(None, None, line) == (None, None)


def test_the_line_round_trips_and_a_bad_one_is_one_clear_error():
    line = ProfiledPace(slope=0.66, log_intercept=-5.75, runs=40, r=0.69)
    assert ProfiledPace.from_dict(line.to_dict()) == line
    host = HostModel(launch_s=40e-6, sync_s=3e-3, own_launch_ref_s=1e-5, profiled_pace=line)
    assert HostModel.from_dict(host.to_dict()).profiled_pace == line
    older = host.to_dict()
    del older["profiled_pace"]  # a file written before the line: untimed runs at the reference, as then
    assert HostModel.from_dict(older).profiled_pace is None
    for bad in ({"slope": -0.2, "log_intercept": -5.0, "runs": 9, "r": 0.1}, {"slope": 0.5}, "fast"):
        with pytest.raises(CalibError, match="profiled_pace"):
            ProfiledPace.from_dict(bad)
    with pytest.raises(CalibError, match="positive"):
        line.own_launch_s(float("nan"))


def test_a_run_is_simulated_at_its_timed_pace_else_its_profiled_one():
    line = ProfiledPace(slope=0.66, log_intercept=-5.75, runs=40, r=0.69)
    host = HostModel(launch_s=40e-6, sync_s=3e-3, own_launch_ref_s=1e-5, profiled_pace=line)
    timed = read_bundle(H200 / "gpt1.3b-1gpu-s256-r31")
    untimed = read_bundle(H200 / "gpt1.3b-1gpu-s256-r28c")
    assert run_own_launch(timed, host) == (measured_own_launch_s(timed), TIMED)
    pace, source = run_own_launch(untimed, host)
    assert source == PROFILED and pace == pytest.approx(line.own_launch_s(profiled_span_per_node_s(untimed)))
    assert run_own_launch(untimed, HostModel(launch_s=40e-6)) == (None, None)
    assert own_pace_factor(pace, host.own_launch_ref_s) > 1  # its profiled step was the slowest of its configuration


def test_a_fit_reads_each_runs_pace_as_run_own_launch_gives_it():
    """run_paces (what fit_host and the host benchmarks read): the timed runs keep their timing, the reference is
    their median, and each untimed run gets what the line fitted over the timed ones gives its profiled step."""
    bundles = _runs(r"(gpt1\.3b|llama8b)-1gpu-s256(-r\d+[a-z]*)?")
    rp = run_paces(bundles, [_Paced(b) for b in bundles])
    timed = [measured_own_launch_s(b) for b in bundles]
    assert rp.timed == timed and sum(t is not None for t in timed) >= 8 and rp.line is not None
    assert rp.reference == pytest.approx(float(np.median([t for t in timed if t is not None])))
    host = HostModel(launch_s=40e-6, own_launch_ref_s=rp.reference, profiled_pace=rp.line)
    assert rp.paces == [run_own_launch(b, host)[0] for b in bundles]
    assert rp.factors() == [own_pace_factor(p, rp.reference) for p in rp.paces]
    assert len(set(rp.factors())) == len(bundles)  # untimed runs no longer share the reference's factor 1


def test_the_line_leaves_out_the_timed_runs_their_host_hardly_paced_and_pipelines():
    """On the H100: the three 4-GPU runs of round 37 and round 38's GPT-3 175B layer at TP 4 are within
    MIN_HOST_EXPOSURE of their steps at no host cost (their kernels and network pace them), and their profiled span
    per node is their long kernels', not their host's; round 38's four-stage pipeline is over it (its p2p syncs wait
    for the host) but its span waits for the other stages too. With them the line loses most of its slope; fitted
    over the runs the host paced without pipeline parallelism, it keeps it."""
    from calib.calibration import Calibration
    from calib.models.host import collector_paused, prepare_run
    from calib.models.profiled_pace import MIN_HOST_EXPOSURE, config_exposures, host_exposure
    from calib.project import default_calibration_path

    cal = Calibration.load(default_calibration_path("H100"))
    bundles = [read_bundle(d) for d in sorted(H100.iterdir()) if (d / "manifest.json").is_file()]
    timed = [b for b in bundles if b.manifest.kind == "training" and b.et_files() and measured_own_launch_s(b)]
    with collector_paused():
        runs = [prepare_run(b, cal.kernel_model(), cal) for b in timed]
    exposure = {b.id: host_exposure(r.measured_s, r.step(0.0, 0.0, 0.0)) for b, r in zip(timed, runs, strict=True)}
    r37 = ("llama70b-tp4-sp", "llama70b-tp2pp2-sp", "llama8b-tp2dp2-distopt", "gpt175b-tp4")
    assert all(exposure[i] < MIN_HOST_EXPOSURE for i in r37)
    # Round 38's pipeline sits at the rule's edge (10.1 % against the calibration before it, 9.9 % against the
    # refitted one); its span is the pipeline's whichever side it falls: twice the longest of the runs the line takes.
    assert abs(exposure["llama8b-pp4-rcfull"] - MIN_HOST_EXPOSURE) < 0.005
    assert all(e >= MIN_HOST_EXPOSURE for i, e in exposure.items() if "s256" in i and "llama8b-1gpu" not in i)
    spans, paces = [profiled_span_per_node_s(b) for b in timed], [measured_own_launch_s(b) for b in timed]
    every = fit_profiled_pace(spans, paces)
    by_config = config_exposures([r.key for r in runs], [r.measured_s for r in runs], [r.step(0.0, 0.0, 0.0) for r in runs])
    pipelined = [b.manifest.spec.pp > 1 for b in timed]
    paced = fit_profiled_pace(spans, paces, by_config, pipelined)
    assert every is not None and every.runs == len(timed)
    assert paced is not None and paced.runs == len(timed) - 5 and paced.slope > 0.3 and paced.r > 0.5
    assert every.slope < 0.6 * paced.slope and every.r < paced.r - 0.2
    taken = [s for s, e, pp in zip(spans, by_config, pipelined, strict=True) if e >= MIN_HOST_EXPOSURE and not pp]
    assert profiled_span_per_node_s(next(b for b in timed if b.id == "llama8b-pp4-rcfull")) > 2 * max(taken)
    assert run_paces(timed, runs).line == paced


def test_a_configuration_is_kept_or_left_out_whole_by_its_median_exposure():
    """Repeats of one configuration share its exposure (median measured step against median step at no host cost),
    so a fast host's repeat, itself barely exposed, stays in the line with its slower repeats."""
    from calib.models.profiled_pace import MIN_HOST_EXPOSURE, config_exposures, host_exposure

    keys = ["a", "a", "a", "b"]
    measured, zero = [0.100, 0.120, 0.130, 0.100], [0.095, 0.096, 0.094, 0.097]
    out = config_exposures(keys, measured, zero)
    assert out[0] == out[1] == out[2] == pytest.approx(host_exposure(0.120, 0.095))
    assert host_exposure(measured[0], zero[0]) < MIN_HOST_EXPOSURE <= out[0]  # the fast repeat alone would be left out
    assert out[3] == pytest.approx(0.03)
    spans = [1e-4 * (1 + i) for i in range(MIN_RUNS)]
    paces = [1e-5 * (1 + i) ** 0.5 for i in range(MIN_RUNS)]
    keys = [f"c{i // 2}" for i in range(MIN_RUNS)]
    steps = [0.2, 0.105, 0.2, 0.21, 0.2, 0.2, 0.1, 0.1]  # c0 exposed as a whole despite its fast repeat; c3 not
    line = fit_profiled_pace(spans, paces, config_exposures(keys, steps, [0.1] * MIN_RUNS))
    assert line is None  # six runs kept, under MIN_RUNS
    line = fit_profiled_pace(spans, paces, [1.0] * MIN_RUNS)
    assert line is not None and line.runs == MIN_RUNS and line.slope == pytest.approx(0.5, rel=0.2)


def test_a_corrupt_profiled_trace_is_one_clear_error(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(H200 / "gpt1.3b-1gpu-s256-r28c", run)
    (run / "et" / "rank.0.et.xz").write_bytes(b"\xfd7zXZ\x00 truncated")
    with pytest.raises(CalibError) as exc:
        profiled_span_per_node_s(read_bundle(run))
    assert "\n" not in str(exc.value)


def _runs(pattern: str) -> list:
    return [read_bundle(d) for d in sorted(H200.iterdir()) if re.fullmatch(pattern, d.name)]


def test_on_the_h200_the_profiled_span_follows_the_timed_pace_and_orders_the_untimed_repeats():
    """Over the committed H200 runs that timed their own pace, log pace against log profiled span per node has
    a positive slope; and among the untimed repeats of the host-paced GPT-3 1.3B configuration at sequence 256,
    the run with the longest profiled span per node is the slowest measured."""
    bundles = [read_bundle(d) for d in sorted(H200.iterdir()) if (d / "manifest.json").is_file()]
    training = [b for b in bundles if b.manifest.kind == "training" and b.et_files()]
    line = fit_profiled_pace([profiled_span_per_node_s(b) for b in training],
                             [measured_own_launch_s(b) for b in training])
    assert line is not None and line.runs >= 36 and line.slope > 0.3 and line.r > 0.5
    untimed = [b for b in _runs(r"gpt1\.3b-1gpu-s256(-r\d+[a-z]*)?") if measured_own_launch_s(b) is None]
    assert len(untimed) == 6
    spans = np.array([profiled_span_per_node_s(b) for b in untimed])
    steps = np.array([measured_step(b).time_s for b in untimed])
    assert np.argmax(spans) == np.argmax(steps)
    assert np.corrcoef(np.log(spans), np.log(steps))[0, 1] > 0.5
