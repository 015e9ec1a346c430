"""The trainer's own pace (measure/own_pace.py) and what the runs measured with it show
(benchmarks/own_pace.py; docs/host.md, "The trainer's own pace, run by run")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calib.bundle.schema import STEP_OPTIONAL_COLUMNS
from tests.conftest import ROOT, load_benchmark


def test_the_timer_gives_the_steps_tables_optional_columns_on_the_cpu_path():
    from measure.own_pace import timer

    got = timer(cuda=False)()
    assert sorted(got) == sorted(STEP_OPTIONAL_COLUMNS)
    assert math.isnan(got["own_launch_s"]) and got["own_work_s"] > 0


def test_the_power_law_is_recovered_and_corrects_exactly_what_it_was_fitted_on():
    bench = load_benchmark("own_pace")
    launch = np.array([6e-6, 8e-6, 10e-6, 12e-6])
    ratio = (launch / 9e-6) ** 0.7
    slope, ref = bench.power_law(launch, ratio)
    assert slope == pytest.approx(0.7) and ref == pytest.approx(9e-6)
    runs = [bench.PacedRun(f"r{i}", "a" if i < 2 else "b", q * 0.1, 0.1, x, 1e-3, None)
            for i, (x, q) in enumerate(zip(launch, ratio, strict=True))]
    assert np.allclose(bench.corrected_errors(runs, [True, True, True, False]), 0.0, atol=1e-9)


@pytest.fixture(scope="module")
def h200_runs():
    bench = load_benchmark("own_pace")
    runs = bench.paced_runs(ROOT / "traces" / "h200")
    if len(runs) < 12:
        pytest.skip("the runs of rounds 30 and 31 are not committed")
    return bench, runs


def test_the_runs_with_the_own_pace_follow_it_more_than_the_sampler(h200_runs):
    """Rounds 30 and 31 (two H200 leases): a run's measured step over its prediction before the run follows
    the launch pace its trainer timed after each step, pooled over both leases, better than the pace the
    second process sampled."""
    bench, runs = h200_runs
    ratio = np.array([x.ratio for x in runs])
    launch = np.array([x.own_launch_s for x in runs])
    sampler = np.array([x.host_work_s for x in runs], dtype=float)
    assert {x.round for x in runs} >= {"x1-round30", "x1-round31"}
    assert bench.r(ratio, launch) > 0.7
    assert bench.r(ratio, launch) > bench.r(ratio, sampler) + 0.1
    # The two leases' launch paces do not overlap: the slow lease's runs were all slower than the fast one's.
    slow = [x.own_launch_s for x in runs if x.round == "x1-round30"]
    fast = [x.own_launch_s for x in runs if x.round == "x1-round31"]
    assert min(slow) > max(fast)


def test_a_pooled_factor_helps_each_run_left_out_and_one_leases_does_not_carry(h200_runs):
    bench, runs = h200_runs
    before = np.abs(100 * (1 / np.array([x.ratio for x in runs]) - 1))
    n = len(runs)
    loo = np.abs(np.concatenate([bench.corrected_errors(runs, [j != i for j in range(n)]) for i in range(n)]))
    assert loo.mean() < before.mean() - 2.0
    one_lease = np.abs(bench.corrected_errors(runs, [x.round == "x1-round30" for x in runs]))
    other = np.abs(100 * (1 / np.array([x.ratio for x in runs if x.round != "x1-round30"]) - 1))
    assert one_lease.mean() > other.mean()
