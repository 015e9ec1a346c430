"""benchmarks/tp_rendezvous.py: the TP collectives it counts and the constant it tries, on committed bundles."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, load_benchmark

H200 = ROOT / "traces" / "h200"


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


def test_probe_rows_read_the_committed_probe(bench) -> None:
    rows = {(r["name"], r["rank"]): r for r in bench.probe_rows()}
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
    rows = {r["name"]: r for r in bench.host_lag_rows(bench.PROBE.parent / "tp-rendezvous-2")}
    assert set(rows) == {"llama8b-tp2", "gpt13b-tp2"}
    for r in rows.values():
        assert r["steps"] == 15
        # The ranks start together and one host falls behind on the way through the first forward.
        assert r["start_skew_us"] < 500 < 1000 < r["lag_us"] < 5000
        assert 0 < r["lag_share"] < 0.5 and min(r["reach_us"]) > 5000
    # The first probe run kept no host times: nothing to line up.
    assert bench.host_lag_rows(bench.PROBE) == []
