"""Pooling and upsampling (forward and backward), as windows of strided slices and index maps."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert
from ._registry import register_decomposition


def _tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _opmath(x):
    return convert(x, utils.opmath_dtype(x.dtype))


def _lowest(dtype):
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _flatten_tail(t, keep):
    """t with its dims after the first `keep` merged (explicit sizes: no -1 to infer when empty)."""
    lead = tuple(t.shape[:keep])
    return prims.reshape(t, lead + (math.prod(t.shape[keep:]),))


def _iota(n, device, start=0, step=1):
    return prims.iota(n, start, step, torch.int64, device)


# --- windows -------------------------------------------------------------------------------------


def _pool_out_size(size, k, s, p, d, ceil_mode):
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or its left padding
    return max(out, 0)


def _windows(x, nsp, kernel, stride, padding, dilation, out_sizes, value):
    """x padded with `value`, then every kernel offset's strided slice stacked on a new last dim:
    shape (..., *out_sizes, prod(kernel))."""
    lead = x.ndim - nsp
    low = [0] * lead + list(padding)
    high = [0] * lead
    for i in range(nsp):
        need = (out_sizes[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        high.append(need - x.shape[lead + i] - padding[i])
    xp = prims.pad(x, value, tuple(low), tuple(high), (0,) * x.ndim)
    slices = []
    for offsets in _offsets(kernel):
        start = [0] * lead + [o * d for o, d in zip(offsets, dilation)]
        limit = list(xp.shape[:lead]) + [
            st + (o - 1) * s + 1 for st, o, s in zip(start[lead:], out_sizes, stride)
        ]
        steps = [1] * lead + list(stride)
        piece = prims.slice(xp, tuple(start), tuple(limit), tuple(steps))
        slices.append(prims.expand_dims(piece, (x.ndim,)))
    return prims.cat(slices, x.ndim)


def _offsets(kernel):
    out = [()]
    for k in kernel:
        out = [o + (i,) for o in out for i in range(k)]
    return out


def _flat_input_index(nsp, in_sizes, out_sizes, kernel, stride, padding, dilation, device):
    """For each output position and kernel offset, the flat index into the spatial input."""
    k_total = math.prod(kernel)
    shape = tuple(out_sizes) + (k_total,)
    k = _iota(k_total, device)
    total = None
    for i in range(nsp):
        pos = _iota(out_sizes[i], device, -padding[i], stride[i])  # window starts
        pos = prims.broadcast_in_dim(pos, shape, (i,))
        # Kernel offset along dim i of flat kernel position k (row-major over the kernel dims).
        inner = math.prod(kernel[i + 1 :])
        off = (
            prims.remainder(prims.floor_div(k, inner), kernel[i])
            if inner > 1
            else prims.remainder(k, kernel[i])
        )
        off = prims.broadcast_in_dim(prims.mul(off, dilation[i]), shape, (nsp,))
        coord = prims.add(pos, off)
        stride_flat = math.prod(in_sizes[i + 1 :])
        term = prims.mul(coord, stride_flat) if stride_flat != 1 else coord
        total = term if total is None else prims.add(total, term)
    return total


def _max_pool(self, nsp, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    padding, dilation = _tuple(padding, nsp), _tuple(dilation, nsp)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = [
        _pool_out_size(n, k, s, p, d, ceil_mode)
        for n, k, s, p, d in zip(in_sizes, kernel, stride, padding, dilation)
    ]
    win = _windows(self, nsp, kernel, stride, padding, dilation, out_sizes, _lowest(self.dtype))
    last = win.ndim - 1
    values = prims.amax(win, (last,))
    which = prims.argmax(win, last)
    flat = _flat_input_index(
        nsp, in_sizes, out_sizes, kernel, stride, padding, dilation, self.device
    )
    flat = utils.broadcast_to(flat, tuple(win.shape))
    picked = prims.gather(flat, last, prims.expand_dims(which, (last,)))
    return values, prims.squeeze(picked, (last,))


@register_decomposition(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@register_decomposition(aten.max_pool3d_with_indices)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _scatter_back(grad_output, self, indices, nsp):
    """Sum each output gradient into the input position its index names."""
    lead = tuple(self.shape[: self.ndim - nsp])
    n_in = math.prod(self.shape[self.ndim - nsp :])
    g = _opmath(grad_output)
    g = _flatten_tail(g, len(lead))
    idx = _flatten_tail(indices, len(lead))
    zeros = prims.full(lead + (n_in,), 0, g.dtype, g.device)
    out = prims.scatter_add(zeros, len(lead), idx, g)
    return convert(prims.reshape(out, tuple(self.shape)), grad_output.dtype)


@register_decomposition(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_back(grad_output, self, indices, 2)


@register_decomposition(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_back(grad_output, self, indices, 3)


@register_decomposition(aten.max_unpool2d)
def max_unpool2d(self, indices, output_size):
    lead = tuple(self.shape[: self.ndim - 2])
    n_out = math.prod(output_size)
    zeros = prims.full(lead + (n_out,), 0, self.dtype, self.device)
    src = _flatten_tail(self, len(lead))
    idx = _flatten_tail(indices, len(lead))
    out = prims.scatter(zeros, len(lead), idx, src)
    return prims.reshape(out, lead + tuple(output_size))


@register_decomposition(aten.max_unpool3d)
def max_unpool3d(self, indices, output_size, stride, padding):
    lead = tuple(self.shape[: self.ndim - 3])
    n_out = math.prod(output_size)
    zeros = prims.full(lead + (n_out,), 0, self.dtype, self.device)
    src = _flatten_tail(self, len(lead))
    idx = _flatten_tail(indices, len(lead))
    out = prims.scatter(zeros, len(lead), idx, src)
    return prims.reshape(out, lead + tuple(output_size))


# --- average pooling -----------------------------------------------------------------------------


def _avg_divisor(nsp, in_sizes, out_sizes, kernel, stride, padding, count_include_pad, device):
    """Per-output-position divisor (float64 tensor of shape out_sizes)."""
    total = None
    for i in range(nsp):
        n, k, s, p = in_sizes[i], kernel[i], stride[i], padding[i]
        start = _iota(out_sizes[i], device, -p, s)
        end = prims.minimum(prims.add(start, k), n + p)
        if count_include_pad:
            size = prims.sub(end, start)
        else:
            size = prims.sub(prims.minimum(end, n), prims.maximum(start, 0))
        size = prims.broadcast_in_dim(size, tuple(out_sizes), (i,))
        total = size if total is None else prims.mul(total, size)
    return total


def _avg_pool(
    self, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    padding = _tuple(padding, nsp)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = [
        _pool_out_size(n, k, s, p, 1, ceil_mode)
        for n, k, s, p in zip(in_sizes, kernel, stride, padding)
    ]
    floating = self.dtype.is_floating_point
    x = _opmath(self) if floating else convert(self, torch.int64)
    win = _windows(x, nsp, kernel, stride, padding, (1,) * nsp, out_sizes, 0.0 if floating else 0)
    total = prims.sum(win, (win.ndim - 1,))
    # Integer inputs divide with truncation, as torch's integer kernels do.
    divide = prims.div if floating else prims.trunc_div
    if divisor_override:
        out = divide(total, float(divisor_override) if floating else int(divisor_override))
    else:
        div = _avg_divisor(
            nsp, in_sizes, out_sizes, kernel, stride, padding, count_include_pad, self.device
        )
        lead = tuple(range(self.ndim - nsp))
        div = prims.broadcast_in_dim(
            convert(div, x.dtype), tuple(total.shape), tuple(range(len(lead), total.ndim))
        )
        out = divide(total, div)
    return convert(out, self.dtype), (kernel, stride, padding, in_sizes, out_sizes)


@register_decomposition(aten.avg_pool2d)
def avg_pool2d(
    self,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )[0]


@register_decomposition(aten.avg_pool3d)
def avg_pool3d(
    self,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )[0]


def _avg_pool_backward(
    grad_output,
    self,
    nsp,
    kernel_size,
    stride,
    padding,
    ceil_mode,
    count_include_pad,
    divisor_override,
):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    padding = _tuple(padding, nsp)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = list(grad_output.shape[-nsp:])
    g = _opmath(grad_output)
    lead = self.ndim - nsp
    if divisor_override:
        g = prims.div(g, float(divisor_override))
    else:
        div = _avg_divisor(
            nsp, in_sizes, out_sizes, kernel, stride, padding, count_include_pad, self.device
        )
        div = prims.broadcast_in_dim(
            convert(div, g.dtype), tuple(g.shape), tuple(range(lead, g.ndim))
        )
        g = prims.div(g, div)
    # Each kernel offset sends g to the padded input at offset + stride * o: an interior pad.
    padded = [n + 2 * p for n, p in zip(in_sizes, padding)]
    total = None
    for offsets in _offsets(kernel):
        low = [0] * lead + list(offsets)
        high = [0] * lead + [
            pn - (o + (m - 1) * s + 1) for pn, o, m, s in zip(padded, offsets, out_sizes, stride)
        ]
        interior = [0] * lead + [s - 1 for s in stride]
        piece = prims.pad(g, 0.0, tuple(low), tuple(high), tuple(interior))
        total = piece if total is None else prims.add(total, piece)
    start = [0] * lead + list(padding)
    limit = list(total.shape[:lead]) + [p + n for p, n in zip(padding, in_sizes)]
    out = prims.slice(total, tuple(start), tuple(limit))
    return convert(out, grad_output.dtype)


@register_decomposition(aten.avg_pool2d_backward)
def avg_pool2d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _avg_pool_backward(
        grad_output,
        self,
        2,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    )


@register_decomposition(aten.avg_pool3d_backward)
def avg_pool3d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _avg_pool_backward(
        grad_output,
        self,
        3,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    )


# --- adaptive pooling ----------------------------------------------------------------------------


def _adaptive_bins(n, m, device):
    """(index (m, K), mask (m, K), counts (m,)) of the input positions in each adaptive bin."""
    starts = [(i * n) // m for i in range(m)]
    ends = [-((-(i + 1) * n) // m) for i in range(m)]
    k = max((e - s for s, e in zip(starts, ends)), default=1)
    start = _bins_tensor(starts, device)
    length = _bins_tensor([e - s for s, e in zip(starts, ends)], device)
    off = prims.broadcast_in_dim(_iota(k, device), (m, k), (1,))
    start_b = prims.broadcast_in_dim(start, (m, k), (0,))
    mask = prims.lt(off, prims.broadcast_in_dim(length, (m, k), (0,)))
    index = prims.minimum(prims.add(start_b, off), n - 1)
    return index, mask, length, k


def _bins_tensor(values, device):
    return prims.cat([prims.full((1,), v, torch.int64, device) for v in values], 0)


def _adaptive_gather(x, dim, n_out, value):
    """x with `dim` (size n) replaced by (n_out, K) window entries; masked entries are `value`."""
    n = x.shape[dim]
    index, mask, length, k = _adaptive_bins(n, n_out, x.device)
    flat = prims.reshape(index, (n_out * k,))
    picked = aten.index_select(x, dim, flat)
    shape = tuple(x.shape[:dim]) + (n_out, k) + tuple(x.shape[dim + 1 :])
    picked = prims.reshape(picked, shape)
    mask_b = prims.broadcast_in_dim(mask, shape, (dim, dim + 1))
    return prims.where(mask_b, picked, value), length, index


@register_decomposition(aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d)
def adaptive_avg_pool(self, output_size):
    nsp = len(output_size)
    x = _opmath(self)
    for i, m in enumerate(output_size):
        dim = self.ndim - nsp + i
        picked, length, _ = _adaptive_gather(x, dim, m, 0.0)
        total = prims.sum(picked, (dim + 1,))
        counts = prims.broadcast_in_dim(convert(length, x.dtype), tuple(total.shape), (dim,))
        x = prims.div(total, counts)
    return convert(x, self.dtype)


@register_decomposition(aten._adaptive_avg_pool2d_backward)
def adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 2)


@register_decomposition(aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 3)


def _adaptive_avg_backward(grad_output, self, nsp):
    g = _opmath(grad_output)
    for i in reversed(range(nsp)):
        dim = self.ndim - nsp + i
        n, m = self.shape[dim], g.shape[dim]
        index, mask, length, k = _adaptive_bins(n, m, g.device)
        counts = prims.broadcast_in_dim(convert(length, g.dtype), tuple(g.shape), (dim,))
        per = prims.div(g, counts)
        shape = tuple(g.shape[:dim]) + (m, k) + tuple(g.shape[dim + 1 :])
        per = prims.broadcast_in_dim(
            per, shape, tuple(d for d in range(len(shape)) if d != dim + 1)
        )
        per = prims.where(prims.broadcast_in_dim(mask, shape, (dim, dim + 1)), per, 0.0)
        per = prims.reshape(per, tuple(g.shape[:dim]) + (m * k,) + tuple(g.shape[dim + 1 :]))
        zeros_shape = tuple(g.shape[:dim]) + (n,) + tuple(g.shape[dim + 1 :])
        zeros = prims.full(zeros_shape, 0, g.dtype, g.device)
        g = aten.index_add(zeros, dim, prims.reshape(index, (m * k,)), per)
    return convert(g, grad_output.dtype)


def _adaptive_max(self, output_size):
    nsp = len(output_size)
    x = self
    low = _lowest(self.dtype)
    # Gather every spatial dim's windows, then reduce all window dims at once.
    shape_in = list(self.shape[-nsp:])
    idxs = []
    for i, m in enumerate(output_size):
        dim = self.ndim - nsp + 2 * i
        x, _, index = _adaptive_gather(x, dim, m, low)
        idxs.append(index)
    lead = self.ndim - nsp
    win_dims = tuple(lead + 2 * i + 1 for i in range(nsp))
    out_dims = tuple(lead + 2 * i for i in range(nsp))
    perm = tuple(range(lead)) + out_dims + win_dims
    x = prims.permute(x, perm)
    k_total = math.prod(x.shape[lead + nsp :])
    x = prims.reshape(x, tuple(x.shape[: lead + nsp]) + (k_total,))
    last = x.ndim - 1
    values = prims.amax(x, (last,))
    which = prims.argmax(x, last)
    # The flat input index of each window entry: sum over dims of index * stride.
    ks = [ix.shape[1] for ix in idxs]
    flat_shape = tuple(output_size) + tuple(ks)
    total = None
    for i, ix in enumerate(idxs):
        stride_flat = math.prod(shape_in[i + 1 :])
        term = prims.broadcast_in_dim(prims.mul(ix, stride_flat), flat_shape, (i, nsp + i))
        total = term if total is None else prims.add(total, term)
    total = prims.reshape(total, tuple(output_size) + (k_total,))
    total = utils.broadcast_to(total, tuple(x.shape))
    picked = prims.gather(total, last, prims.expand_dims(which, (last,)))
    return values, prims.squeeze(picked, (last,))


@register_decomposition(aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@register_decomposition(aten.adaptive_max_pool2d_backward)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_back(grad_output, self, indices, 2)


@register_decomposition(aten.adaptive_max_pool3d_backward)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_back(grad_output, self, indices, 3)


# --- im2col / col2im -----------------------------------------------------------------------------


@register_decomposition(aten.im2col)
def im2col(self, kernel_size, dilation, padding, stride):
    batched = self.ndim == 4
    x = self if batched else prims.expand_dims(self, (0,))
    kernel, dilation = _tuple(kernel_size, 2), _tuple(dilation, 2)
    padding, stride = _tuple(padding, 2), _tuple(stride, 2)
    out_sizes = [
        _pool_out_size(n, k, s, p, d, False)
        for n, k, s, p, d in zip(x.shape[2:], kernel, stride, padding, dilation)
    ]
    win = _windows(x, 2, kernel, stride, padding, dilation, out_sizes, 0)  # (N, C, OH, OW, K)
    n, c = x.shape[0], x.shape[1]
    k = math.prod(kernel)
    out = prims.reshape(
        prims.permute(win, (0, 1, 4, 2, 3)), (n, c * k, out_sizes[0] * out_sizes[1])
    )
    return out if batched else prims.squeeze(out, (0,))


@register_decomposition(aten.col2im)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    batched = self.ndim == 3
    x = self if batched else prims.expand_dims(self, (0,))
    kernel, dilation = _tuple(kernel_size, 2), _tuple(dilation, 2)
    padding, stride = _tuple(padding, 2), _tuple(stride, 2)
    out_sizes = [
        _pool_out_size(n, k, s, p, d, False)
        for n, k, s, p, d in zip(output_size, kernel, stride, padding, dilation)
    ]
    n, k = x.shape[0], math.prod(kernel)
    c = x.shape[1] // k
    cols = prims.reshape(x, (n, c, k) + tuple(out_sizes))
    padded = [size + 2 * p for size, p in zip(output_size, padding)]
    total = None
    for j, offsets in enumerate(_offsets(kernel)):
        piece = prims.squeeze(prims.slice_in_dim(cols, j, j + 1, 1, 2), (2,))
        low = [0, 0] + [o * d for o, d in zip(offsets, dilation)]
        high = [0, 0] + [
            pn - (lo + (m - 1) * s + 1) for pn, lo, m, s in zip(padded, low[2:], out_sizes, stride)
        ]
        interior = [0, 0] + [s - 1 for s in stride]
        piece = prims.pad(piece, 0, tuple(low), tuple(high), tuple(interior))
        total = piece if total is None else prims.add(total, piece)
    out = prims.slice(
        total,
        (0, 0) + tuple(padding),
        (n, c) + tuple(p + size for p, size in zip(padding, output_size)),
    )
    return out if batched else prims.squeeze(out, (0,))


# --- fractional max pooling ----------------------------------------------------------------------


def _fractional_starts(u, in_size, out_size, k, compute):
    """Window starts (..., out_size) from per-plane samples u (...,): torch's generate_intervals."""
    lead = tuple(u.shape)
    shape = lead + (out_size,)
    if out_size == 1:
        return prims.full(shape, in_size - k, torch.int64, u.device)
    alpha = (in_size - k) / (out_size - 1)
    i = prims.broadcast_in_dim(convert(_iota(out_size, u.device), compute), shape, (len(lead),))
    ub = prims.broadcast_in_dim(convert(u, compute), shape, tuple(range(len(lead))))
    start = prims.sub(
        convert(prims.mul(prims.add(i, ub), alpha), torch.int64),
        convert(prims.mul(ub, alpha), torch.int64),
    )
    last = prims.eq(
        prims.broadcast_in_dim(_iota(out_size, u.device), shape, (len(lead),)), out_size - 1
    )
    return prims.where(last, in_size - k, start)


def _fractional_max_pool(self, kernel_size, output_size, random_samples, nsp):
    batched = self.ndim == nsp + 2
    x = self if batched else prims.expand_dims(self, (0,))
    kernel, out_sizes = _tuple(kernel_size, nsp), _tuple(output_size, nsp)
    n, c = x.shape[0], x.shape[1]
    in_sizes = list(x.shape[2:])
    compute = utils.opmath_dtype(self.dtype)
    lead = (n, c)
    # Flat input index of every (output position, kernel offset): (N, C, *out, *kernel).
    full_shape = lead + tuple(out_sizes) + tuple(kernel)
    total = None
    for i in range(nsp):
        # torch's 2-d kernel reads sample 0 for W, 1 for H; the 3-d one 0, 1, 2 for T, H, W.
        col = nsp - 1 - i if nsp == 2 else i
        u = prims.squeeze(prims.slice_in_dim(random_samples, col, col + 1, 1, 2), (2,))
        start = _fractional_starts(u, in_sizes[i], out_sizes[i], kernel[i], compute)
        start = prims.broadcast_in_dim(start, full_shape, (0, 1, 2 + i))
        off = prims.broadcast_in_dim(_iota(kernel[i], x.device), full_shape, (2 + nsp + i,))
        term = prims.mul(prims.add(start, off), math.prod(in_sizes[i + 1 :]))
        total = term if total is None else prims.add(total, term)
    k_total = math.prod(kernel)
    flat_idx = _flatten_tail(total, len(lead))
    picked = prims.gather(_flatten_tail(x, len(lead)), 2, flat_idx)
    picked = prims.reshape(picked, lead + tuple(out_sizes) + (k_total,))
    idx = prims.reshape(total, lead + tuple(out_sizes) + (k_total,))
    last = picked.ndim - 1
    values = prims.amax(picked, (last,))
    which = prims.argmax(picked, last)
    indices = prims.squeeze(prims.gather(idx, last, prims.expand_dims(which, (last,))), (last,))
    if not batched:
        values, indices = prims.squeeze(values, (0,)), prims.squeeze(indices, (0,))
    return values, indices


@register_decomposition(aten.fractional_max_pool2d)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 2)


@register_decomposition(aten.fractional_max_pool3d)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 3)


@register_decomposition(aten.fractional_max_pool2d_backward, aten.fractional_max_pool3d_backward)
def fractional_max_pool_backward(grad_output, self, kernel_size, output_size, indices):
    nsp = len(output_size)
    return _scatter_back(grad_output, self, indices, nsp)
