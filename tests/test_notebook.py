"""The calibration walkthrough notebook runs top to bottom on the committed data (nbclient)."""

from __future__ import annotations

import os

import pytest

from calib.bundle import load_bundles
from calib.validation.cache import CACHE_ENV
from calib.validation.measured import is_real_gpu
from tests.conftest import ROOT, TRACES, USER_CACHE_DIR

NOTEBOOK = ROOT / "notebooks" / "calibration_walkthrough.ipynb"


def _traces() -> str:
    return os.environ.get("CALIB_TRACES", str(TRACES))


@pytest.mark.slow
def test_walkthrough_notebook_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    traces = _traces()
    if not os.path.isdir(traces) or not any(
        is_real_gpu(b) for b in load_bundles([traces], kinds=("training",))
    ):
        pytest.skip(f"no real GPU training bundles under {traces}: nothing to walk through")
    # The walkthrough validates every committed run, as `calib validate` does next in .ci/run: its
    # held-out results go to the user's cache (not this test's own), where that command finds them.
    if USER_CACHE_DIR:
        monkeypatch.setenv(CACHE_ENV, USER_CACHE_DIR)
    else:
        monkeypatch.delenv(CACHE_ENV, raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # the validation cell refits once per held-out configuration (89 H200 configurations: 22 minutes
    # on 2 cores with an empty cache, 2026-11-29; the whole suite 40 minutes): a cell may take up
    # to an hour and a half, the CI budget
    client = nbclient.NotebookClient(nb, timeout=5400, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any failure
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # validation plots and the 8,192-GPU sweep
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", "")) for o in outputs)
    assert "held-out" in text and "8192" in text
