"""`calib sim` as a drop-in for ASTRA-sim's analytical binary."""

from __future__ import annotations

import json
import re
import shutil

from calib.cli import main

LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[workload\] \[info\] sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles\.$")
ARGS = ["--workload-configuration=wl", "--system-configuration=system.json", "--network-configuration=network.yml",
        "--remote-memory-configuration=memory.json"]


def _case(astra_cases, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(astra_cases / name, dst)
    return dst


def test_prints_astra_sim_lines(astra_cases, tmp_path, monkeypatch, capsys):
    case = _case(astra_cases, "cg_tp4_dp8_mixed_sw8x4", tmp_path)
    monkeypatch.chdir(case)
    assert main(["sim", *ARGS, "--comm-group-configuration=comm_groups.json", "--logging-folder=log"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = json.loads((case / "expected.json").read_text())
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed) and len(parsed) == 32
    assert [int(m.group(2)) for m in parsed] == expected["finish_ns"]
    assert [int(m.group(3)) for m in parsed] == expected["exposed_comm_ns"]
    assert (case / "log" / "timeline.json").is_file()


def test_json_output_and_ignored_flags(astra_cases, tmp_path, monkeypatch, capsys):
    case = _case(astra_cases, "sendrecv_ring8", tmp_path)
    monkeypatch.chdir(case)
    assert main(["sim", *ARGS, "--json", "--compute-scale=2"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["finish_ns"] == json.loads((case / "expected.json").read_text())["finish_ns"]
    assert data["backend"] == "analytical" and data["num_ranks"] == 8
    assert "--compute-scale has no effect" in out.err


def test_errors_are_one_line(astra_cases, tmp_path, monkeypatch, capsys):
    case = _case(astra_cases, "sendrecv_ring8", tmp_path)
    monkeypatch.chdir(case)
    (case / "wl.3.et").unlink()
    assert main(["sim", *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: workload: wl.3.et is missing (the network has 8 NPUs; one ET per rank)"]
    (case / "bad.yml").write_text("topology: [Ring, Ring]\nnpus_count: [2, 2]\nbandwidth: [1, 1]\nlatency: [1, 1]\n")
    assert main(["sim", *ARGS[:2], "--network-configuration=bad.yml", ARGS[3]]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["sim", *ARGS, "--backend", "astrasim", "--astra-sim-bin", str(tmp_path / "nope")]) == 2
    assert "does not exist or is not executable" in capsys.readouterr().err
