"""The host-pace probe (measure.probes.host_pace) and its reader (benchmarks/host_pace_probe.py)."""

from __future__ import annotations

import os

import pytest

from measure.probes.host_pace import CONFIGS, context_switches, cpu_times, place, python_pace_us, summary
from tests.conftest import ROOT, load_benchmark

PROBE_ROUNDS = sorted((ROOT / "traces").glob("*/_probes/host-pace-*"))


def test_probe_configurations_are_valid_one_gpu_runs():
    from measure.request import TrainRequest

    for probe in CONFIGS:
        TrainRequest(model=probe.model, par=probe.par()).check(1)
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)


def test_placements_move_every_thread_and_back():
    every = set(os.sched_getaffinity(0))
    cpu = min(every)
    try:
        place("pin2", every, (cpu, cpu))
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        place("free", every, (cpu, cpu))
    assert os.sched_getaffinity(0) == every


def test_counters_only_grow_and_the_python_work_takes_time():
    a, b = cpu_times(), context_switches()
    assert python_pace_us(2_000, tries=1) > 0
    c, d = cpu_times(), context_switches()
    assert set(a) >= {"idle", "steal"} and all(c[k] >= a[k] for k in a)
    assert all(d[k] >= b[k] for k in b) and d["voluntary"] + d["involuntary"] > 0


@pytest.mark.skipif(not PROBE_ROUNDS, reason="no committed host-pace probe")
def test_committed_results_read_and_tabulate():
    """Every committed block has its steps, Python pace and counters; the reader's tables and the probe's
    own summary cover every configuration and placement, and the second process's samples where it ran."""
    bench = load_benchmark("host_pace_probe")
    for d in PROBE_ROUNDS:
        files = sorted(d.glob("*.json.xz"))
        assert files
        for f in files:
            results = bench.load(f)["results"]
            for r in results:
                assert r["blocks"] and {b["policy"] for b in r["blocks"]} <= {"free", "pin2"}
                for b in r["blocks"]:
                    assert len(b["step_s"]) >= 10 and min(b["step_s"]) > 0 and b["python_pace_us"] > 0
            table = bench.placement_table(results)
            assert len(table) == 1 + len({(r["name"], b["policy"]) for r in results for b in r["blocks"]})
            assert len(summary(results).splitlines()) == 1 + sum(len(r["blocks"]) for r in results)
            if any(b.get("pace_after_step_us") for r in results for b in r["blocks"]):
                assert len(bench.per_step_table(results)) == 1 + len({r["name"] for r in results})
            if any(r.get("sidecar") for r in results):
                assert len(bench.sidecar_table(results)) == 1 + len({r["name"] for r in results if r.get("sidecar")})
                assert len(bench.sidecar_cost(results)) == 1 + len({r["name"] for r in results if r.get("sidecar")} &
                                                                    {r["name"] for r in results if not r.get("sidecar")})
