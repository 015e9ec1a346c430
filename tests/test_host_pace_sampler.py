"""The host-pace sampler beside `calib measure` (measure/telemetry/host_pace.py) and its bundle table."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.bundle.io import check_bundle, read_bundle, write_parquet
from measure.telemetry.host_pace import HostPaceSampler, python_work_us, read_log

TEST_DATA = Path(__file__).parent / "data"


def test_log_lines_become_seconds_on_the_steps_clock() -> None:
    df = read_log("2000000000 1500.0\n2500000000 3000.5\n", t0=1.0)
    assert df["t_s"].tolist() == [1.0, 1.5]
    assert df["work_s"].tolist() == pytest.approx([1.5e-3, 3.0005e-3])


def test_a_line_the_kill_cut_short_is_dropped_not_misread() -> None:
    # "2500000000 30" would read as 30 us where 3000.5 was being written.
    df = read_log("2000000000 1500.0\n2500000000 30", t0=0.0)
    assert len(df) == 1 and df["work_s"].iloc[0] == pytest.approx(1.5e-3)
    assert read_log("", t0=0.0).empty and read_log("garbage\n1 x\n", t0=0.0).empty


def test_sampler_process_records_until_stopped(tmp_path: Path) -> None:
    t0 = time.monotonic()
    sampler = HostPaceSampler(tmp_path / "pace.log", t0, gap_s=0.005, cwd=Path(__file__).parent.parent).start()
    time.sleep(1.5)
    # A loaded CI machine once took longer than that to start the child (0 samples): wait for it,
    # within bounds, rather than fail on the machine's pace.
    deadline = time.monotonic() + 30
    while len(sampler.frame()) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    sampler.stop()
    df = sampler.frame()
    assert len(df) >= 5
    assert df["t_s"].is_monotonic_increasing and (df["t_s"] > 0).all() and (df["t_s"] < time.monotonic() - t0).all()
    assert (df["work_s"] > 0).all()
    assert sampler.rate_hz(len(df)) > 3
    n = len(df)
    time.sleep(0.3)
    assert len(sampler.frame()) == n  # stopped means stopped


def test_the_sampler_child_starts_without_pandas() -> None:
    # Its start is the first samples of the run it times: it must not wait for pandas or pyarrow.
    import subprocess
    import sys

    code = ("import sys, measure.telemetry.host_pace; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'pyarrow', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_work_is_the_probes_work() -> None:
    from measure.probes.host_pace import python_pace_us

    assert python_pace_us is python_work_us and python_work_us(2_000, tries=1) > 0


def test_a_bad_host_pace_table_is_a_bundle_problem(tmp_path: Path) -> None:
    src = TEST_DATA / "cpu-gloo-dp2"
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    assert check_bundle(read_bundle(dst)) == []
    write_parquet(pd.DataFrame({"t_s": [1.0, 2.0], "work_s": [1e-3, float("nan")]}), dst / "host_pace.parquet")
    assert check_bundle(read_bundle(dst)) == ["host_pace.parquet has NaN or non-positive work_s"]
    write_parquet(pd.DataFrame({"t_s": [1.0]}), dst / "host_pace.parquet")
    assert check_bundle(read_bundle(dst)) == ["host_pace.parquet lacks column(s) work_s"]


def test_older_bundles_read_without_a_host_pace_rate() -> None:
    data = json.loads((TEST_DATA / "cpu-gloo-dp2" / "manifest.json").read_text())
    assert "host_pace_hz" not in data["telemetry"]
    assert read_bundle(TEST_DATA / "cpu-gloo-dp2").manifest.telemetry.host_pace_hz == 0.0


def test_measured_host_work_is_the_median_over_the_measured_steps(tmp_path: Path) -> None:
    from calib.bundle.io import steps_span_s
    from calib.validation.measured import measured_host_work_s

    dst = tmp_path / "b"
    shutil.copytree(TEST_DATA / "cpu-gloo-dp2", dst)
    assert measured_host_work_s(read_bundle(dst)) is None  # not sampled
    steps = read_bundle(dst).table("steps")
    lo, hi = steps_span_s(steps[~steps["profiled"].astype(bool)])
    inside = [lo + (hi - lo) * f for f in (0.1, 0.5, 0.9)]
    # Samples before the measured steps (warm-up) and after them (the profiled step) must not count.
    t = [lo - 1.0, *inside, hi + 1.0]
    write_parquet(pd.DataFrame({"t_s": t, "work_s": [9e-3, 1e-3, 2e-3, 4e-3, 9e-3]}), dst / "host_pace.parquet")
    assert measured_host_work_s(read_bundle(dst)) == pytest.approx(2e-3)
    assert measured_host_work_s(read_bundle(dst), min_samples=4) is None


def test_measured_own_launch_is_the_slowest_ranks_median_over_measured_steps(tmp_path: Path) -> None:
    from calib.validation.measured import measured_own_launch_s

    dst = tmp_path / "b"
    shutil.copytree(TEST_DATA / "cpu-gloo-dp2", dst)
    assert measured_own_launch_s(read_bundle(dst)) is None  # a bundle from before the own pace
    steps = read_bundle(dst).table("steps")
    assert sorted(steps["rank"].unique()) == [0, 1]
    # Rank 1's CPU is the slower one; the profiled step's 9 us must not count.
    launch = [9e-6 if p else 1e-6 * (1 + i % 3) * (1.5 if rank else 1.0)
              for i, (p, rank) in enumerate(zip(steps["profiled"].astype(bool), steps["rank"], strict=True))]
    write_parquet(steps.assign(own_launch_s=launch, own_work_s=1e-3), dst / "steps.parquet")
    per_rank = {r: float(np.median([v for v, p, q in zip(launch, steps["profiled"].astype(bool), steps["rank"], strict=True)
                                    if not p and q == r])) for r in (0, 1)}
    b = read_bundle(dst)
    assert check_bundle(b) == []  # optional columns: the schema's readers are unaffected
    assert per_rank[1] > per_rank[0]
    assert measured_own_launch_s(b) == pytest.approx(per_rank[1])
    write_parquet(steps.assign(own_launch_s=float("nan"), own_work_s=1e-3), dst / "steps.parquet")
    assert measured_own_launch_s(read_bundle(dst)) is None  # the CPU path: nothing launched


def test_the_sampler_ends_when_its_launcher_is_killed_outright(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    code = ("import os, sys, time; from pathlib import Path; "
            "from measure.telemetry.host_pace import HostPaceSampler; "
            f"s = HostPaceSampler(Path({str(tmp_path / 'p.log')!r}), time.monotonic(), gap_s=0.005, cwd=Path({str(root)!r})).start(); "
            "print(s.pid, flush=True); time.sleep(0.5); os._exit(0)")  # no stop(): as if SIGKILLed
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to reap it has ended too
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the orphaned sampler kept running")
