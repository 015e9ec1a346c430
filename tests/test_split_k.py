"""cuBLAS's split-K reduction kernels are memory-bound sums, not copies of the GEMM they finish."""

from __future__ import annotations

import pandas as pd
import pytest

from calib.fit import split_k_reductions
from calib.ops import OpRecord, is_split_k_reduce, kernel_layout, split_k_reduce_record
from tests.conftest import TRACES

NAME = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, false>"


def test_split_k_reduce_is_a_memory_op_over_the_gemm_output() -> None:
    assert is_split_k_reduce(NAME) and not is_split_k_reduce("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_splitK_NNT")
    assert kernel_layout(NAME) == "splitk"
    assert kernel_layout("void at::native::reduce_kernel<512, 1, x>") == "reduce512x1"
    rec = split_k_reduce_record(OpRecord("gemm", "aten::mm", "bfloat16", 512, 4096, 28672, 1, 1.2e11, 3e8))
    assert (rec.op_class, rec.flops, rec.bytes) == ("memory", 0.0, 512 * 4096 * 6)


def _kernels(name: str) -> pd.DataFrame:
    path = TRACES / "h200" / name / "kernels.parquet"
    if not path.is_file():
        pytest.skip(f"no committed bundle {name}")
    return pd.read_parquet(path)


def test_old_tables_are_relabelled_as_the_converter_now_records() -> None:
    """mixtral-ep2-mbs2 was converted before the converter knew split-K sums (they carry their GEMM's
    shape); its twin mixtral-ep2-mbs2-raw was reconverted from its raw traces since."""
    old, new = _kernels("mixtral-ep2-mbs2"), _kernels("mixtral-ep2-mbs2-raw")
    sk_old, sk_new = old["name"].map(is_split_k_reduce), new["name"].map(is_split_k_reduce)
    assert sk_old.sum() == sk_new.sum() > 0
    assert set(old.loc[sk_old, "op_class"]) == {"gemm"} and set(new.loc[sk_new, "op_class"]) == {"memory"}
    assert split_k_reductions(new).equals(new)
    fixed = split_k_reductions(old)
    assert set(fixed.loc[sk_old, "op_class"]) == {"memory"} and (fixed.loc[sk_old, "flops"] == 0).all()
    assert sorted(fixed.loc[sk_old, "bytes"]) == sorted(new.loc[sk_new, "bytes"])
    assert fixed.loc[~sk_old].equals(old.loc[~sk_old])
