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
def astra_cases() -> Path:
    if not ASTRA_CASES.is_dir():
        pytest.skip(f"ASTRA-sim reference cases not found at {ASTRA_CASES} (set CALIB_SHARED)")
    return ASTRA_CASES
