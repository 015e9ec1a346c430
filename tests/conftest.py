"""Shared test fixtures: where the repo, the shared samples and the ASTRA-sim reference cases are."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from calib.validation.cache import CACHE_ENV

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CALIB_SHARED", ROOT.parent / "shared"))
SAMPLES = SHARED / "samples"
ASTRA_CASES = SHARED / "reference" / "astra-sim-cases"
TRACES = ROOT / "traces"
TEST_DATA = ROOT / "tests" / "data"


def load_benchmark(script: str) -> ModuleType:
    """benchmarks/<script>.py as a module (benchmarks/ is not a package), registered in sys.modules under
    `<script>_bench`, where dataclasses defined in it look their module up."""
    spec = importlib.util.spec_from_file_location(f"{script}_bench", ROOT / "benchmarks" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


# The held-out cache of whoever runs the tests, read before any test points it elsewhere.
USER_CACHE_DIR = os.environ.get(CACHE_ENV)


@pytest.fixture(autouse=True)
def _own_heldout_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test validates with an empty held-out cache of its own (calib.validation.cache), so what it
    asserts on is computed, not read back from an earlier run."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("heldout-cache")))


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
