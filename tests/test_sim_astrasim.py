"""The ASTRA-sim backend: inputs written, output parsed, failures explained in one line.

The integration test runs the real binary when ASTRA_SIM_BIN names one; the others use a small
stand-in script that prints what ASTRA-sim prints (the parsing and error paths need no simulator)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from calib.chakra.codec import read_et
from calib.errors import CalibError
from calib.sim import simulate
from calib.sim.astrasim import parse_output, run_astrasim, write_inputs
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.inputs import read_workload
from calib.sim.reference import case_dirs
from tests.conftest import ASTRA_CASES


def _case(name):
    d = ASTRA_CASES / name
    net = NetworkConfig.from_yaml(d / "network.yml")
    groups = d / "comm_groups.json"
    return read_workload(d / "wl", net.npus, groups if groups.exists() else None), net, SystemConfig.from_json(d / "system.json"), d


def _script(tmp_path, body: str):
    p = tmp_path / "fake_astra_sim"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_write_inputs(astra_cases, tmp_path):
    wl, net, system, d = _case("cg_tp8_allreduce_sw8x4")
    argv = write_inputs(wl, net, system, tmp_path)
    assert argv[1:] == ["--workload-configuration=workload", "--system-configuration=system.json",
                        "--network-configuration=network.yml", "--remote-memory-configuration=memory.json",
                        "--comm-group-configuration=comm_groups.json", "--logging-folder=log"]
    assert len(list(tmp_path.glob("workload.*.et"))) == 32
    assert read_et(tmp_path / "workload.5.et").nodes == read_et(d / "wl.5.et").nodes
    assert json.loads((tmp_path / "comm_groups.json").read_text()) == json.loads((d / "comm_groups.json").read_text())
    assert SystemConfig.from_json(tmp_path / "system.json") == system
    assert NetworkConfig.from_yaml(tmp_path / "network.yml") == net
    assert json.loads((tmp_path / "memory.json").read_text()) == {"memory-type": "NO_MEMORY_EXPANSION"}
    assert os.access(tmp_path / "run.sh", os.X_OK)


def test_parse_output():
    text = "\n".join(f"[2026-11-22 10:33:42.213] [workload] [info] sys[{r}] finished, {100 + r} cycles, exposed communication {r} cycles." for r in (1, 0))
    assert parse_output(text, 2) == ([100, 101], [0, 1])
    with pytest.raises(CalibError, match="reported 2 of 3 ranks \\(first missing: sys\\[2\\]\\)"):
        parse_output(text, 3)


def test_run_with_stand_in_binary(astra_cases, tmp_path):
    wl, net, system, _ = _case("sendrecv_ring8")
    lines = "".join(f'echo "[x] [workload] [info] sys[{r}] finished, {r * 10} cycles, exposed communication {r} cycles."\n' for r in range(8))
    ok = _script(tmp_path, 'test -f workload.7.et || exit 9\n' + lines)
    res = simulate(wl, net, system, backend="astrasim", astra_sim_bin=ok)
    assert res.backend == "astrasim" and res.finish_ns == [r * 10 for r in range(8)] and res.exposed_comm_ns == list(range(8))


def test_failures_are_one_line(astra_cases, tmp_path, monkeypatch):
    wl, net, system, _ = _case("sendrecv_ring8")
    monkeypatch.delenv("ASTRA_SIM_BIN", raising=False)
    with pytest.raises(CalibError, match="no ASTRA-sim binary: pass --astra-sim-bin PATH or set ASTRA_SIM_BIN"):
        run_astrasim(wl, net, system)
    with pytest.raises(CalibError, match="does not exist or is not executable"):
        run_astrasim(wl, net, system, astra_sim_bin=str(tmp_path / "missing"))
    crash = _script(tmp_path, 'echo "first" >&2\necho "EventQueue::proceed(): assertion failed" >&2\nexit 134\n')
    with pytest.raises(CalibError, match="exited with status 134: EventQueue::proceed\\(\\): assertion failed"):
        run_astrasim(wl, net, system, astra_sim_bin=crash)
    partial = _script(tmp_path, 'echo "sys[0] finished, 5 cycles, exposed communication 5 cycles."\n')
    with pytest.raises(CalibError, match="reported 1 of 8 ranks"):
        run_astrasim(wl, net, system, astra_sim_bin=partial)


@pytest.mark.astrasim
def test_real_astra_sim_agrees_with_reference(astra_cases):
    binary = os.environ.get("ASTRA_SIM_BIN")
    if not binary:
        pytest.skip("ASTRA_SIM_BIN is not set: no ASTRA-sim binary to run (build one outside the repo to enable this test)")
    for d in case_dirs(ASTRA_CASES)[:12]:
        wl, net, system, _ = _case(d.name)
        res = simulate(wl, net, system, backend="astrasim", astra_sim_bin=binary)
        assert res.finish_ns == json.loads((d / "expected.json").read_text())["finish_ns"], d.name
