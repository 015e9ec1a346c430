"""Telemetry overhead from on/off twins: two bundles of the same spec, one sampled, one not.

overhead_fraction = median step time with telemetry / median step time without - 1, each median
taken over the measured (not profiled) steps of the slowest rank per step. It is written into the
telemetry-on bundle's manifest (telemetry.overhead_fraction) with the twin's id in notes; the step
tables are not touched.

    python -m measure.campaigns.twins ON_BUNDLE OFF_BUNDLE [ON OFF ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from calib.bundle.io import manifest_text, read_bundle
from calib.errors import CalibError
from calib.report import write_text_atomic


def step_median_s(path: Path) -> float:
    b = read_bundle(path)
    steps = b.table("steps")
    measured = steps[~steps["profiled"].astype(bool)]
    if measured.empty:
        raise CalibError(f"bundle {path}: no measured steps")
    return float(measured.groupby("step")["time_s"].max().median())


def overhead_fraction(on: Path, off: Path) -> float:
    a, b = read_bundle(on), read_bundle(off)
    if a.manifest.spec is None or b.manifest.spec is None or a.manifest.spec.key() != b.manifest.spec.key():
        raise CalibError(f"{on} and {off} are not twins: their specs differ")
    if a.manifest.gpu.name != b.manifest.gpu.name:  # same spec on another GPU: a twin of nothing
        raise CalibError(f"{on} and {off} are not twins: they ran on {a.manifest.gpu.name} and {b.manifest.gpu.name}")
    if not a.manifest.telemetry.enabled or b.manifest.telemetry.enabled:
        raise CalibError(f"{on} must have telemetry on and {off} off")
    return step_median_s(on) / step_median_s(off) - 1.0


def link_twins(on: Path, off: Path) -> float:
    frac = overhead_fraction(on, off)
    mf = on / "manifest.json"
    data = json.loads(mf.read_text())
    data["telemetry"]["overhead_fraction"] = frac
    data.setdefault("notes", {})["telemetry_twin"] = {
        "off_bundle": off.name, "method": "median measured step (slowest rank) on / off - 1",
    }
    write_text_atomic(mf, manifest_text(data))
    return frac


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print("usage: python -m measure.campaigns.twins ON OFF [ON OFF ...]", file=sys.stderr)
        return 2
    for on, off in zip(argv[0::2], argv[1::2], strict=True):
        print(f"{on}: telemetry overhead {link_twins(Path(on), Path(off)):+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
