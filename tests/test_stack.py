"""The software stack of a calibration's bundles (calib.stack): recorded by `calib fit`, kept by the
calibration file, printed by `calib project` and `calib validate`; and `calib project --seq`."""

from __future__ import annotations

import json

import pytest

from calib.bundle import load_bundles
from calib.calibration import Calibration
from calib.cli import main
from calib.project import default_calibration_path
from calib.stack import measured_stack, stack_summary
from tests.conftest import TRACES


def test_stack_of_the_committed_h100_bundles() -> None:
    bundles = load_bundles([TRACES / "h100"])
    stack = measured_stack(bundles)
    assert stack["bundles"] == len(bundles)
    for key in ("torch", "cuda", "nccl", "megatron_core", "driver"):
        seen = stack["versions"][key]
        assert sum(seen.values()) <= len(bundles) and all(n > 0 for n in seen.values())
    torch_version = bundles[0].manifest.software.torch
    assert stack["versions"]["torch"][torch_version] >= 1
    training = [b for b in bundles if b.manifest.kind == "training"]
    assert sum(stack["torch_compile"].values()) == len(training) and "Transformer Engine" in stack["layers"]
    line = stack_summary(stack)
    assert f"torch {torch_version}" in line and "no Transformer Engine" in line and "torch.compile" in line


def test_summary_counts_differing_versions_and_says_when_nothing_is_recorded() -> None:
    mixed = {"versions": {"torch": {"2.11.0": 3, "2.10.0": 1}}}
    assert stack_summary(mixed) == "torch 2.11.0 (3) / 2.10.0 (1)"
    assert stack_summary({}).startswith("not recorded") and "calib fit" in stack_summary(None)


def test_calibration_keeps_the_section(tmp_path) -> None:
    stack = measured_stack(load_bundles([TRACES / "h100"]))
    cal = Calibration(gpu="NVIDIA H100", software=stack)
    path = cal.save(tmp_path / "cal.yaml")
    assert Calibration.load(path).software == stack
    path.write_text(path.read_text().replace("software:\n", "software: 3\nx:\n", 1))
    from calib.errors import CalibError

    with pytest.raises(CalibError, match="section software must be a mapping"):
        Calibration.load(path)


def test_project_prints_the_stack_and_takes_a_sequence_length(capsys) -> None:
    if not default_calibration_path("H200").is_file():
        pytest.skip("no bundled H200 calibration")
    base = ["project", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--gbs", "8", "--cluster", "dgx-h200"]
    assert main([*base, "--json"]) == 0
    native = json.loads(capsys.readouterr().out)
    assert main([*base, "--seq", "2048", "--json"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert native["inputs"]["model"]["seq_length"] == 8192 and short["inputs"]["model"]["seq_length"] == 2048
    assert short["inputs"]["model"]["name"] == "llama3-8b@L32,S2048"
    assert short["step_time_s"] < native["step_time_s"] and short["memory_gib_per_gpu"] < native["memory_gib_per_gpu"]
    assert short["inputs"]["calibration_software"] == Calibration.load(default_calibration_path("H200")).software
    assert main([*base, "--seq", "2048"]) == 0
    assert "measured on:" in capsys.readouterr().out
    assert main([*base, "--seq", "-4"]) == 2
    err = capsys.readouterr().err
    assert "--seq must be a positive sequence length" in err and err.count("\n") == 1
