"""benchmarks/tp_rendezvous.py: the TP collectives it counts and the constant it tries, on committed bundles."""

from __future__ import annotations

import json
import lzma

import pytest

from tests.conftest import ROOT, load_benchmark

H200 = ROOT / "traces" / "h200"
# The probe rounds are committed as their summaries (benchmarks/tp_rendezvous.py --summary-out), written from their
# per-rank results, which are not kept for room since the forty-fourth session.
PROBES = ROOT / "traces" / "h100" / "_probes"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("tp_rendezvous")


def test_counts_the_blocking_collectives_of_the_tp_group(bench) -> None:
    # Llama-3 8B@L4 at TP 2: per layer two all-reduces forward and two backward, in the profiled step.
    n = bench.tp_collectives(H200 / "llama8b-tp2", 2)
    assert n > 100 and n == bench.tp_collectives(H200 / "llama8b-tp2-r21", 2)
    assert bench.tp_collectives(H200 / "gpt1.3b-1gpu-mbs4", 1) == 0
    assert bench.tp_collectives(H200 / "llama8b-pp2-mbs2", 1) == 0


def test_the_constant_comes_from_other_configurations_only(bench, tmp_path) -> None:
    def run(name: str, config: str, tp: int, measured: float, predicted: float) -> dict:
        return {"run": name, "config": config, "tp": tp, "kind": "replay", "measured_spread": 0.01,
                "measured_step_s": measured, "predicted_step_s": predicted,
                "error_pct": 100 * (predicted - measured) / measured}

    runs = [run("llama8b-tp2", "a", 2, 0.275, 0.265), run("llama8b-tp2-r21", "a", 2, 0.275, 0.265),
            run("gpt13b-tp2", "b", 2, 0.283, 0.280), run("gpt1.3b-1gpu-mbs4", "c", 1, 0.470, 0.478)]
    report = tmp_path / "validation.json"
    report.write_text(json.dumps({"runs": runs}))
    df = bench.runs_of(report, H200, "replay")
    new = bench.with_constant(df)
    n = dict(zip(df["run"], df["n"], strict=True))
    # Configuration a gets b's shortfall per collective, b gets a's; the one-GPU run is left as it was.
    k_b = (0.283 - 0.280) / n["gpt13b-tp2"]
    assert new[0] == pytest.approx(0.265 + k_b * n["llama8b-tp2"])
    k_a = 0.010 / n["llama8b-tp2"]
    assert new[2] == pytest.approx(0.280 + k_a * n["gpt13b-tp2"])
    assert new[3] == 0.478
    s = bench.summary(df)
    assert s["tp_runs"] == 3 and s["mape_with"] < s["mape"]


def test_the_rounds_are_committed_as_their_summaries(bench) -> None:
    for n in (1, 2, 3):
        folder = PROBES / f"tp-rendezvous-{n}"
        assert (folder / bench.SUMMARY).is_file() and not bench.results(folder), folder.name


def test_probe_rows_read_the_committed_probe(bench) -> None:
    rows = {(r["name"], r["rank"]): r for r in bench.round_rows(bench.PROBE, "probe")}
    assert set(rows) == {("llama8b-tp2", 0), ("llama8b-tp2", 1), ("gpt13b-tp2", 0), ("gpt13b-tp2", 1)}
    for r in rows.values():
        assert r["calls"] == 72 and r["bytes"] in (16 * 2**20, 20 * 2**20)
        # Past the first micro-batch's forward, a call costs its transfer and a little more, never less.
        assert r["transfer_us"] < r["rest_us"] < r["transfer_us"] + 30
        assert r["beyond_ms"] > 0 and 0 < r["head_share"] <= 1
    # Llama-3 8B's rank 0 waits at the step's first all-reduces for most of what the calls cost beyond transfer.
    assert rows[("llama8b-tp2", 0)]["head_share"] > 0.8


def test_probe_summary_prints_one_line_per_rank(bench, capsys) -> None:
    assert bench.main(["--probe"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("llama8b", "gpt13b"))]
    assert len(lines) == 4


def test_host_lag_rows_line_the_ranks_hosts_up(bench) -> None:
    rows = {r["name"]: r for r in bench.round_rows(bench.PROBE.parent / "tp-rendezvous-2", "hosts")}
    assert set(rows) == {"llama8b-tp2", "gpt13b-tp2"}
    for r in rows.values():
        assert r["steps"] == 15
        # The ranks start together and one host falls behind on the way through the first forward.
        assert r["start_skew_us"] < 500 < 1000 < r["lag_us"] < 5000
        assert 0 < r["lag_share"] < 0.5 and min(r["reach_us"]) > 5000
    # The first probe run kept no host times: nothing to line up.
    assert bench.round_rows(bench.PROBE, "hosts") == []


def _write_rank(folder, rank: int, start_ns: int) -> None:
    """A probe result of Llama-3 8B at TP 2 (its committed H100 bundle times the 16 MiB transfer): 3 steps of 20
    all-reduces, the first micro-batch's forward slower on rank 0, one small call the tables leave out."""
    size = 16 * 2**20
    calls = [[[4096, 9.0]] + [[size, (300.0 if i < 9 and rank == 0 else 80.0) + s + i] for i in range(20)]
             for s in range(3)]
    d = {"name": "llama8b-tp2", "rank": rank, "plain_step_s": [0.31, 0.312, 0.311], "events_step_s": [0.313] * 3,
         "calls_bytes_us": calls, "step_start_ns": [start_ns + s * 320_000_000 for s in range(3)],
         "calls_host_ns": [[(1000 + 400 * rank) * 1000 * (i + 1) for i in range(21)] for _ in range(3)]}
    (folder / f"llama8b-tp2.rank{rank}.json.xz").write_bytes(lzma.compress(json.dumps(d).encode()))


def test_a_round_summarised_prints_what_its_results_printed(bench, tmp_path, capsys) -> None:
    raw, kept = tmp_path / "raw", tmp_path / "kept"
    raw.mkdir()
    kept.mkdir()
    for rank in (0, 1):
        _write_rank(raw, rank, 10_000_000 + 50_000 * rank)
    summary = kept / bench.SUMMARY
    assert bench.main(["--hosts", str(raw), "--summary-out", str(summary)]) == 0
    held = json.loads(summary.read_text())
    assert held["probe"] == bench.probe_rows(raw) and held["hosts"] == bench.host_lag_rows(raw)
    assert len(held["probe"]) == 2 and len(held["hosts"]) == 1
    for table in ("probe", "hosts"):
        capsys.readouterr()
        assert bench.main([f"--{table}", str(raw)]) == 0
        from_results = capsys.readouterr().out
        assert bench.main([f"--{table}", str(kept)]) == 0
        assert capsys.readouterr().out == from_results, table
    # What the summary-only folder prints is the summary's: a value changed there shows in the table.
    held["hosts"][0]["lag_share"] = 0.5
    summary.write_text(json.dumps(held))
    assert bench.main(["--hosts", str(kept)]) == 0
    assert "50.0%" in capsys.readouterr().out
    # A folder without results is not summarised again, which would empty its summary.
    assert bench.main(["--probe", str(kept), "--summary-out", str(summary)]) == 1
    assert json.loads(summary.read_text()) == held
