"""The host-pace probe's per-thread view (measure.probes.host_pace --threads), its reader
(benchmarks/host_threads.py), and what the committed probes found (docs/host.md, thirty-seventh session)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

from measure.probes.host_pace import (
    ThreadCounters,
    per_cpu_ticks,
    read_sidecar,
    step_threads,
    this_cpu,
    thread_stats,
)
from tests.conftest import ROOT, load_benchmark

PROBES = sorted((ROOT / "traces").glob("*/_probes/host-threads-*"))


def test_thread_stats_see_this_thread_run_and_deltas_keep_only_threads_that_ran():
    before = thread_stats()
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:
        pass
    after = thread_stats()
    rows = step_threads(before, after)
    mine = [row for row in rows if row[0] == os.getpid()]
    assert mine and mine[0][1] >= 20e6  # 50 ms of spinning: at least 20 ms on a CPU however loaded the machine
    assert mine[0][4] in os.sched_getaffinity(0) and this_cpu() in os.sched_getaffinity(0)
    assert all(row[1] >= 0 and row[2] >= 0 and (row[1] or row[2]) for row in rows)
    assert step_threads(after, after) == []


def test_per_cpu_ticks_cover_every_cpu_and_only_grow():
    a = per_cpu_ticks()
    b = per_cpu_ticks()
    assert len(a) == len(b) == os.cpu_count()
    assert all(b1 >= b0 and s1 >= s0 for (b0, s0), (b1, s1) in zip(a, b, strict=True))


def test_counters_read_or_say_why_not():
    counters = ThreadCounters([os.getpid()])
    try:
        if counters.error:  # no PMU in this VM (CI, the lent machines): a reason, and nothing to read
            assert counters.error.startswith("perf_event_open") and counters.read() == {}
        else:
            first = counters.read()[os.getpid()]
            sum(range(100_000))
            second = counters.read()[os.getpid()]
            assert second["instructions"] > first["instructions"]
    finally:
        counters.close()


def test_sidecar_lines_read_and_a_cut_line_is_dropped():
    text = "100 950.5 3 1800.0 1500.0\n200 960.0 4 1790.5 1490.0\n300 97"
    got = read_sidecar(text, threads=True)
    assert got["sidecar"] == [[100, 950.5], [200, 960.0]]
    assert got["sidecar_cpu"] == [3, 4] and got["sidecar_heap_us"] == [1800.0, 1790.5]
    assert read_sidecar("100 950.5\n200 9", threads=False) == {"sidecar": [[100, 950.5]]}
    assert read_sidecar("100 950.5 3\n", threads=True)["sidecar"] == []  # not the sampler with CPUs


def test_the_sampler_with_cpus_writes_five_fields(tmp_path):
    """The sidecar as the probe starts it: a child of this process, killed after a few samples."""
    log = tmp_path / "sidecar.log"
    code = ("import sys; from pathlib import Path; from measure.probes.host_pace import sample_with_cpu; "
            f"sample_with_cpu(Path({str(log)!r}), 0.01, 2000)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 3):
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    got = read_sidecar(log.read_text(), threads=True)
    assert len(got["sidecar"]) >= 3
    assert all(us > 0 for _, us in got["sidecar"]) and all(us > 0 for us in got["sidecar_heap_us"])
    assert set(got["sidecar_cpu"]) <= os.sched_getaffinity(0)


@pytest.fixture(scope="module")
def blocks():
    if not PROBES:
        pytest.skip("no committed host-threads probe")
    bench = load_benchmark("host_threads")
    return bench, [b for d in PROBES for b in bench.probe_blocks(d)]


def test_committed_probes_tabulate(blocks):
    bench, bs = blocks
    assert {b.gpu for b in bs} == {"h100", "h200"}
    assert len(bench.thread_table(bs)) == 1 + len({(b.machine, b.name, b.policy) for b in bs})
    assert len(bench.block_table(bs)) == 1 + len({(b.gpu, b.name) for b in bs})


def test_thinned_blocks_read_back_as_written(blocks):
    """The committed probes are kept as their blocks (`--thin`): writing and reading them again changes no value,
    NaN (a work a probe's first version did not sample) included."""
    bench, bs = blocks
    assert any(np.isnan(v).any() for b in bs for v in b.sidecar_ms.values())
    back = bench.thick_blocks(bench.thin_blocks(bs))
    for a, b in zip(bs, back, strict=True):
        assert (a.machine, a.name, a.policy) == (b.machine, b.name, b.policy)
        for f in bench.STEP_ARRAYS:
            assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True)
        assert all(np.array_equal(a.sidecar_ms[w], b.sidecar_ms[w], equal_nan=True) for w in a.sidecar_ms)


def test_a_host_paced_step_is_its_launching_threads_time_on_a_cpu(blocks):
    """On both machines: the main and autograd threads' CPU time follows every block's steps, and unpinned
    no thread waits for a CPU nor does the garbage collector take a step's time."""
    bench, bs = blocks
    for b in bs:
        assert bench.r(b.step_ms, b.cpu_ms) > 0.85, (b.machine, b.name, b.policy)
        if b.policy == "free":
            assert b.wait_ms.sum() < 0.005 * b.step_ms.sum(), (b.machine, b.name)
        if not np.isnan(b.gc_ms).all():
            assert b.gc_ms.mean() < 1.0


def test_the_h100_pace_is_shared_and_the_h200_pace_is_each_cpus_own(blocks):
    """On the H100 host the two launching threads, on two CPUs, slow together and a second process's work
    follows the steps; on the H200 hosts neither: each CPU's pace moves on its own."""
    bench, bs = blocks

    def median_r(gpu: str, x: str, y: str) -> float:
        rs = [bench.r(getattr(b, x) if x != "sidecar" else b.sidecar_ms["sidecar"], getattr(b, y))
              for b in bs if b.gpu == gpu and b.policy == "free"]
        return statistics.median(v for v in rs if not np.isnan(v))

    assert median_r("h100", "main_ms", "autograd_ms") > 0.3
    assert median_r("h100", "sidecar", "step_ms") > 0.5
    assert abs(median_r("h200", "main_ms", "autograd_ms")) < 0.2
    assert median_r("h200", "sidecar", "step_ms") < 0.2
