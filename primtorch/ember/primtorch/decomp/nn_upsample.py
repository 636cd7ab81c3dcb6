"""Upsampling (nearest, nearest-exact, linear/bilinear/trilinear, bicubic) and backwards.

Every mode is separable: one dim at a time, the output gathers input rows at computed source
indices and mixes them with per-position weights; the backward scatters (index_add) the gradient
through the same indices and weights. Source indices follow torch's UpSample.h formulas, computed
in float32 (float64 for float64 inputs) exactly as its kernels round them.
"""

from __future__ import annotations

import struct

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert
from ._registry import register_decomposition


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _scale(in_size, out_size, align_corners, scale, dtype):
    """torch's area_pixel_compute_scale (or compute_scales_value when align_corners is None)."""
    cast = (lambda v: v) if dtype is torch.float64 else _f32
    if align_corners:
        return cast((in_size - 1) / (out_size - 1)) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return cast(1.0 / scale)
    return cast(cast(float(in_size)) / out_size)


def _index_f(n, dtype, device):
    return convert(prims.iota(n, 0, 1, torch.int64, device), dtype)


def _nearest_index(in_size, out_size, scale, exact, device):
    if out_size == in_size and not exact:
        return prims.iota(out_size, 0, 1, torch.int64, device)
    s = _scale(in_size, out_size, None, scale, torch.float32)
    pos = _index_f(out_size, torch.float32, device)
    if exact:
        pos = prims.add(pos, 0.5)
    src = convert(prims.floor(prims.mul(pos, s)), torch.int64)
    return prims.minimum(src, in_size - 1)


def _linear_taps(in_size, out_size, align_corners, scale, dtype, device):
    """[(index, weight)] for linear interpolation along one dim."""
    s = _scale(in_size, out_size, align_corners, scale, dtype)
    pos = _index_f(out_size, dtype, device)
    if align_corners:
        src = prims.mul(pos, s)
    else:
        src = prims.maximum(prims.sub(prims.mul(prims.add(pos, 0.5), s), 0.5), 0.0)
    i0 = prims.minimum(convert(src, torch.int64), in_size - 1)  # src >= 0: truncation is floor
    lam1 = prims.minimum(prims.maximum(prims.sub(src, convert(i0, dtype)), 0.0), 1.0)
    i1 = prims.minimum(prims.add(i0, 1), in_size - 1)
    return [(i0, prims.sub(1.0, lam1)), (i1, lam1)]


_A = -0.75


def _cubic_taps(in_size, out_size, align_corners, scale, dtype, device):
    s = _scale(in_size, out_size, align_corners, scale, dtype)
    pos = _index_f(out_size, dtype, device)
    src = prims.mul(pos, s) if align_corners else prims.sub(prims.mul(prims.add(pos, 0.5), s), 0.5)
    f = prims.floor(src)
    t = prims.sub(src, f)
    i0 = convert(f, torch.int64)

    def near(x):  # |x| <= 1
        return prims.add(prims.mul(prims.mul(prims.sub(prims.mul(x, _A + 2), _A + 3), x), x), 1.0)

    def far(x):  # 1 < |x| < 2
        inner = prims.add(prims.mul(prims.sub(prims.mul(x, _A), 5 * _A), x), 8 * _A)
        return prims.sub(prims.mul(inner, x), 4 * _A)

    weights = [far(prims.add(t, 1.0)), near(t), near(prims.sub(1.0, t)), far(prims.sub(2.0, t))]
    taps = []
    for k, w in zip(range(-1, 3), weights):
        idx = prims.minimum(prims.maximum(prims.add(i0, k), 0), in_size - 1)
        taps.append((idx, w))
    return taps


def _taps(mode, in_size, out_size, align_corners, scale, dtype, device):
    if mode in ("nearest", "nearest-exact"):
        return [(_nearest_index(in_size, out_size, scale, mode == "nearest-exact", device), None)]
    if mode == "linear":
        return _linear_taps(in_size, out_size, align_corners, scale, dtype, device)
    return _cubic_taps(in_size, out_size, align_corners, scale, dtype, device)


def _interpolate(x, mode, out_sizes, align_corners, scales):
    nsp = len(out_sizes)
    compute = utils.opmath_dtype(x.dtype) if x.dtype.is_floating_point else x.dtype
    out = convert(x, compute) if mode != "nearest" and mode != "nearest-exact" else x
    # Last dim first, so the weights nest as torch's kernels do (outer dims applied last).
    for i in reversed(range(nsp)):
        dim = x.ndim - nsp + i
        taps = _taps(mode, x.shape[dim], out_sizes[i], align_corners, scales[i], compute, x.device)
        total = None
        for idx, w in taps:
            picked = aten.index_select(out, dim, idx)
            if w is not None:
                picked = prims.mul(picked, prims.broadcast_in_dim(w, tuple(picked.shape), (dim,)))
            total = picked if total is None else prims.add(total, picked)
        out = total
    return convert(out, x.dtype)


def _interpolate_backward(grad, mode, input_size, align_corners, scales):
    nsp = grad.ndim - 2
    compute = utils.opmath_dtype(grad.dtype)
    g = convert(grad, compute)
    for i in range(nsp):
        dim = 2 + i
        n_in, n_out = input_size[dim], g.shape[dim]
        taps = _taps(mode, n_in, n_out, align_corners, scales[i], compute, grad.device)
        shape = tuple(g.shape[:dim]) + (n_in,) + tuple(g.shape[dim + 1 :])
        total = prims.full(shape, 0, compute, grad.device)
        for idx, w in taps:
            part = (
                g if w is None else prims.mul(g, prims.broadcast_in_dim(w, tuple(g.shape), (dim,)))
            )
            total = aten.index_add(total, dim, idx, part)
        g = total
    return convert(g, grad.dtype)


def _vec_sizes(input, output_size, scale_factors, nsp):
    if output_size is not None:
        return list(output_size), [None] * nsp
    sizes = [int(input.shape[2 + i] * scale_factors[i]) for i in range(nsp)]
    return sizes, list(scale_factors)


def _register(mode, nsp, op, op_vec, op_bwd, has_align):
    if has_align:

        def fwd(self, output_size, align_corners, *scales):
            return _interpolate(self, mode, list(output_size), align_corners, _pad(scales, nsp))

        def vec(input, output_size, align_corners, scale_factors):
            sizes, scales = _vec_sizes(input, output_size, scale_factors, nsp)
            return _interpolate(input, mode, sizes, align_corners, scales)

        def bwd(grad_output, output_size, input_size, align_corners, *scales):
            return _interpolate_backward(
                grad_output, mode, list(input_size), align_corners, _pad(scales, nsp)
            )

    else:

        def fwd(self, output_size, *scales):
            return _interpolate(self, mode, list(output_size), None, _pad(scales, nsp))

        def vec(input, output_size, scale_factors):
            sizes, scales = _vec_sizes(input, output_size, scale_factors, nsp)
            return _interpolate(input, mode, sizes, None, scales)

        def bwd(grad_output, output_size, input_size, *scales):
            return _interpolate_backward(
                grad_output, mode, list(input_size), None, _pad(scales, nsp)
            )

    DECOMP = register_decomposition
    DECOMP(op.default)(fwd)
    if op_vec is not None:
        DECOMP(op_vec)(vec)
    if op_bwd is not None:
        DECOMP(op_bwd.default)(bwd)


def _pad(scales, n):
    scales = list(scales) + [None] * n
    return scales[:n]


for _mode, _n, _name, _align in (
    ("nearest", 1, "upsample_nearest1d", False),
    ("nearest", 2, "upsample_nearest2d", False),
    ("nearest", 3, "upsample_nearest3d", False),
    ("nearest-exact", 1, "_upsample_nearest_exact1d", False),
    ("nearest-exact", 2, "_upsample_nearest_exact2d", False),
    ("nearest-exact", 3, "_upsample_nearest_exact3d", False),
    ("linear", 1, "upsample_linear1d", True),
    ("linear", 2, "upsample_bilinear2d", True),
    ("linear", 3, "upsample_trilinear3d", True),
    ("cubic", 2, "upsample_bicubic2d", True),
):
    _op = getattr(torch.ops.aten, _name)
    _register(
        _mode,
        _n,
        _op,
        getattr(_op, "vec", None),
        getattr(torch.ops.aten, _name + "_backward", None),
        _align,
    )
