"""The embedding backward, as profiled and as generated (eighteenth session).

torch's embedding_dense_backward takes one kernel for at most 3,072 indices and otherwise sorts them:
20 kernels (radix-sort passes after memsets), the table's gradient zeroed, then 9 more (the segment
reduction). The fit had cut the sort path into fragments at its repeated kernel names and timed the
one-kernel path by its record's bytes, which the table dominates: generated 5-10x short on one path
and about 2x long on the other.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calib.bundle.io import read_bundle
from calib.calibration import Calibration
from calib.fit import kernel_rows
from calib.models.kernel import op_instances
from calib.validation.engine import model_of, parallel_of
from calib.workload.generate import generate
from calib.workload.ops import EMBEDDING_BWD_SEGMENT_KERNELS, EMBEDDING_BWD_SORT_KERNELS
from tests.conftest import ROOT, TRACES

EMB = "aten::embedding_dense_backward"


def _calls(run: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, _ = kernel_rows([read_bundle(TRACES / "h200" / run)])
    return rows, op_instances(rows)


def test_a_sort_path_call_is_two_instances_and_a_one_kernel_call_one() -> None:
    rows, inst = _calls("llama8b-1gpu-mbs2")  # 4,096 indices: the sort path
    emb = rows[rows["aten_op"] == EMB]
    calls = inst[inst["aten_op"] == EMB]
    assert sorted(calls["layout"].unique()) == ["segments", "sort"]
    assert (calls["layout"] == "sort").sum() == (calls["layout"] == "segments").sum()
    per_call = len(emb) / (calls["layout"] == "sort").sum()
    assert per_call == EMBEDDING_BWD_SORT_KERNELS + EMBEDDING_BWD_SEGMENT_KERNELS
    assert np.isclose(calls["time_s"].sum(), emb["time_s"].sum())  # no kernel time lost or counted twice
    spec = read_bundle(TRACES / "h200" / "llama8b-1gpu-mbs2").manifest.spec
    assert (calls["m"] == spec.micro_batch * spec.seq_length).all() and (calls["k"] == 4096).all()
    assert (calls["bytes"] > 1e9).all()  # the op's record, not a memset's scratch bytes

    rows, inst = _calls("gpt13b-tp2")  # 2,048 indices: one kernel per call
    calls = inst[inst["aten_op"] == EMB]
    assert (calls["layout"] == "feature").all() and len(calls) == (rows["aten_op"] == EMB).sum()


def test_the_generated_embedding_backward_is_timed_as_profiled() -> None:
    """Both paths, generated with the bundled calibration, within 25 % of the profiled calls' total
    (the sort path's segment reduction varies with the batch's distinct token ids)."""
    km = Calibration.load(str(ROOT / "calib" / "data" / "calibration-h200.yaml")).kernel_model()
    for run, layouts in (("gpt175b-tp4", {"feature"}), ("gpt13b-tp2", {"feature"}),
                         ("gpt6.7b-tp2-mbs2", {"sort", "segments"}), ("llama8b-tp4-mbs4", {"sort", "segments"})):
        b = read_bundle(TRACES / "h200" / run)
        gen = generate(model_of(b.manifest.spec), parallel_of(b.manifest.spec), km.predict)
        ops = {op: n for op, n in gen.op_counts(0).items() if op.aten_op == EMB}
        assert {op.layout for op in ops} == layouts
        kernels = {op.layout: op.kernels for op in ops}
        if "sort" in layouts:
            assert kernels == {"sort": EMBEDDING_BWD_SORT_KERNELS, "segments": EMBEDDING_BWD_SEGMENT_KERNELS}
        records = pd.DataFrame([op.record() for op in ops])
        generated = float(np.dot(km.predict(records), list(ops.values())))
        k = b.table("kernels")
        profiled = float(k.loc[(k["rank"] == 0) & (k["aten_op"] == EMB), "time_s"].sum())
        assert abs(generated / profiled - 1) < 0.25, (run, generated, profiled)
