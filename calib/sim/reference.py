"""ASTRA-sim reference cases (a folder per case with ASTRA-sim's own per-rank answer) and how far
the embedded simulator is from them. Used by the agreement test and benchmarks/sim_agreement.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calib.errors import CalibError
from calib.sim.analytical import simulate_analytical
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.inputs import read_workload


@dataclass
class CaseAgreement:
    name: str
    ranks: int
    expected_max_ns: int
    got_max_ns: int
    max_finish_err: float  # max over ranks of |got - expected| / expected (finish time)
    max_exposed_err: float  # the same for exposed communication (relative to the finish time)
    exact: bool  # every rank's finish and exposed time equal to the nanosecond
    wall_s: float


def case_dirs(root: str | Path) -> list[Path]:
    return sorted(p for p in Path(root).iterdir() if (p / "expected.json").is_file())


def run_case(case: str | Path) -> CaseAgreement:
    d = Path(case)
    try:
        expected = json.loads((d / "expected.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibError(f"reference case {d}: {exc}") from None
    network = NetworkConfig.from_yaml(d / "network.yml")
    system = SystemConfig.from_json(d / "system.json")
    groups = d / "comm_groups.json"
    workload = read_workload(d / "wl", network.npus, groups if groups.exists() else None)
    res = simulate_analytical(workload, network, system)
    fin, exp = expected["finish_ns"], expected["exposed_comm_ns"]
    ferr = max(abs(a - b) / max(b, 1) for a, b in zip(res.finish_ns, fin, strict=True))
    xerr = max(abs(a - b) / max(f, 1) for a, b, f in zip(res.exposed_comm_ns, exp, fin, strict=True))
    return CaseAgreement(
        name=d.name, ranks=len(fin), expected_max_ns=max(fin), got_max_ns=max(res.finish_ns), max_finish_err=ferr,
        max_exposed_err=xerr, exact=res.finish_ns == fin and res.exposed_comm_ns == exp, wall_s=res.wall_s,
    )
