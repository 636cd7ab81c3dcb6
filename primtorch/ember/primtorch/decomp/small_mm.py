"""A matrix product with one or two rows, or a thin one, as a fused multiply-and-sum reduction.

At batch 1 a Linear layer is a matrix-vector product: a library GEMM spends more in launches
(and, for addmm, in first copying the bias into the output) than in reading the weight, and it
cannot take the activation that follows. As a reduction over K it is one generated kernel that
reads each weight once and fuses the bias and the next pointwise ops. A thin product (K and N
both at most MAX_THIN, any number of rows: CaiT's talking heads mix 4 heads with a 4x4 Linear over
every attention score) reads each row of A once for a few multiply-adds: memory-bound work that
a GEMM library runs at a fraction of copy bandwidth, on tensor cores it cannot use. Larger
products, and integer ones, are refused (NotDecomposableError) and stay library calls.

A product whose weight is dequantized from int8/int4 in the graph (ember.quantize_weights) is
taken with up to MAX_DEQUANTIZED_ROWS rows (`allow_rows`): as a reduction, the kernel reads the
quantized bytes and dequantizes in registers, where a library GEMM needs the float weight written
out and read back first. Beyond two rows the rows become the fastest output dimension, so each
weight row is read once from memory for all of them and then from cache.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import NotDecomposableError

aten = torch.ops.aten
MAX_ROWS = 2
MAX_WEIGHT_ELEMENTS = 1 << 24
MAX_THIN = 16
MAX_DEQUANTIZED_ROWS = 8
_max_rows = [MAX_ROWS]


@contextlib.contextmanager
def allow_rows(rows: int):
    """Within the block, products of up to `rows` rows are decomposed (dequantized weights)."""
    _max_rows.append(rows)
    try:
        yield
    finally:
        _max_rows.pop()


def is_thin(k, n) -> bool:
    """Whether a product of inner size k and n columns is thin (both static, at most MAX_THIN)."""
    return all(isinstance(v, int) and v <= MAX_THIN for v in (k, n))


def _check(a, b):
    if a.ndim == 2 and b.ndim == 2 and a.dtype.is_floating_point and is_thin(*b.shape):
        return
    if (a.ndim != 2 or b.ndim != 2 or a.shape[0] > _max_rows[-1] or not a.dtype.is_floating_point
            or a.shape[1] * b.shape[1] > MAX_WEIGHT_ELEMENTS):  # fmt: skip
        raise NotDecomposableError("a product with more than a few rows, not thin, stays a library GEMM")


def _product(a, b):
    # (M, 1, K) * (1, N, K) summed over the last dim, K, in float32 for 16-bit inputs
    acc = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    if MAX_ROWS < a.shape[0] <= _max_rows[-1]:  # a few rows, allowed for a dequantized weight
        # reduced as (N, M): a weight row's reads serve every row of `a` in turn; then copied
        # (M * N elements) into the row-major layout that the product's consumers were traced with
        return (b.to(acc).t().unsqueeze(1) * a.to(acc).unsqueeze(0)).sum(2).t().contiguous()
    return (a.to(acc).unsqueeze(1) * b.to(acc).t().unsqueeze(0)).sum(2)


def mm_as_reduction(self, mat2):
    _check(self, mat2)
    return _product(self, mat2).to(self.dtype)


def addmm_as_reduction(self, mat1, mat2, *, beta=1, alpha=1):
    _check(mat1, mat2)
    out = _product(mat1, mat2)
    if alpha != 1:
        out = out * alpha
    if beta != 0:
        bias = self.to(out.dtype)
        out = out + (bias if beta == 1 else bias * beta)
    return out.to(mat1.dtype)


EXTERN_DECOMPOSITIONS = {aten.mm.default: mm_as_reduction, aten.addmm.default: addmm_as_reduction}
