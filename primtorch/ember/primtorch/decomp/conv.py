"""Convolution as generated gathers plus a matmul extern, for targets with no convolution kernel.

The tracer records `aten.convolution` as the extern op `extern.convolution` (a library kernel).
A runtime that has matmul but no convolution (the C++ runtime on CUDA, which links neither
libtorch nor cuDNN) asks for this decomposition instead (`Tracer(no_extern=...)`,
`decompose_externs`):

- groups == 1: im2col. The input is padded into a fresh contiguous buffer; an `as_strided` view of
  it has shape (N, C, *kernel, *out): every output position's window. Reshaped to (N, C*K, L) that
  is the column matrix (a generated copy kernel), and out = W (Cout, C*K) @ cols per sample is one
  `extern.bmm` with W broadcast over the batch, which lands in NCHW order. A 1x1 kernel needs no
  windows: the (strided, padded) input itself is the column matrix, a plain matmul.
- groups > 1 (depthwise and grouped): the window view times the weight, summed over (Cg, *kernel):
  one fused reduction kernel that never materialises the columns.

The result gets the bias and, when it differs, the layout `extern.convolution` would produce, so
the graph around the rewritten node keeps its strides.
"""

from __future__ import annotations

import math

from ember.primtorch import prims, utils

from ..errors import NotDecomposableError
from ._common import aten

_EXTERN = prims.extern


def _tuple(v, n):
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * n if len(v) == 1 else v


def window_view(x, kernel, stride, padding, dilation, out_sizes):
    """(N, C, *kernel, *out) with [n, c, k.., o..] = padded x at o*stride + k*dilation."""
    nsp = len(kernel)
    low = (0, 0) + tuple(padding)
    high = [0, 0]
    for i in range(nsp):  # only as much right padding as the last window reads
        need = (out_sizes[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        high.append(need - x.shape[2 + i] - padding[i])
    xp = x
    if any(low) or any(high):
        xp = prims.pad(x, 0, low, tuple(high), (0,) * x.ndim)
    if all(k == 1 for k in kernel):  # a strided slice of the input is the window view
        limits = tuple(xp.shape[:2]) + tuple((o - 1) * s + 1 for o, s in zip(out_sizes, stride))
        if any(s != 1 for s in stride):
            xp = prims.slice(xp, (0,) * xp.ndim, limits, (1, 1) + tuple(stride))
        return prims.expand_dims(xp, tuple(range(2, 2 + nsp)))
    # as_strided needs a buffer whose layout is known here and in every backend: a fresh copy.
    xp = prims.copy_strided(xp, utils.make_contiguous_strides_for(tuple(xp.shape)))
    st = xp.stride()
    sizes = tuple(xp.shape[:2]) + tuple(kernel) + tuple(out_sizes)
    strides = (st[0], st[1], *(st[2 + i] * dilation[i] for i in range(nsp)),
               *(st[2 + i] * stride[i] for i in range(nsp)))  # fmt: skip
    return prims.as_strided(xp, sizes, strides, 0)


def _matmul_form(win, weight, n, cout, out_sizes):
    """groups == 1: out[n] = W (Cout, C*K) @ cols[n] (C*K, L), one bmm with W broadcast."""
    k = math.prod(win.shape[1 : 2 + len(out_sizes)])  # C * prod(kernel)
    cols = prims.reshape(win, (n, k, math.prod(out_sizes)))
    if 1 not in cols.stride()[1:]:  # cuBLAS and the CPU gemm need one unit stride per operand
        cols = prims.copy_strided(cols, utils.make_contiguous_strides_for(tuple(cols.shape)))
    w = prims.reshape(weight, (cout, k))
    out = _EXTERN.bmm(prims.broadcast_in_dim(w, (n, cout, k), (1, 2)), cols)
    return prims.reshape(out, (n, cout, *out_sizes))


def _reduction_form(win, weight, groups, out_sizes):
    """groups > 1: out[n, g, o, p] = sum over (c, k) of win[n, g, c, k, p] * w[g, o, c, k]."""
    nsp = len(out_sizes)
    n = win.shape[0]
    cout, cg = weight.shape[:2]
    og, kernel = cout // groups, tuple(weight.shape[2:])
    win = prims.reshape(win, (n, groups, cg, *kernel, *out_sizes))
    # (N, G, Og, *out, Cg, *kernel): the reduced dims last.
    shape = (n, groups, og, *out_sizes, cg, *kernel)
    out_dims = tuple(range(3 + nsp, 3 + 2 * nsp))
    perm = (0, 1, *out_dims, 2, *range(3, 3 + nsp))
    win = prims.broadcast_in_dim(prims.permute(win, perm), shape,
                                 (0, 1, *range(3, 4 + 2 * nsp)))  # fmt: skip
    w = prims.reshape(weight, (groups, og, cg, *kernel))
    w = prims.broadcast_in_dim(w, shape, (1, 2, *range(3 + nsp, 4 + 2 * nsp)))
    acc = utils.opmath_dtype(win.dtype)
    if acc != win.dtype:
        win, w = prims.convert_element_type(win, acc), prims.convert_element_type(w, acc)
    out = prims.sum(prims.mul(win, w), tuple(range(3 + nsp, 4 + 2 * nsp)))
    if acc != weight.dtype:
        out = prims.convert_element_type(out, weight.dtype)
    return prims.reshape(out, (n, cout, *out_sizes))


def convolution_as_matmul(input, weight, bias, stride, padding, dilation, transposed,
                          output_padding, groups):  # fmt: skip
    """aten.convolution (N-d, not transposed) as window gathers, matmul or reduction, bias."""
    if transposed:
        raise NotDecomposableError("transposed convolution has no matmul decomposition")
    expected = _EXTERN.convolution.meta(input, weight, bias, stride, padding, dilation, transposed,
                                        output_padding, groups)  # fmt: skip
    nsp = input.ndim - 2
    stride, padding, dilation = (_tuple(v, nsp) for v in (stride, padding, dilation))
    kernel = tuple(weight.shape[2:])
    out_sizes = tuple(int(s) for s in expected.sizes[2:])
    n, cout = input.shape[0], weight.shape[0]
    win = window_view(input, kernel, stride, padding, dilation, out_sizes)
    if groups == 1:
        out = _matmul_form(win, weight, n, cout, out_sizes)
    else:
        out = _reduction_form(win, weight, groups, out_sizes)
    if bias is not None:
        out = prims.add(out, prims.broadcast_in_dim(bias, tuple(out.shape), (1,)))
    want = tuple(int(s) for s in expected.strides)
    if _significant(out.shape, out.stride()) != _significant(out.shape, want):
        out = prims.copy_strided(out, want)
    return out


def _significant(sizes, strides):
    return tuple(st for s, st in zip(sizes, strides) if s > 1)


# ATen op -> the decomposition the tracer uses when told the op's extern is not available.
EXTERN_DECOMPOSITIONS = {aten.convolution.default: convolution_as_matmul}

