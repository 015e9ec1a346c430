"""The generator's op records are what the converter records for the same kernels (fifteenth session).

The kernel model learns from measured kernels, whose memory-bound records carry no FLOPs
(calib.ops). Generated memory-bound ops had carried their element count as FLOPs, which the
model's curves and trees had never seen on such an op: a generated expert gradient accumulation was
timed 16% shorter than the profiled kernel with the same bytes, dtype and layout.
"""

from __future__ import annotations

import numpy as np

from calib.bundle.io import read_bundle
from calib.calibration import Calibration
from calib.fit import memory_layouts, shared_pieces
from calib.ops import FLOP_CLASSES
from calib.validation.engine import model_of, parallel_of
from calib.workload.generate import generate
from tests.conftest import ROOT, TRACES


def test_generated_memory_ops_record_no_flops_and_are_timed_as_measured() -> None:
    b = read_bundle(TRACES / "h200" / "mixtral-1gpu")
    km = Calibration.load(str(ROOT / "calib" / "data" / "calibration-h200.yaml")).kernel_model()
    gen = generate(model_of(b.manifest.spec), parallel_of(b.manifest.spec), km.predict)
    ops = gen.ops
    flop = ops["op_class"].isin(FLOP_CLASSES)
    assert (ops.loc[~flop, "flops"] == 0).all() and (ops.loc[flop, "flops"] > 0).all()
    acc = ops[ops["name"] == "moe.expert0.fc2.main_grad0"].reset_index(drop=True)
    k = shared_pieces(b.table("kernels"))
    k = k.assign(layout=memory_layouts(k, bench=False))
    same = k[(k["aten_op"] == "aten::add_") & (k["bytes"] == acc.loc[0, "bytes"]) & (k["layout"] == acc.loc[0, "layout"])]
    assert len(same) > 0
    profiled = np.asarray(km.predict(same.head(1).reset_index(drop=True)), dtype=float)[0]
    assert abs(acc.loc[0, "time_s"] - profiled) < 1e-3 * profiled
