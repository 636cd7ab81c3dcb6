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
    shape = tuple(out_sizes) + (math.prod(kernel),)
    total = None
    for i in range(nsp):
        pos = _iota(out_sizes[i], device, -padding[i], stride[i])  # window starts
        pos = prims.broadcast_in_dim(pos, shape, (i,))
        offs = [o[i] * dilation[i] for o in _offsets(kernel)]
        off = prims.broadcast_in_dim(_offset_tensor(offs, device), shape, (nsp,))
        coord = prims.add(pos, off)
        stride_flat = math.prod(in_sizes[i + 1 :])
        term = prims.mul(coord, stride_flat) if stride_flat != 1 else coord
        total = term if total is None else prims.add(total, term)
    return total


def _offset_tensor(values, device):
    # Kernel offsets are small static lists: build them from iota arithmetic when regular.
    n = len(values)
    if n == 1:
        return prims.full((1,), values[0], torch.int64, device)
    pieces = [prims.full((1,), v, torch.int64, device) for v in values]
    return prims.cat(pieces, 0)


def _max_pool(self, nsp, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    padding, dilation = _tuple(padding, nsp), _tuple(dilation, nsp)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = [_pool_out_size(n, k, s, p, d, ceil_mode)
                 for n, k, s, p, d in zip(in_sizes, kernel, stride, padding, dilation)]  # fmt: skip
    win = _windows(self, nsp, kernel, stride, padding, dilation, out_sizes, _lowest(self.dtype))
    last = win.ndim - 1
    values = prims.amax(win, (last,))
    which = prims.argmax(win, last)
    flat = _flat_input_index(nsp, in_sizes, out_sizes, kernel, stride, padding, dilation, self.device)
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
    g = prims.reshape(g, lead + (-1,))
    idx = prims.reshape(indices, lead + (-1,))
    zeros = prims.full(lead + (n_in,), 0, g.dtype, g.device)
    out = prims.scatter_add(zeros, len(lead), idx, g)
    return convert(prims.reshape(out, tuple(self.shape)), grad_output.dtype)


@register_decomposition(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):  # fmt: skip
    return _scatter_back(grad_output, self, indices, 2)


@register_decomposition(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):  # fmt: skip
    return _scatter_back(grad_output, self, indices, 3)


@register_decomposition(aten.max_unpool2d)
def max_unpool2d(self, indices, output_size):
    lead = tuple(self.shape[: self.ndim - 2])
    n_out = math.prod(output_size)
    zeros = prims.full(lead + (n_out,), 0, self.dtype, self.device)
    src = prims.reshape(self, lead + (-1,))
    idx = prims.reshape(indices, lead + (-1,))
    out = prims.scatter(zeros, len(lead), idx, src)
    return prims.reshape(out, lead + tuple(output_size))


@register_decomposition(aten.max_unpool3d)
def max_unpool3d(self, indices, output_size, stride, padding):
    lead = tuple(self.shape[: self.ndim - 3])
    n_out = math.prod(output_size)
    zeros = prims.full(lead + (n_out,), 0, self.dtype, self.device)
    src = prims.reshape(self, lead + (-1,))
    idx = prims.reshape(indices, lead + (-1,))
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


def _avg_pool(self, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    padding = _tuple(padding, nsp)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = [_pool_out_size(n, k, s, p, 1, ceil_mode)
                 for n, k, s, p in zip(in_sizes, kernel, stride, padding)]  # fmt: skip
    x = _opmath(self)
    win = _windows(x, nsp, kernel, stride, padding, (1,) * nsp, out_sizes, 0.0)
    total = prims.sum(win, (win.ndim - 1,))
    if divisor_override:
        out = prims.div(total, float(divisor_override))
    else:
        div = _avg_divisor(nsp, in_sizes, out_sizes, kernel, stride, padding, count_include_pad,
                           self.device)  # fmt: skip
        lead = tuple(range(self.ndim - nsp))
        div = prims.broadcast_in_dim(convert(div, x.dtype), tuple(total.shape),
                                     tuple(range(len(lead), total.ndim)))  # fmt: skip
        out = prims.div(total, div)
    return convert(out, self.dtype), (kernel, stride, padding, in_sizes, out_sizes)


@register_decomposition(aten.avg_pool2d)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    if self.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"avg_pool2d does not take {self.dtype}")
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)[0]  # fmt: skip


@register_decomposition(aten.avg_pool3d)
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)[0]  # fmt: skip


def _avg_pool_backward(grad_output, self, nsp, kernel_size, stride, padding, ceil_mode,
                       count_include_pad, divisor_override):  # fmt: skip
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
        div = _avg_divisor(nsp, in_sizes, out_sizes, kernel, stride, padding, count_include_pad,
                           self.device)  # fmt: skip
        div = prims.broadcast_in_dim(convert(div, g.dtype), tuple(g.shape), tuple(range(lead, g.ndim)))
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
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):  # fmt: skip
    return _avg_pool_backward(grad_output, self, 2, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)  # fmt: skip


@register_decomposition(aten.avg_pool3d_backward)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):  # fmt: skip
    return _avg_pool_backward(grad_output, self, 3, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)  # fmt: skip


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
        per = prims.broadcast_in_dim(per, shape, tuple(d for d in range(len(shape)) if d != dim + 1))
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
