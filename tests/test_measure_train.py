"""`calib measure train` on the CPU (gloo) path end to end, failures, and pre-launch validation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.bundle.io import read_bundle
from calib.cli import main
from calib.errors import CalibError
from calib.workload.parallel import ParallelConfig

pytest.importorskip("torch")

from measure.request import TrainRequest  # noqa: E402
from measure.train import measure_training  # noqa: E402


def _req(port: int, **kw: object) -> TrainRequest:
    par = ParallelConfig(dp=2, micro_batch=1, global_batch=4)
    base = dict(model="gpt3-1.3b@L2", par=par, device="cpu", warmup=1, steps=3, profile_steps=1,
                master_port=port, timeout_s=120)
    base.update(kw)
    return TrainRequest(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train") / "cpu-dp2"
    return measure_training(_req(29811, keep_raw=True), out)


def test_cpu_run_writes_a_complete_bundle(cpu_bundle: Path) -> None:
    b = read_bundle(cpu_bundle)
    m = b.manifest
    assert m.status == "complete" and m.kind == "training"
    assert m.spec is not None and m.spec.dp == 2 and m.spec.model == "gpt3-1.3b@L2"
    steps = b.table("steps")
    assert sorted(steps["rank"].unique()) == [0, 1]
    assert len(steps) == 2 * (3 + 1)  # measured + profiled, per rank
    assert steps["profiled"].sum() == 2
    assert (steps["time_s"] > 0).all()
    # start times are on the launcher's clock: after launch, ordered within a rank
    for _, g in steps.groupby("rank"):
        assert g["start_s"].is_monotonic_increasing and g["start_s"].iloc[0] > 0
    assert m.steps.warmup == 1 and m.steps.measured == 3 and m.steps.profiled == [4]
    assert [x.rank for x in m.memory] == [0, 1]
    assert m.software.torch and m.software.python
    assert m.notes["rank0_stages"][-1].endswith("results written")
    assert m.notes["host_cpu"]["logical_cpus"] >= 1 and m.notes["host_cpu"]["model"]
    assert not (cpu_bundle.with_name(cpu_bundle.name + ".partial")).exists()


def test_cpu_run_samples_the_host_pace_across_its_steps(cpu_bundle: Path) -> None:
    b = read_bundle(cpu_bundle)
    pace, steps = b.table("host_pace"), b.table("steps")
    assert list(pace.columns) == ["t_s", "work_s"] and (pace["work_s"] > 0).all()
    # The sampler runs from before the launch to after it: its samples bracket every step, on the steps' clock.
    assert pace["t_s"].min() < steps["start_s"].min()
    assert pace["t_s"].max() > (steps["start_s"] + steps["time_s"]).max()
    m = b.manifest
    assert m.telemetry.host_pace_hz > 1 and m.notes["host_pace"]["samples"] == len(pace)


def test_no_host_pace_leaves_the_table_out(tmp_path: Path) -> None:
    out = measure_training(_req(29823, steps=1, profile_steps=0, host_pace=False), tmp_path / "nopace")
    b = read_bundle(out)
    assert not b.has("host_pace") and b.manifest.telemetry.host_pace_hz == 0 and "host_pace" not in b.manifest.notes


def test_cpu_run_times_its_own_pace_after_each_measured_step(cpu_bundle: Path) -> None:
    """The trainer's own Python work after every measured step, on every rank; no launches on the CPU path,
    and nothing after the profiled step, whose traces must not hold it."""
    b = read_bundle(cpu_bundle)
    steps = b.table("steps")
    assert list(steps.columns) == ["rank", "step", "start_s", "time_s", "profiled", "own_launch_s", "own_work_s"]
    measured, profiled = steps[~steps["profiled"]], steps[steps["profiled"]]
    assert (measured["own_work_s"] > 0).all() and measured["own_launch_s"].isna().all()
    assert profiled[["own_launch_s", "own_work_s"]].isna().all().all()
    assert b.manifest.notes["own_pace"]["where"].startswith("the main thread of every rank")
    # Outside the step's timing: the next step starts after the step before ended and its own pace was timed.
    for _, g in measured.groupby("rank"):
        ends = (g["start_s"] + g["time_s"] + g["own_work_s"]).to_numpy()[:-1]
        assert (g["start_s"].to_numpy()[1:] >= ends).all()


def test_no_own_pace_leaves_the_columns_out(tmp_path: Path) -> None:
    out = measure_training(_req(29827, steps=1, profile_steps=0, own_pace=False), tmp_path / "noown")
    b = read_bundle(out)
    assert list(b.table("steps").columns) == ["rank", "step", "start_s", "time_s", "profiled"]
    assert "own_pace" not in b.manifest.notes


def test_cpu_run_keeps_raw_traces_for_conversion(cpu_bundle: Path) -> None:
    raw = cpu_bundle / "raw"
    for r in (0, 1):
        for kind in ("host", "device"):
            assert (raw / f"{kind}.{r}.json.gz").stat().st_size > 1000
    m = read_bundle(cpu_bundle).manifest
    # The converter needs GPU activity; a CPU profile has none, so the bundle says why it has no ETs.
    et = m.notes.get("et", "")
    assert et.startswith("converted") or "not converted" in et


def test_crashed_rank_leaves_a_failed_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIB_TEST_FAIL_RANK", "1")
    out = measure_training(_req(29821, profile_steps=0), tmp_path / "crash")
    data = json.loads((out / "manifest.json").read_text())
    assert data["status"] == "failed"
    assert data["failure"].startswith("rank 1: RuntimeError: injected failure on rank 1")
    assert "\n" not in data["failure"]
    with pytest.raises(CalibError, match="failed run"):
        read_bundle(out)
    assert (out / "log_tail.txt").is_file()


def test_timeout_leaves_a_failed_bundle(tmp_path: Path) -> None:
    out = measure_training(_req(29831, profile_steps=0, timeout_s=1.0), tmp_path / "slow")
    data = json.loads((out / "manifest.json").read_text())
    assert data["status"] == "failed" and "timed out after 1 s" in data["failure"]
    # torchrun's workers run in sessions of their own; none may outlive the run that timed out.
    assert not _processes_naming(tmp_path)


def _processes_naming(path: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmd:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama3-8b@L4", "--tp", "3"], "TP 3 does not divide the 32 attention heads"),
        (["--model", "llama3-8b@L3", "--pp", "2"], "PP 2 does not divide the 3 layers"),
        (["--model", "llama3-8b@L4", "--ep", "2", "--dp", "2"], "needs a mixture-of-experts model"),
        (["--model", "gpt3-175b@L8"], "more than one GPU holds"),
        (["--model", "llama3-8b@L4", "--tp", "2", "--device", "cpu"], "CPU (gloo) path runs data parallel only"),
        (["--model", "llama3-8b@L4", "--dp", "2", "--gbs", "3"], "not a multiple of micro-batch x DP"),
    ],
)
def test_impossible_configs_fail_before_launch(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    rc = main(["measure", "train", *args, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.startswith("error: ") and err.count("\n") == 1
    assert not out.exists() and not out.with_name("never.partial").exists()


def test_collectives_on_gloo(tmp_path: Path) -> None:
    from measure.collectives import measure_collectives

    out = measure_collectives(tmp_path / "coll", 2, device="cpu", sizes=[1024, 65536], warmup=1, repeats=3,
                              master_port=29841)
    b = read_bundle(out)
    df = b.table("collectives")
    assert set(df["kind"]) == {"all_reduce", "all_gather", "send_recv"}
    assert {u["option"] for u in b.manifest.unsupported} == {"reduce_scatter", "all_to_all"}
    assert (df["time_s"] > 0).all() and (df["repeats"] == 3).all()
    assert (df["time_s"] >= df["transfer_s"]).all()
    ar = df[(df.kind == "all_reduce") & (df.bytes == 65536)].iloc[0]
    # nccl-tests: algbw = bytes / time (GB = 1e9 B); 2 ranks: all-reduce busbw = algbw x 2(n-1)/n = algbw
    assert ar.algbw_gbps == pytest.approx(65536 / ar.time_s / 1e9)
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps)
    assert b.manifest.notes["iters"] == 1 and "around one collective" in b.manifest.notes["timing"]


def test_collective_sizes_per_doubling_are_aligned() -> None:
    """Four sizes per doubling from 256 KiB, each a multiple of 4 KiB (as training messages are: round 39 found
    sizes that are only multiples of 4 bytes up to 1.8x slower); the powers of two stay on the grid."""
    from measure.collectives import default_sizes

    sizes = default_sizes(2**18, 2**30, per_doubling=4, align=4096)
    assert len(sizes) == 49 and sizes[0] == 2**18 and sizes[-1] == 2**30
    assert all(s % 4096 == 0 for s in sizes) and sizes == sorted(set(sizes))
    assert {2**k for k in range(18, 31)} <= set(sizes)
    ratios = np.diff(np.log2(sizes))
    assert np.allclose(ratios, 0.25, atol=0.01)
    assert default_sizes(1024, 2**20, step=4) == [4**k * 1024 for k in range(6)]  # --factor as before
    with pytest.raises(CalibError, match="align >= 1"):
        default_sizes(1024, 2**20, per_doubling=4, align=0)


def test_collectives_timed_back_to_back(tmp_path: Path) -> None:
    from measure.collectives import measure_collectives

    out = measure_collectives(tmp_path / "loop", 2, device="cpu", sizes=[1024], kinds=["all_reduce"], warmup=0,
                              repeats=2, master_port=29843, iters=4)
    b = read_bundle(out)
    assert b.manifest.notes["iters"] == 4 and "4 back-to-back collectives, divided by 4" in b.manifest.notes["timing"]
    assert (b.table("collectives")["time_s"] > 0).all()
    with pytest.raises(CalibError, match="iters >= 1"):
        measure_collectives(tmp_path / "bad", 2, device="cpu", sizes=[1024], iters=0)
    assert b.manifest.notes["timing_method"] == "events-loop"


def test_kernel_timing_needs_cuda_and_a_known_method(tmp_path: Path) -> None:
    from measure.collectives import measure_collectives

    with pytest.raises(CalibError, match="needs --device cuda"):
        measure_collectives(tmp_path / "k", 2, device="cpu", sizes=[1024], timing="kernel")
    with pytest.raises(CalibError, match="needs --device cuda"):
        measure_collectives(tmp_path / "k", 2, device="cpu", sizes=[1024], timing="kernel-isolated")
    with pytest.raises(CalibError, match="needs --device cuda"):
        measure_collectives(tmp_path / "k", 2, device="cpu", sizes=[1024], timing="kernel-released", late_us=200)
    with pytest.raises(CalibError, match="one of events, kernel, kernel-isolated, kernel-released, not 'wall'"):
        measure_collectives(tmp_path / "k", 2, device="cpu", sizes=[1024], timing="wall")
    # a late member only where calls are released together, and never a negative or NaN delay
    for timing, late in (("kernel", 200.0), ("events", 5.0), ("kernel-released", -1.0),
                         ("kernel-released", float("nan"))):
        with pytest.raises(CalibError, match="--late-us"):
            measure_collectives(tmp_path / "k", 2, device="cuda", sizes=[1024], timing=timing, late_us=late)
    for timing, member in (("kernel", 0), ("kernel-released", 2), ("kernel-released", -2)):
        with pytest.raises(CalibError, match="--late-member"):
            measure_collectives(tmp_path / "k", 2, device="cuda", sizes=[1024], group_sizes=(2,), timing=timing,
                                late_member=member)
    assert not (tmp_path / "k").exists()


def test_calib_fit_refuses_released_bundles_until_it_reads_them() -> None:
    """measure.collectives.RELEASED is a timing calib fit does not know: its bundles are refused, not fitted as
    back-to-back kernel times (calib.fit.timed_by_events)."""
    from calib.bundle.schema import EVENT_TIMING_METHODS, KERNEL_TIMING_METHODS
    from measure.collectives import RELEASED, TIMINGS

    assert RELEASED in TIMINGS and RELEASED not in KERNEL_TIMING_METHODS + EVENT_TIMING_METHODS


def test_an_isolated_call_is_split_as_a_training_step_splits_it() -> None:
    """Per call: the longest and shortest member's kernels, and the training steps' transfer (each member's end
    less the last member's start, averaged), whatever the members' trace bases."""
    from measure.collectives import call_times

    # two members x two calls x (trace base us, start us, duration us); member 1's trace counts from 10 us later
    calls = [[[0.0, 100.0, 30.0], [0.0, 500.0, 20.0]],
             [[10.0, 100.0, 25.0], [10.0, 480.0, 40.0]]]
    slow, fast, transfer = call_times(calls)
    assert slow == pytest.approx([30e-6, 40e-6]) and fast == pytest.approx([25e-6, 20e-6])
    # call 1: member 1 starts last (110 us): ends 130 and 135 -> 20 and 25 us; call 2: member 0 last (500 us):
    # ends 520 and 530 -> 20 and 30 us
    assert transfer == pytest.approx([22.5e-6, 25e-6])


def test_cpu_bundle_in_tests_data_is_readable() -> None:
    from tests.conftest import TEST_DATA

    path = TEST_DATA / "cpu-gloo-dp2"
    if not path.is_dir():
        pytest.skip("no CPU bundle committed")
    b = read_bundle(path)
    assert b.manifest.gpu.vendor == "cpu" and isinstance(b.table("steps"), pd.DataFrame)
    assert os.path.commonpath([path, TEST_DATA]) == str(TEST_DATA)


def test_oom_is_named_in_the_reason() -> None:
    from measure.worker import is_oom, one_line

    class OutOfMemoryError(RuntimeError):
        pass

    exc = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\n(GPU 0; 139.8 GiB total)")
    assert is_oom(exc) and not is_oom(ValueError("bad shape"))
    assert one_line(exc) == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.8 GiB total)"


def test_host_cpu_reads_the_model_name(tmp_path) -> None:
    from measure.env import host_cpu

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    assert host_cpu(str(info))["model"] == "Intel(R) Xeon(R) Processor"
    assert host_cpu(str(tmp_path / "absent"))["model"]  # no /proc: the platform's name, else "unknown"


def test_flash_attention_run_records_causal_sdpa(tmp_path: Path) -> None:
    """`--attention flash` on the CPU path runs torch's fused SDPA; the host trace's recorded inputs give
    the converter its is_causal (calib.ops.causal_of), which halves the attention's FLOPs."""
    import gzip

    from calib.ops import ATTENTION_OPS, causal_of, classify

    par = ParallelConfig(dp=2, micro_batch=1, global_batch=4, attention="flash")
    out = measure_training(_req(29851, par=par, keep_raw=True), tmp_path / "cpu-flash")
    m = read_bundle(out).manifest
    assert m.status == "complete" and m.spec.attention == "flash"
    assert m.spec.key().endswith("/attn-flash") and ParallelConfig().attention == "local"
    host = json.loads(gzip.decompress((out / "raw" / "host.0.json.gz").read_bytes()))
    sdpa = [n for n in host["nodes"] if n["name"] in ATTENTION_OPS]
    assert {n["name"] for n in sdpa} >= {"aten::_scaled_dot_product_flash_attention_for_cpu",
                                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
    for n in sdpa:
        i = n["inputs"]
        assert causal_of(n["name"], i["values"]) is True, n["name"]
        causal = classify(n["name"], i["shapes"], i["types"], causal=True)
        full = classify(n["name"], i["shapes"], i["types"], causal=False)
        assert causal.op_class == "attention" and causal.flops == full.flops / 2 > 0


def test_the_all_to_all_probe_separates_harness_and_training_splits() -> None:
    """measure.probes.a2a_context on 4 x H200 (traces/README.md, round 42): at 8-9.5 MiB the training steps' split
    makes an all-to-all 11-21 % longer than the harness's fastest member, in every context, and back-to-back calls
    of 32 MiB in groups of 4 take longer than calls alone on an idle GPU by either convention."""
    from tests.conftest import TRACES, load_benchmark

    df = load_benchmark("a2a_context").table(TRACES / "h200" / "_probes" / "a2a-context-1" / "a2a_context.json.xz")
    small = df[df["MiB"] <= 9.5]
    assert len(small) == 20 and (small["training_us"] > 1.02 * small["harness_us"]).all()
    at32 = df[(df["group"] == 4) & (df["MiB"] == 32.0)].set_index("context")
    for col in ("harness_us", "training_us"):
        assert at32.loc["harness", col] > 1.05 * at32.loc["isolated", col]


def test_a_late_member_shortens_an_all_to_alls_split() -> None:
    """measure.probes.a2a_stagger on 4 x H200 (traces/README.md, round 43): members released together on the GPU
    arrive within a few us at no delay; from 200 us apart, one late member or a ramp, the training steps' split of
    an all-to-all of 16-64 MiB is 5-14 % shorter than together, in groups of 2 and 4. The committed EP 4 steps show
    the same: at each size, the calls whose members arrived apart have a shorter split than those that arrived
    together."""
    from tests.conftest import TRACES, load_benchmark

    stagger = load_benchmark("a2a_stagger")
    df = stagger.table(TRACES / "h200" / "_probes" / "a2a-stagger-2" / "a2a_stagger.json.xz")
    assert len(df) == 4 * 7 + 4 * 7 * 2
    assert (df.loc[df["delay_us"] == 0, "spread_us"] < 5).all()
    late = df[(df["delay_us"] >= 200) & (df["MiB"] >= 16)]
    assert len(late) == 3 * 3 + 3 * 3 * 2
    assert late["split/no delay"].between(0.85, 0.96).all()
    assert (late["spread_us"] > 0.9 * late["delay_us"]).all()
    other_host = stagger.table(TRACES / "h200" / "_probes" / "a2a-stagger-3" / "a2a_stagger.json.xz")  # 2 x H200
    late2 = other_host[(other_host["delay_us"] >= 200) & (other_host["MiB"] >= 16)]
    assert len(late2) == 3 * 3 and late2["split/no delay"].between(0.85, 0.96).all()
    training = stagger.training(TRACES / "h200")
    training["apart"] = training["spread_us"] > 20
    medians = training.assign(MiB=training["MiB"].round(1)).groupby(["MiB", "apart"])["split_us"].median().unstack()
    assert len(medians) >= 2 and (medians[True] < 0.95 * medians[False]).all()


def test_stagger_delays_follow_their_pattern() -> None:
    from measure.probes.a2a_stagger import delay_of

    assert [delay_of("one_late", r, 4, 100.0) for r in range(4)] == [0.0, 0.0, 0.0, 100.0]
    assert [delay_of("ramp", r, 4, 90.0) for r in range(4)] == [0.0, 30.0, 60.0, 90.0]
    with pytest.raises(ValueError, match="unknown pattern"):
        delay_of("shuffle", 0, 4, 1.0)


def test_released_collectives_show_work_before_the_last_member_arrives() -> None:
    """Round 44 (2 x H200, `--timing kernel-released`, traces/README.md): with the last member 200 us late, an
    all-to-all's split is 5-13 % shorter at 4-64 MiB; a send whose receiver is late has moved most of its data by
    then (the split 25-36 % of together's up to 64 MiB, and at 256 MiB-1 GiB 166-202 us saved, about the delay),
    whose sender is late nothing; an all-reduce is shortened at most 4.5 %; the collectives' saving is all there at
    50 us late and no larger at 1,000; no member saves more than it waited; members together repeat across the two
    leases within 2.1 %."""
    from tests.conftest import TRACES, load_benchmark

    bench = load_benchmark("released_collectives")
    paths = [TRACES / "h200" / "_campaigns" / "x2-round44" / "released.tar.xz"]
    every = bench.table(paths)
    assert set(every["group_size"]) == {2} and (every["saved_us"] < every["late_us"] * 1.05).all()
    df = every[(every["late_us"] == 200) & (every["late_member"] == -1)]
    assert len(df) == 5 * 11 and set(df["together_bundle"]) == {"collectives-2gpu-released-0"}
    mib, kind = df["bytes"] / 2**20, df["kind"]
    assert df.loc[(kind == "all_to_all") & mib.between(4, 64), "late/together"].between(0.85, 0.95).all()
    assert df.loc[(kind == "send_recv") & (mib <= 64), "late/together"].between(0.2, 0.4).all()
    assert df.loc[(kind == "send_recv") & (mib >= 256), "saved_us"].between(150, 210).all()
    assert (df.loc[kind == "all_reduce", "late/together"] > 0.95).all()
    sender = every[every["late_member"] == 0]
    assert set(sender["kind"]) == {"send_recv"} and len(sender) == 11 and (sender["late/together"] >= 1.0).all()
    by_delay = every[(every["kind"] != "send_recv") & (every["late_member"] == -1)].pivot_table(
        index=["kind", "bytes"], columns="late_us", values="late/together")
    assert ((by_delay[50.0] - by_delay[200.0]).abs() < 0.04).all()
    assert ((by_delay[1000.0] - by_delay[200.0]).abs() < 0.04).all()
    rep = bench.repeat(paths).dropna()
    assert len(rep) == 55 and rep["repeat_pct"].max() < 2.5


def test_training_calls_whose_members_arrived_apart_run_as_the_late_harness() -> None:
    """Round 44 against the H200 training steps' 2-GPU calls (traces/README.md): all-to-alls whose members arrived
    more than 50 us apart are closer to the harness with a member late, those that arrived together to the harness
    with the members together; the one send whose receiver arrived last is the late-receiver harness's, not the
    together one's; sends whose sender arrived last run about 1.4x the harness's either way."""
    from tests.conftest import TRACES, load_benchmark

    bench = load_benchmark("released_collectives")
    t = bench.against_training([TRACES / "h200" / "_campaigns" / "x2-round44" / "released.tar.xz"])
    t = t.set_index(["kind", "arrival"])
    a2a_apart, a2a_together = t.loc[("alltoall", "apart")], t.loc[("alltoall", "together")]
    assert a2a_apart["calls"] >= 100 and a2a_together["calls"] >= 10
    assert a2a_apart["err_late_pct"] < a2a_apart["err_together_pct"] - 1
    assert a2a_together["err_together_pct"] < a2a_together["err_late_pct"] - 1
    receiver_last = t.loc[("sendrecv (receiver last)", "apart")]
    assert receiver_last["err_late_pct"] < 10 < receiver_last["err_together_pct"]
    assert t.loc[("sendrecv (sender last)", "apart"), "median_vs_together"] > 1.3


def test_a_send_batched_with_a_receive_is_slower_than_one_way() -> None:
    """measure.probes.p2p_batched on 2 x H200 (traces/README.md, round 44): a send batched with a receive of the other
    direction (megatron-core's steady 1F1B) takes 1.18-1.29x a one-way send with the ranks together at 4-128 MiB; a
    late sender saves nothing one way."""
    from tests.conftest import TRACES, load_benchmark

    df = load_benchmark("p2p_batched").table(TRACES / "h200" / "_probes" / "p2p-batched-1" / "p2p_batched.json.xz")
    assert len(df) == 5 * 2 * 2
    together = df[df["delay_us"] == 0]
    assert (together["spread_us"] < 5).all()
    assert together.loc[together["mode"] == "both_ways", "vs_one_way"].between(1.15, 1.35).all()
    one = df[df["mode"] == "one_way"].pivot_table(index="MiB", columns="delay_us", values="split_us")
    assert (one[200.0] / one[0.0]).between(0.99, 1.1).all()
