"""Shared test fixtures: where the repo, the shared samples and the ASTRA-sim reference cases are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CALIB_SHARED", ROOT.parent / "shared"))
SAMPLES = SHARED / "samples"
ASTRA_CASES = SHARED / "reference" / "astra-sim-cases"
TRACES = ROOT / "traces"
TEST_DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="session")
def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip(f"shared samples not found at {SAMPLES} (set CALIB_SHARED)")
    return SAMPLES


@pytest.fixture(scope="session")
def coll_dir(samples: Path) -> Path:
    """The real 2 x H200 collectives sample (host + Kineto traces of both ranks)."""
    return samples / "h200x2-collectives"


@pytest.fixture(scope="session")
def coll(coll_dir: Path):  # noqa: ANN201 - calib.convert.RunConversion, imported lazily
    """The collectives sample converted once per session, its send/recv linked through the host trace."""
    from calib.convert import convert_traces

    return convert_traces({r: coll_dir / f"host.{r}.json.gz" for r in (0, 1)},
                          {r: coll_dir / f"device.{r}.json.gz" for r in (0, 1)})


@pytest.fixture(scope="session")
def astra_cases() -> Path:
    if not ASTRA_CASES.is_dir():
        pytest.skip(f"ASTRA-sim reference cases not found at {ASTRA_CASES} (set CALIB_SHARED)")
    return ASTRA_CASES
