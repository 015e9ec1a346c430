"""calib.ops.classify: GEMM/attention shape facts, memory bytes, dtypes; and on a real host trace."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from calib.ops import classify, kernel_layout, parse_dtype

BF16 = "Tensor(c10::BFloat16)"


def test_mm_from_real_trace_shapes() -> None:
    # aten::mm of the megatron-core sample: [4096, 2048] x [2048, 3072] (second operand transposed)
    r = classify("aten::mm", [[4096, 2048], [2048, 3072]], [BF16, BF16], [[4096, 3072]], [BF16])
    assert (r.op_class, r.m, r.n, r.k, r.batch, r.dtype) == ("gemm", 4096, 3072, 2048, 1, "bfloat16")
    assert r.flops == 2 * 4096 * 3072 * 2048
    assert r.bytes == 2 * (4096 * 2048 + 2048 * 3072 + 4096 * 3072)


def test_addmm_baddbmm_bmm_matmul_linear() -> None:
    f32 = "Tensor(float)"
    r = classify("aten::addmm", [[4096], [64, 1024], [1024, 4096]], [f32, f32, f32])
    assert (r.m, r.n, r.k, r.batch) == (64, 4096, 1024, 1)
    r = classify("aten::bmm", [[32, 128, 64], [32, 64, 256]], [BF16, BF16])
    assert (r.m, r.n, r.k, r.batch) == (128, 256, 64, 32) and r.flops == 2 * 128 * 256 * 64 * 32
    r = classify("aten::baddbmm", [[32, 128, 256], [32, 128, 64], [32, 64, 256], 0, 1], [BF16, BF16, BF16, "Int", "Int"])
    assert (r.m, r.n, r.k, r.batch) == (128, 256, 64, 32)
    r = classify("aten::matmul", [[2, 2048, 1024], [1024, 4096]], [BF16, BF16])
    assert (r.m, r.n, r.k, r.batch) == (4096, 4096, 1024, 1)
    r = classify("aten::matmul", [[4, 1, 16, 32], [8, 32, 16]], [BF16, BF16])
    assert (r.m, r.n, r.k, r.batch) == (16, 16, 32, 32)
    r = classify("aten::linear", [[2, 2048, 1024], [4096, 1024], [4096]], [BF16, BF16, BF16])
    assert (r.m, r.n, r.k, r.batch) == (4096, 4096, 1024, 1)


def test_attention_layouts_and_backward() -> None:
    q = [2, 16, 2048, 128]  # b h s d
    r = classify("aten::_scaled_dot_product_flash_attention", [q, q, q], [BF16] * 3)
    assert (r.op_class, r.m, r.n, r.k, r.batch) == ("attention", 2048, 2048, 128, 32)
    assert r.flops == 4 * 32 * 2048 * 2048 * 128
    assert classify("aten::scaled_dot_product_attention", [q, q, q], [BF16] * 3, causal=True).flops == r.flops / 2
    qs = [2, 2048, 16, 128]  # b s h d
    r2 = classify("aten::_flash_attention_forward", [qs, qs, qs], [BF16] * 3)
    assert (r2.m, r2.n, r2.k, r2.batch) == (2048, 2048, 128, 32)
    rb = classify("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q], [BF16] * 4)
    assert rb.flops == 2.5 * r.flops


def test_memory_and_other() -> None:
    r = classify("aten::add_", [[1024, 1024], [1024, 1024]], ["Tensor(float)"] * 2)
    assert r.op_class == "memory" and r.bytes == 3 * 4 * 1024 * 1024 and r.flops == 0
    assert math.isnan(r.m)
    r = classify("aten::sum", [[64, 1024]], ["Tensor(float)"])
    assert r.bytes == 4 * 64 * 1024
    r = classify("aten::_softmax", [[8, 2048], 1, False], [BF16, "Int", "Bool"], [[8, 2048]], [BF16])
    assert r.op_class == "memory" and r.bytes == 2 * 2 * 8 * 2048
    r = classify("aten::_foreach_add_", [[[10], [20]], [[10], [20]]], ["GenericList[Tensor(float),Tensor(float)]"] * 2)
    assert r.op_class == "memory" and r.bytes == 4 * (30 + 30 + 20)
    assert classify("aten::view", [[4, 4]], ["Tensor(float)"]).op_class == "other"
    assert classify("record_param_comms", [[4]], ["Tensor(float)"]).op_class == "other"
    assert classify("aten::mm", [[4]], ["Tensor(float)"]).op_class == "memory"  # shapes that are not a GEMM


def test_parse_dtype() -> None:
    assert parse_dtype("Tensor(c10::BFloat16)") == ("bfloat16", 2)
    assert parse_dtype("Tensor(long int)") == ("int64", 8)
    assert parse_dtype("Int") is None


def test_every_gemm_of_the_mcore_sample_is_classified(samples: Path) -> None:
    with gzip.open(samples / "h200x2-mcore-tp2" / "host.0.json.gz") as f:
        host = json.load(f)
    seen = 0
    for n in host["nodes"]:
        if n["name"] in ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul"):
            i, o = n["inputs"], n["outputs"]
            r = classify(n["name"], i["shapes"], i["types"], o["shapes"], o["types"])
            assert r.op_class == "gemm", n["name"]
            out = o["shapes"][0]
            assert r.m * r.n * r.batch == math.prod(out), (n["name"], i["shapes"], out)
            seen += 1
    assert seen > 200


@pytest.mark.parametrize("name", ["aten::native_layer_norm", "aten::gelu", "aten::copy_", "aten::native_dropout"])
def test_memory_bound_names(name: str) -> None:
    assert classify(name, [[16, 16]], [BF16]).op_class == "memory"


@pytest.mark.parametrize(("kernel", "layout"), [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int)", "contiguous"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)", "unrolled"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<...>>(int)", "strided"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>, unsigned int, float, 4, 4>>()", "reduce512x1"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, ...>>()", "reduce128x4"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memcpy DtoH (Device -> Pinned)", "dtoh"),
    ("Memcpy HtoD (Pageable -> Device)", "htod"),
    ("Memset (Device)", "memset"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>", "strided"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<...>", "contiguous"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<...>", "contiguous"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<...>", "contiguous"),
    ("void at::native::(anonymous namespace)::index_elementwise_kernel<128, 4>()", ""),
    ("copy/1048576", ""),
    (None, ""),
])
def test_kernel_layout_from_the_kernel_name(kernel: object, layout: str) -> None:
    assert kernel_layout(kernel) == layout
