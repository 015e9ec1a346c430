"""benchmarks/host_pace_steps.py on the committed bundles that carry the host's pace (round 27, one H100; rounds 32
and 33, two H100 leases, from the thirty-eighth session)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import ROOT, load_benchmark

H100 = ROOT / "traces" / "h100"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("host_pace_steps")


@pytest.fixture(scope="module")
def runs(bench):
    return {r.id: r for r in bench.sampled_runs([H100])}


def test_only_sampled_runs_are_read(runs) -> None:
    round37 = ("llama70b-tp4-sp", "llama70b-tp2pp2-sp", "llama8b-tp2dp2-distopt",  # sampled, named without a tag
               "gpt175b-tp4", "llama8b-pp4-rcfull")  # and round 38's
    assert runs and all(rid.endswith(("-r27", "-r27b", "-r27c", "-r32", "-r32b", "-r33", "-r33b")) or rid in round37
                        for rid in runs)
    assert all(rid in runs for rid in round37)
    assert sum(rid.endswith(("-r27", "-r27b", "-r27c")) for rid in runs) == 10
    for r in runs.values():
        assert len(r.steps_s) == 10 and np.isfinite(r.steps_work_s).all() and r.work_s > 0


def test_host_paced_steps_follow_the_pace_and_gpu_paced_ones_do_not(runs) -> None:
    # GPT-3 1.3B at sequence 256 waits for its host; at sequence 2048 and micro-batch 4 its GPU paces it.
    for tag in ("r27", "r27b", "r27c"):
        assert runs[f"gpt1.3b-1gpu-s256-{tag}"].r > 0.6
    control = runs["gpt1.3b-1gpu-mbs4-r27"]
    assert control.spread < 0.02 and abs(control.r) < 0.3


def test_leave_one_run_out_scores_every_run_of_a_configuration(bench, runs) -> None:
    group = [r for r in runs.values() if r.id.startswith("gpt1.3b-1gpu-s256-")]
    rows = bench.leave_one_run_out(group)
    assert [row[0] for row in rows] == [r.id for r in group]
    assert all(math.isfinite(v) for row in rows for v in row[1:])


def test_main_prints_one_line_per_run(bench, runs, capsys) -> None:
    assert bench.main([str(H100)]) == 0
    out = capsys.readouterr().out
    assert all(rid in out for rid in runs)


def test_the_h200_hosts_host_paced_steps_do_not_follow_the_sampled_pace(bench, runs) -> None:
    """Round 28 (one H200): the same plan as round 27, and there GPT-3 1.3B's host-paced steps do not follow the
    sampled pace (docs/host.md, "The H200's host-paced runs with their pace"), though that host sampled slower work."""
    h200 = {r.id: r for r in bench.sampled_runs([ROOT / "traces" / "h200"]) if r.id.endswith(("-r28", "-r28b", "-r28c"))}
    assert len(h200) == 10
    for tag in ("r28", "r28b", "r28c"):
        assert h200[f"gpt1.3b-1gpu-s256-{tag}"].r < 0.4
    assert h200["gpt1.3b-1gpu-mbs4-r28"].spread < 0.02
    assert np.median([r.work_s for r in h200.values()]) > 1.2 * np.median([r.work_s for r in runs.values()])
