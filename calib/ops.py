"""The one op classification: an aten op (name, input shapes, input types) -> OpRecord.

Used for every measured kernel (the converter fills kernels.parquet with these fields), by the
workload generator for every op it emits, and by the kernel model that predicts a time from them.
Classes: gemm (m, n, k, batch, flops = 2*m*n*k*batch), attention (m = query length, n = key length,
k = head dim, batch = batch x heads, flops = 4*batch*m*n*k forward, 2.5x that backward, halved when
causal), memory (bytes = input + output tensor bytes; flops 0), other (views, allocation, anything
not an aten op). Shapes are logical shapes: a transposed operand (different strides) has the same m,
n, k, so transposes need no special case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# Scalar type names as the PyTorch host trace writes them ("Tensor(c10::BFloat16)") -> (dtype, bytes)
_DTYPES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4),
    "c10::float": ("float32", 4),
    "float32": ("float32", 4),
    "double": ("float64", 8),
    "c10::half": ("float16", 2),
    "half": ("float16", 2),
    "float16": ("float16", 2),
    "c10::bfloat16": ("bfloat16", 2),
    "bfloat16": ("bfloat16", 2),
    "int": ("int32", 4),
    "int32": ("int32", 4),
    "long int": ("int64", 8),
    "long": ("int64", 8),
    "int64": ("int64", 8),
    "short int": ("int16", 2),
    "short": ("int16", 2),
    "unsigned char": ("uint8", 1),
    "signed char": ("int8", 1),
    "bool": ("bool", 1),
    "c10::float8_e4m3fn": ("float8_e4m3fn", 1),
    "c10::float8_e5m2": ("float8_e5m2", 1),
    "c10::float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "c10::float8_e5m2fnuz": ("float8_e5m2fnuz", 1),
    "c10::complex<float>": ("complex64", 8),
}
# Collective dtype names (record_param_comms `dtype`, Kineto `dtype`) -> bytes per element.
COMM_DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8,
}

# The compute classes: their records carry FLOPs and their work is FLOPs; memory and other record 0 FLOPs
# and their work is bytes.
FLOP_CLASSES = ("gemm", "attention")

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_scaled_mm", "aten::addbmm"}
# (name, layout of q/k/v: "bhsd" or "bshd", backward?)
ATTENTION_OPS: dict[str, tuple[str, bool]] = {
    "aten::scaled_dot_product_attention": ("bhsd", False),
    "aten::_scaled_dot_product_flash_attention": ("bhsd", False),
    "aten::_scaled_dot_product_efficient_attention": ("bhsd", False),
    "aten::_scaled_dot_product_cudnn_attention": ("bhsd", False),
    "aten::_scaled_dot_product_attention_math": ("bhsd", False),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhsd", True),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhsd", True),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhsd", True),
    "aten::_flash_attention_forward": ("bshd", False),
    "aten::_efficient_attention_forward": ("bshd", False),
    "aten::_flash_attention_backward": ("bshd", True),
    "aten::_efficient_attention_backward": ("bshd", True),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhsd", False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bhsd", True),
}
# Where an attention op's `is_causal` argument sits among its inputs (native_functions.yaml's
# signatures; the memory-efficient kernels' `custom_mask_type`, causal when not 0): the converter
# reads it from the host trace's input values (causal_of).
CAUSAL_ARG: dict[str, int] = {
    "aten::_flash_attention_forward": 8,
    "aten::_flash_attention_backward": 11,
    "aten::_efficient_attention_forward": 9,
    "aten::_efficient_attention_backward": 14,
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
}
# Ops that move no data on the GPU (views, metadata, allocation, host sync).
NO_DATA_OPS = {
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "transpose", "t", "permute",
    "expand", "expand_as", "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "view_as",
    "empty", "empty_like", "empty_strided", "resize_", "set_", "lift_fresh", "item",
    "_local_scalar_dense", "split", "split_with_sizes", "chunk", "unbind", "narrow", "contiguous",
    "to", "numpy_T", "unflatten", "flatten", "view_as_real", "view_as_complex", "record_stream",
}
# Reductions: the output is small next to the input (used only when output shapes are unknown).
REDUCTIONS = {"sum", "mean", "max", "min", "amax", "amin", "norm", "all", "any", "argmax", "argmin",
              "_foreach_norm", "linalg_vector_norm", "std", "var", "prod"}
# Compute-heavy non-GEMM ops that calib does not model as memory-bound.
OTHER_COMPUTE = {"convolution", "_convolution", "cudnn_convolution", "convolution_backward", "sort",
                 "topk", "nonzero", "unique", "_unique2", "multinomial"}

_TENSOR_RE = re.compile(r"Tensor\(([^)]*)\)")


@dataclass(slots=True)
class OpRecord:
    """One op's shape facts. flops in FLOP, bytes in bytes. m/n/k/batch: a GEMM's or attention's shape;
    for a memory-bound reduction with known output, m = output elements and k = elements reduced into
    each (`reduction_shape`); NaN otherwise."""

    op_class: str  # gemm | attention | memory | other
    aten_op: str
    dtype: str = ""
    m: float = math.nan
    n: float = math.nan
    k: float = math.nan
    batch: float = math.nan
    flops: float = 0.0
    bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_dtype(type_str: str) -> tuple[str, int] | None:
    """("bfloat16", 2) for "Tensor(c10::BFloat16)"; None when not a tensor type."""
    m = _TENSOR_RE.search(type_str)
    if not m:
        return None
    return _DTYPES.get(m.group(1).strip().lower(), (m.group(1).strip(), 4))


def _tensors(shapes: Sequence[Any], types: Sequence[str]) -> list[tuple[list[int], str, int]]:
    """Flatten inputs (incl. GenericList[Tensor...]) to (shape, dtype, element bytes)."""
    out: list[tuple[list[int], str, int]] = []
    for shape, typ in zip(shapes, types, strict=False):
        typ = str(typ)
        if typ.startswith("GenericList[") or typ.startswith("Tuple["):
            elems = _TENSOR_RE.findall(typ)
            if not elems or not isinstance(shape, list):
                continue
            subs = [s for s in shape if isinstance(s, list)]
            for sub, el in zip(subs, elems, strict=False):
                dt = _DTYPES.get(el.strip().lower(), (el.strip(), 4))
                out.append((_ints(sub), dt[0], dt[1]))
            continue
        dt = parse_dtype(typ)
        if dt is not None and isinstance(shape, list):
            out.append((_ints(shape), dt[0], dt[1]))
    return out


def _ints(shape: Sequence[Any]) -> list[int]:
    return [int(x) for x in shape if isinstance(x, int | float)]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _gemm(name: str, ts: list[tuple[list[int], str, int]]) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of a GEMM from its operand shapes, or None when the shapes do not fit."""
    short = name.split("::")[-1]
    mats = [t[0] for t in ts]
    if short in ("addmm", "baddbmm", "addbmm") and len(mats) >= 3:
        mats = mats[1:3]  # the first input is the bias / accumulator
    elif short == "linear" and len(mats) >= 2:
        x, w = mats[0], mats[1]
        if len(w) != 2 or not x:
            return None
        return _numel(x[:-1]), w[0], w[1], 1
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if short in ("mm", "_scaled_mm") and len(a) == 2 and len(b) == 2:
        return a[0], b[1], a[1], 1
    if short in ("bmm", "baddbmm") and len(a) == 3 and len(b) == 3:
        return a[1], b[2], a[2], a[0]
    if short == "addbmm" and len(a) == 3 and len(b) == 3:
        return a[1], b[2], a[2], a[0]
    # matmul: numpy broadcasting rules
    if not a or not b:
        return None
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    if len(b) == 2:  # (..., m, k) x (k, n): the batch folds into m
        return _numel(a[:-1]), b[1], a[-1], 1
    batch_a, batch_b = a[:-2], b[:-2]
    nd = max(len(batch_a), len(batch_b))
    batch_a = [1] * (nd - len(batch_a)) + batch_a
    batch_b = [1] * (nd - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b, strict=True))
    return a[-2], b[-1], a[-1], batch


def _attention(layout: str, ts: list[tuple[list[int], str, int]], backward: bool) -> tuple[int, int, int, int] | None:
    """(s_q, s_kv, head_dim, batch*heads) from q and k (after grad_out for backward ops)."""
    four_d = [t[0] for t in ts if len(t[0]) == 4]
    if backward:
        four_d = four_d[1:]  # grad_out comes first
    if len(four_d) < 2:
        return None
    q, k = four_d[0], four_d[1]
    if layout == "bhsd":
        return q[2], k[2], q[3], q[0] * q[1]
    return q[1], k[1], q[3], q[0] * q[2]


def causal_of(aten_name: str, values: Sequence[Any]) -> bool | None:
    """An attention op's `is_causal` from its recorded input values; None where not recorded."""
    i = CAUSAL_ARG.get(aten_name)
    if i is None or i >= len(values):
        return None
    v = values[i]
    if isinstance(v, bool | int):
        return bool(v)
    return {"true": True, "false": False}.get(str(v).strip().lower())


def classify(
    aten_name: str,
    input_shapes: Sequence[Any],
    input_types: Sequence[str],
    output_shapes: Sequence[Any] | None = None,
    output_types: Sequence[str] | None = None,
    causal: bool | None = None,
) -> OpRecord:
    """Classify one op; outputs, when given, make `bytes` exact for memory-bound ops."""
    ins = _tensors(input_shapes, input_types)
    outs = _tensors(output_shapes or [], output_types or [])
    dtype = ins[0][1] if ins else (outs[0][1] if outs else "")
    in_bytes = sum(_numel(s) * eb for s, _, eb in ins)
    out_bytes = sum(_numel(s) * eb for s, _, eb in outs)
    short = aten_name.split("::")[-1] if aten_name.startswith("aten::") else ""

    if aten_name in GEMM_OPS:
        g = _gemm(aten_name, ins)
        if g is not None:
            m, n, k, batch = g
            if output_shapes is None:
                out_bytes = m * n * batch * (ins[0][2] if ins else 2)
            return OpRecord("gemm", aten_name, dtype, m, n, k, batch, 2.0 * m * n * k * batch, float(in_bytes + out_bytes))
    if aten_name in ATTENTION_OPS:
        layout, backward = ATTENTION_OPS[aten_name]
        a = _attention(layout, ins, backward)
        if a is not None:
            sq, skv, d, bh = a
            flops = 4.0 * bh * sq * skv * d * (2.5 if backward else 1.0)
            if causal:
                flops /= 2
            if output_shapes is None:
                out_bytes = sum(_numel(s) * eb for s, _, eb in ins[: (3 if backward else 1)])
            return OpRecord("attention", aten_name, dtype, sq, skv, d, bh, flops, float(in_bytes + out_bytes))
    if not short or short in NO_DATA_OPS or short in OTHER_COMPUTE or not (ins or outs):
        return OpRecord("other", aten_name, dtype, bytes=float(in_bytes + out_bytes))
    base = short.rstrip("_")
    if output_shapes is None:
        largest = max((_numel(s) * eb for s, _, eb in ins), default=0)
        out_bytes = 0 if base in REDUCTIONS else largest
    m, k = reduction_shape(ins[0][0] if ins else [], outs[0][0] if outs else None) if base in REDUCTIONS else (0, 0)
    return OpRecord("memory", aten_name, dtype, m=m or math.nan, k=k or math.nan, bytes=float(in_bytes + out_bytes))


def reduction_shape(input_shape: Sequence[int], output_shape: Sequence[int] | None) -> tuple[int, int]:
    """(output elements, elements reduced into each) of a reduction, (0, 0) where its output is unknown
    or does not divide its input. One kernel name (reduce_kernel<512, 1>) runs a bf16 sum over rows of
    4 elements at ~350 GB/s and over rows of 14,336 at ~2.3 TB/s (benchmarks/reduce_shapes.py): the
    reduced length, not the bytes, sets its time."""
    if output_shape is None:
        return 0, 0
    out, inp = _numel(list(output_shape)), _numel(list(input_shape))
    if out <= 0 or inp <= 0 or inp % out:
        return 0, 0
    return out, inp // out


# TensorIterator indexes an elementwise op's operands with 32-bit offsets (in bytes) where it can;
# an op whose largest operand spans more (a whole fp32 gradient buffer zeroed or scaled) is halved
# until every piece fits, each piece one kernel of the same name (aten/src/ATen/TensorIterator.cpp,
# can_use_32bit_indexing / with_32bit_indexing). The op's bytes are its pieces' together. A piece fits
# when its last element's offset plus one is at most 2^31 - 1, which for 2- and 4-byte elements is a
# piece of at most 2^31 bytes: an fp32 tensor of exactly 2^33 bytes runs as 4 pieces, not 8 (the
# unfused attention's scores of Llama-3 8B at sequence 8192, llama8b-1gpu-s8192).
INT32_SPAN_BYTES = 2**31


def index_pieces(largest_operand_bytes: float) -> int:
    """Kernels an elementwise op runs as, for its largest operand's size (a contiguous tensor)."""
    if not largest_operand_bytes > INT32_SPAN_BYTES:
        return 1
    return 2 ** math.ceil(math.log2(largest_operand_bytes / INT32_SPAN_BYTES))


def piece_counts(recorded_bytes: float) -> list[int]:
    """The index_pieces an elementwise op may run as, largest first, from its recorded bytes alone: its
    largest operand is between a third (two inputs and an output of one size: mul) and half (an
    in-place op: the tensor read and written; a bf16-to-fp32 copy is 0.4) of them."""
    hi, lo = index_pieces(recorded_bytes / 2), index_pieces(recorded_bytes / 3)
    return [2**e for e in range(int(math.log2(hi)), int(math.log2(lo)) - 1, -1)]


def in_place_pieces(recorded_bytes: float) -> int:
    """index_pieces of an in-place elementwise op from its recorded bytes (classify: the tensor it
    writes, read and written), whose largest operand is half of them."""
    return index_pieces(recorded_bytes / 2)


def largest_operand_bytes(input_shapes: Sequence[Any], input_types: Sequence[str],
                          output_shapes: Sequence[Any] | None = None, output_types: Sequence[str] | None = None) -> int:
    """The bytes of an op's largest tensor operand, inputs and outputs (0 without tensors)."""
    ts = _tensors(input_shapes, input_types) + _tensors(output_shapes or [], output_types or [])
    return max((_numel(s) * eb for s, _, eb in ts), default=0)


# A memory-bound kernel's name tells how PyTorch laid its operands out, which its bytes do not: two
# `aten::sum` of 10.5 MB in one llama8b-tp2 step take 10 us as `reduce_kernel<128, 4>` and 30 us as
# `reduce_kernel<512, 1>`. TensorIterator picks `vectorized_elementwise_kernel` for contiguous
# aligned operands, `unrolled_elementwise_kernel` for unaligned or casting ones, the generic
# `elementwise_kernel` for strided or broadcast ones, and a reduction's block shape from the reduced
# axis; copies of one dtype and fills are driver memcpy/memset calls.
_LAYOUT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"vectorized_elementwise_kernel"), "contiguous"),
    (re.compile(r"unrolled_elementwise_kernel"), "unrolled"),
    (re.compile(r"\belementwise_kernel<"), "strided"),
    (re.compile(r"^Memcpy DtoD"), "memcpy"),
    (re.compile(r"^Memcpy DtoH"), "dtoh"),
    (re.compile(r"^Memcpy HtoD"), "htod"),
    (re.compile(r"^Memset"), "memset"),
    (re.compile(r"splitKreduce_kernel"), "splitk"),
    # torch.cat: the vectorized and contiguous variants copy whole rows; the plain batched copy
    # indexes every element (strided inputs or output), ~4x slower per byte (868 against 3,679 GB/s,
    # median over the H200 steps).
    (re.compile(r"CatArrayBatchedCopy_(vectorized|contig|aligned\w*contig)\b"), "contiguous"),
    (re.compile(r"CatArrayBatchedCopy<"), "strided"),
)
_REDUCE_RE = re.compile(r"(?<!splitK)reduce_kernel<(\d+), (\d+)")
LAYOUTS = ("contiguous", "unrolled", "strided", "memcpy", "dtoh", "htod", "memset", "splitk")  # and reduce<A>x<B>
SPLIT_K_REDUCE = "splitKreduce_kernel"
# cuBLAS splits a GEMM's K over thread blocks when M x N is small against K (seen at 512 tokens, not at
# 2048), and sums the partial fp32 products in a second kernel: one fp32 read of M x N per split and a
# write of the output. The number of splits is not recorded; bytes count one fp32 read and one write.
SPLIT_K_BYTES_PER_ELEMENT = 4 + 2


def is_split_k_reduce(kernel_name: object) -> bool:
    """Whether a kernel launched by a GEMM op is cuBLAS's split-K reduction, not the GEMM itself."""
    return SPLIT_K_REDUCE in str(kernel_name or "")


def split_k_bytes(m: Any, n: Any, batch: Any) -> Any:
    """Bytes a split-K reduction is counted to move for a GEMM of M x N (x batch; NaN batch: 1).
    Scalars or arrays."""
    batch = np.where(np.isfinite(np.asarray(batch, dtype=float)), batch, 1.0)
    return np.asarray(m, dtype=float) * np.asarray(n, dtype=float) * batch * SPLIT_K_BYTES_PER_ELEMENT


def split_k_reduce_record(gemm: OpRecord) -> OpRecord:
    """The record of a GEMM op's split-K reduction kernel: memory-bound, over the GEMM's M x N output."""
    return OpRecord("memory", gemm.aten_op, gemm.dtype, bytes=float(split_k_bytes(gemm.m, gemm.n, gemm.batch)))


# Ops whose one call launches kernels of repeated names and unlike records: torch's embedding backward
# above 3,072 indices sorts them (radix-sort passes, each after a memset), zeroes the table's gradient,
# then reduces the sorted segments (unique, scans, compute_grad_weight, sum_and_scatter). The fit takes
# each run of their kernels as one op instance (calib.models.kernel.op_instances), labelled by its path.
EMBEDDING_BWD = "aten::embedding_dense_backward"
CALL_OPS = frozenset({EMBEDDING_BWD})
CALL_LAYOUTS = ("feature", "sort", "segments")


def call_layout(aten_op: str, kernel_names: list[str]) -> str:
    """The path one run of a CALL_OPS op's kernels took: "feature" (the embedding backward's one-kernel
    path, at most 3,072 indices), "sort" (its radix sort) or "segments" (its segment reduction)."""
    if aten_op != EMBEDDING_BWD:
        return ""
    names = " ".join(kernel_names)
    if "embedding_backward_feature_kernel" in names:
        return "feature"
    return "sort" if "radix_sort" in names else "segments"


def kernel_layout(kernel_name: object) -> str:
    """The operand layout a memory-bound kernel's name names ("" when it names none): one of
    LAYOUTS, or "reduce<A>x<B>" for a reduction of block shape <A, B>."""
    name = str(kernel_name or "")
    m = _REDUCE_RE.search(name)
    if m:
        return f"reduce{m.group(1)}x{m.group(2)}"
    for pattern, label in _LAYOUT_RULES:
        if pattern.search(name):
            return label
    return ""
