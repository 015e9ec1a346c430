"""The host-pace probe (measure.probes.host_pace) and its reader (benchmarks/host_pace_probe.py)."""

from __future__ import annotations

import json
import lzma
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
            sampled = {r["name"] for r in results if bench.sampled(r)}
            if sampled:
                assert len(bench.sidecar_table(results)) == 1 + len(sampled)
                assert len(bench.sidecar_cost(results)) == 1 + len(sampled & {r["name"] for r in results
                                                                               if not bench.sampled(r)})
    # the second process's samples are committed thinned to their per-step means (the reader's --thin)
    assert any(bench.sampled(r) for d in PROBE_ROUNDS for f in d.glob("*.json.xz") for r in bench.load(f)["results"])


def test_thinning_keeps_what_the_tables_read(tmp_path):
    """A file with the second process's samples tabulates the same once thinned to their per-step means."""
    bench = load_benchmark("host_pace_probe")
    step_start = [10**9, 2 * 10**9, 3 * 10**9]
    results = [{"name": "cfg", "blocks": [{"policy": "free", "step_s": [0.1, 0.2, 0.3], "step_start_ns": step_start}],
                "sidecar": [[10**9 + 5, 1500.0], [10**9 + 7, 2500.0], [2 * 10**9 + 1, 4000.0], [9 * 10**9, 1.0]]}]
    before = bench.sidecar_table(results)
    f = tmp_path / "sidecar.json.xz"
    f.write_bytes(lzma.compress(json.dumps({"results": results}).encode()))
    bench.thin(f)
    thinned = bench.load(f)["results"]
    assert "sidecar" not in thinned[0] and thinned[0]["blocks"][0]["sidecar_step_ms"] == [2.0, 4.0, None]
    assert bench.sidecar_table(thinned) == before
