"""Predictions for a campaign round, written before it runs: `calib project --json` of each job's
configuration with the committed calibration of the cluster's GPU, its step time and memory verdict.

    python -m measure.campaigns.predict --cluster h100-1 --out traces/h100/_campaigns/ROUND/predictions.json ID...

Runs no GPU work; a later comparison against the measured bundles is what makes them predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from calib.calibration import Calibration
from calib.cluster import load_cluster
from calib.errors import CalibError
from calib.project import default_calibration_path, project
from calib.workload.models import resolve_model
from calib.workload.parallel import ParallelConfig
from measure.campaigns.h200 import TRAININGS

_MODELLED_FLAGS = ("--sequence-parallel", "--distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather")


def _flag(extra: list[str], name: str, default: str) -> str:
    return extra[extra.index(name) + 1] if name in extra else default


def predict(ids: list[str], cluster: str) -> dict[str, dict]:
    specs = {s[0]: s for s in TRAININGS}
    preset = load_cluster(cluster)
    path = default_calibration_path(preset.gpu)
    cal = Calibration.load(path)
    out: dict[str, dict] = {}
    for rid in ids:
        _, model, tp, pp, dp, ep, mbs, gbs, rc, extra = specs[rid]
        attention = _flag(extra, "--attention", "local")
        # Every flag of the job that the projection models (round 20 predicted gpt13b-dp2-distopt-og
        # without its distributed optimizer: its memory 30 % high).
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, vpp=int(_flag(extra, "--vpp", "1")), micro_batch=mbs,
                             global_batch=gbs, recompute=rc, sequence_parallel="--sequence-parallel" in extra,
                             distributed_optimizer="--distributed-optimizer" in extra,
                             overlap_grad_reduce="--overlap-grad-reduce" in extra,
                             overlap_param_gather="--overlap-param-gather" in extra, attention=attention)
        r = project(resolve_model(model), par, preset, cal)
        d = r.memory_detail_gib
        out[rid] = {
            "command": (f"calib project --cluster {cluster} --gpus {tp * pp * dp} --json --model {model} --tp {tp} "
                        f"--pp {pp} --ep {ep} --mbs {mbs} --gbs {gbs} --recompute {rc} --attention {attention}"
                        + "".join(f" {f}" for f in _MODELLED_FLAGS if f in extra)
                        + (f" --vpp {par.vpp}" if par.vpp > 1 else "")),
            "calibration": f"{path.name} ({r.calibration_id})",
            "step_time_s": r.step_time_s, "memory_verdict": r.memory_verdict,
            "memory_gib_per_gpu": r.memory_gib_per_gpu, "device_low_gib": d["device_low"],
            "device_high_gib": d["device_high"], "capacity_gib": d["capacity"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("ids", nargs="+")
    a = ap.parse_args()
    try:
        text = json.dumps(predict(a.ids, a.cluster), indent=1) + "\n"
    except (CalibError, KeyError) as exc:  # an unknown preset or job id: one line, nothing written
        raise SystemExit(f"predict: {exc}") from None
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
