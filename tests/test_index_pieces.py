"""Ops past 32-bit indexing: one op, several kernels, each with its share of the op's bytes.

PyTorch halves an elementwise op whose largest operand spans more than 2^31 - 1 bytes until every
piece fits (calib.ops.index_pieces). The profiled steps show it on the fp32 gradient buffer: zeroed
(fill_) and, with data parallelism, scaled (mul_) as 2, 4 or 8 back-to-back kernels of one name.
Before the converter shared the op's bytes among them, every piece carried the whole op's, which
read as 9-38 TB/s on a 4.8 TB/s GPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calib.fit import index_piece_runs
from calib.ops import INT32_SPAN_BYTES, index_pieces
from tests.conftest import TEST_DATA, TRACES

H200 = TRACES / "h200"
HBM_BYTES_PER_S = 4.8e12  # H200


def test_index_pieces_halves_until_every_piece_fits() -> None:
    assert index_pieces(0) == 1
    assert index_pieces(INT32_SPAN_BYTES) == 1
    assert index_pieces(INT32_SPAN_BYTES + 1) == 2
    assert index_pieces(3.85e9) == 2  # llama3-8b at TP 2: 962 M fp32 gradients
    assert index_pieces(4 * INT32_SPAN_BYTES) == 4
    assert index_pieces(4 * INT32_SPAN_BYTES + 1) == 8


def test_converter_shares_the_bytes_of_a_split_fill_among_its_pieces() -> None:
    """tests/data/h200-pp2-raw (gpt6.7b-pp2-mbs2): stage 0 zeroes 617 M fp32 gradients as two kernels."""
    from calib.convert import convert_traces

    raw = TEST_DATA / "h200-pp2-raw"
    conv = convert_traces({0: raw / "host.0.json.xz"}, {0: raw / "device.0.json.xz"})
    k = conv.kernels
    big = k[(k["aten_op"] == "aten::fill_") & (k["dtype"] == "float32") & (k["bytes"] > 1e9)]
    assert len(big) == 2 and big["bytes"].nunique() == 1
    # each piece moved its half: under the GPU's bandwidth (in + out convention: 2 x the buffer)
    assert (big["bytes"] / 2 / big["time_s"] < HBM_BYTES_PER_S).all()
    # and its bytes are the committed (pre-sharing) table's, read off that table by index_piece_runs
    old = pd.read_parquet(H200 / "gpt6.7b-pp2-mbs2" / "kernels.parquet")
    old = old[old["rank"] == 0]
    shared = old["bytes"] / index_piece_runs(old)
    sel = (old["aten_op"] == "aten::fill_") & (old["dtype"] == "float32") & (old["bytes"] > 1e9)
    assert sorted(shared[sel]) == sorted(big["bytes"])
    assert (old.loc[sel, "bytes"] == 2 * big["bytes"].iloc[0]).all()


def test_table_inference_agrees_with_the_converter_on_a_twin() -> None:
    """llama8b-tp2 (converted before the sharing) and llama8b-tp2-raw (reconverted since from its
    kept traces) ran the same configuration: the inferred shares equal the converter's."""
    old = pd.read_parquet(H200 / "llama8b-tp2" / "kernels.parquet")
    new = pd.read_parquet(H200 / "llama8b-tp2-raw" / "kernels.parquet")
    pieces = index_piece_runs(old)
    assert set(np.unique(pieces)) == {1.0, 2.0}
    assert set(old.loc[pieces == 2, "aten_op"]) == {"aten::fill_"}
    fp32 = lambda df: sorted(df.loc[(df["aten_op"] == "aten::fill_") & (df["dtype"] == "float32"), "bytes"])  # noqa: E731
    assert fp32(old.assign(bytes=old["bytes"] / pieces)) == fp32(new)
    assert (index_piece_runs(new) == 1).all()  # a shared table is never split again


@pytest.mark.parametrize("bundle", ["mixtral-1gpu", "mixtral-ep2-mbs2", "gpt13b-1gpu-mbs2"])
def test_shared_pieces_run_at_a_possible_bandwidth(bundle: str) -> None:
    df = pd.read_parquet(H200 / bundle / "kernels.parquet")
    pieces = index_piece_runs(df)
    split = pieces > 1
    assert split.any()
    raw_bw = df.loc[split, "bytes"] / 2 / df.loc[split, "time_s"]
    assert (raw_bw > HBM_BYTES_PER_S).all()  # as recorded: impossible
    assert (raw_bw / pieces[split] < HBM_BYTES_PER_S).all()  # shared: under the HBM bandwidth


def test_generator_emits_the_pieces_of_a_large_in_place_op() -> None:
    from calib.workload.ops import in_pieces, memop, optimizer_ops

    n = 961_581_056  # fp32 gradients of llama3-8b@L4 at TP 2 (traces/h200/llama8b-tp2-raw)
    zero = optimizer_ops(n, [(n, True)], "bf16")[0]
    assert zero.name == "optimizer.zero_grad" and zero.repeat == 2 and zero.bytes == 4 * n
    new = pd.read_parquet(H200 / "llama8b-tp2-raw" / "kernels.parquet")
    assert zero.bytes in set(new.loc[new["aten_op"] == "aten::fill_", "bytes"])
    small = memop("x.zero", 8 * 1000, "fp32", "aten::fill_")
    assert small.repeat == 1 and small.bytes == 8000
    out_of_place = memop("x.copy", 8 * n, "fp32", "aten::mul")
    assert in_pieces(out_of_place) == out_of_place and out_of_place.repeat == 1


def test_a_piece_of_exactly_two_to_the_31_bytes_fits() -> None:
    """torch splits while a piece's last offset passes 2^31 - 1: an fp32 tensor of 2^33 bytes runs as 4
    pieces. The unfused attention's fp32 scores of Llama-3 8B at sequence 8192 are that size, and the
    profiled step of llama8b-1gpu-s8192 ran each of their copies, masked fills and multiplies as 4
    kernels (recorded before the converter shared them: 4 x 2^33 bytes through HBM in 1.5 ms otherwise)."""
    from calib.ops import piece_counts

    assert index_pieces(2**31) == 1 and index_pieces(2**33) == 4 and index_pieces(2**33 + 4) == 8
    scores = 32 * 8192 * 8192  # elements of one layer's scores at micro-batch 1
    assert piece_counts(10 * scores) == [8, 4]  # bf16 -> fp32 copy: the fp32 output is 0.4 of its bytes
    df = pd.read_parquet(H200 / "llama8b-1gpu-s8192" / "kernels.parquet")
    pieces = index_piece_runs(df)
    big = df["bytes"] >= 8 * scores
    assert set(pieces[big.to_numpy() & (df["op_class"] == "memory").to_numpy()]) - {1.0} == {4.0}
    shared = df.loc[pieces == 4]
    assert set(shared["aten_op"]) == {"aten::copy_", "aten::masked_fill_", "aten::mul"}
    assert ((shared["bytes"] / 4 / 2 / shared["time_s"]) < HBM_BYTES_PER_S).all()
