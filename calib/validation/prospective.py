"""Predictions committed before their runs existed, read back for scoring.

A campaign round that predicts its runs (measure/campaigns/predict.py) writes `calib project --json`'s
step time and memory verdict per job to `<gpu folder>/_campaigns/<round>/predictions*.json` and commits
it before the device call. Held-out errors leave one configuration out of data that all existed when
the model was built; these were made with the calibration of their day, before the measurement: the
strictest error calib can show. A prediction is matched to the bundle of the same id in the same GPU
folder only (a twin on another GPU is another GPU's measurement).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calib.errors import CalibError

CAMPAIGNS = "_campaigns"


@dataclass(frozen=True)
class Prediction:
    run: str  # the job id, which is the bundle id
    step_s: float
    memory_verdict: str  # "" where the file has none (round 9's)
    source: str  # "<round>/<file name>"
    calibration: str  # the calibration it was made with, as the file names it


def read_predictions(path: Path) -> list[Prediction]:
    """One predictions file's entries; round 9's nests them under "predictions" with one calibration
    for all. A file that is not JSON is one CalibError."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CalibError(f"{path}: not a readable predictions file ({' '.join(str(exc).split())})") from None
    common = str(data.get("calibration", "")) if isinstance(data, dict) else ""
    inner = data.get("predictions", data) if isinstance(data, dict) else {}
    source = f"{path.parent.name}/{path.name}"
    return [Prediction(run, float(p["step_time_s"]), str(p.get("memory_verdict", "")), source,
                       str(p.get("calibration", common)))
            for run, p in inner.items() if isinstance(p, dict) and "step_time_s" in p]


def prediction_files(folder: Path) -> list[Path]:
    """The predictions files of one GPU folder's campaign rounds, in name order."""
    return sorted(folder.glob(f"{CAMPAIGNS}/*/predictions*.json"))


def committed_predictions(bundle_paths: list[Path]) -> dict[Path, list[Prediction]]:
    """{bundle path, as given: the predictions of its run} from the prediction files of the GPU folder
    that holds it (a bundle's id is its folder's name)."""
    by_folder: dict[Path, dict[str, list[Prediction]]] = {}
    out: dict[Path, list[Prediction]] = {}
    for path in bundle_paths:
        folder = Path(path).resolve().parent
        if folder not in by_folder:
            by_folder[folder] = {}
            for f in prediction_files(folder):
                for p in read_predictions(f):
                    by_folder[folder].setdefault(p.run, []).append(p)
        found = by_folder[folder].get(Path(path).name, [])
        if found:
            out[path] = found
    return out
