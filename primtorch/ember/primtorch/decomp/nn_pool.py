"""Pooling and upsampling (forward and backward), as windows of strided slices and index maps."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert
from ._registry import register_decomposition
from .conv import window_view


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


def _padded(x, nsp, kernel, stride, padding, dilation, out_sizes, value):
    """x padded with `value` so that every output position's window lies inside it (the high side
    may be cropped: negative padding)."""
    lead = x.ndim - nsp
    low = [0] * lead + list(padding)
    high = [0] * lead
    for i in range(nsp):
        need = (out_sizes[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        high.append(need - x.shape[lead + i] - padding[i])
    return prims.pad(x, value, tuple(low), tuple(high), (0,) * x.ndim)


def _offset_slice(xp, nsp, offsets, stride, dilation, out_sizes):
    """The strided view of padded `xp` that kernel offset `offsets` reads: (..., *out_sizes)."""
    lead = xp.ndim - nsp
    start = [0] * lead + [o * d for o, d in zip(offsets, dilation)]
    limit = list(xp.shape[:lead]) + [
        st + (o - 1) * s + 1 for st, o, s in zip(start[lead:], out_sizes, stride)
    ]
    steps = [1] * lead + list(stride)
    return prims.slice(xp, tuple(start), tuple(limit), tuple(steps))


def _windows(x, nsp, kernel, stride, padding, dilation, out_sizes, value):
    """x padded with `value`, then every kernel offset's strided slice stacked on a new last dim:
    shape (..., *out_sizes, prod(kernel))."""
    xp = _padded(x, nsp, kernel, stride, padding, dilation, out_sizes, value)
    slices = [
        prims.expand_dims(_offset_slice(xp, nsp, offsets, stride, dilation, out_sizes), (x.ndim,))
        for offsets in _offsets(kernel)
    ]
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


# Windows (and, backward, windows covering one input element) up to this many elements become a
# chain of pointwise ops over strided views, which inductor fuses into one kernel; larger ones keep
# the stacked-window reduction (forward) or the scatter (backward). 27 takes in 3x3x3.
_MAX_CHAIN = 27


def _pool_params(nsp, kernel_size, stride, padding, dilation):
    kernel = _tuple(kernel_size, nsp)
    stride = _tuple(stride, nsp) if stride else kernel
    return kernel, stride, _tuple(padding, nsp), _tuple(dilation, nsp)


def _max_pool(self, nsp, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_params(nsp, kernel_size, stride, padding, dilation)
    in_sizes = list(self.shape[-nsp:])
    out_sizes = [
        _pool_out_size(n, k, s, p, d, ceil_mode)
        for n, k, s, p, d in zip(in_sizes, kernel, stride, padding, dilation)
    ]
    if math.prod(kernel) <= _MAX_CHAIN:
        return _max_pool_chain(self, nsp, kernel, stride, padding, dilation, in_sizes, out_sizes)
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


def _spatial(t, shape, nsp, i):
    """A 1-d tensor along spatial dim i broadcast to `shape` (..., *spatial)."""
    return prims.broadcast_in_dim(t, tuple(shape), (len(shape) - nsp + i,))


def _offset_index(shape, offsets, in_sizes, stride, padding, dilation, device):
    """(the flat input index that kernel offset `offsets` reads at each output position, whether
    it lies inside the input: a bool tensor, or None when it always does), both of `shape`.

    Index math is done on broadcast iotas, not broadcast after: inductor would compute a broadcast
    of index math into a buffer (its rule for per-row statistics)."""
    nsp = len(in_sizes)
    out_sizes = shape[len(shape) - nsp :]
    flat = inside = None
    for i, (o, n, s, p, d) in enumerate(zip(offsets, in_sizes, stride, padding, dilation)):
        first = o * d - p  # the input coordinate read at output position 0
        sf = math.prod(in_sizes[i + 1 :])
        term = _spatial(_iota(out_sizes[i], device, first * sf, s * sf), shape, nsp, i)
        flat = term if flat is None else prims.add(flat, term)
        coord = _spatial(_iota(out_sizes[i], device, first, s), shape, nsp, i)
        ok = None
        if first < 0:
            ok = prims.ge(coord, 0)
        if first + (out_sizes[i] - 1) * s >= n:
            high = prims.lt(coord, n)
            ok = high if ok is None else prims.logical_and(ok, high)
        if ok is not None:
            inside = ok if inside is None else prims.logical_and(inside, ok)
    return flat, inside


def _max_pool_chain(x, nsp, kernel, stride, padding, dilation, in_sizes, out_sizes):
    """torch's max-pool loop unrolled over kernel offsets: every step is pointwise over the output.

    Like torch's kernels: an element replaces the running max when it is greater or NaN (so ties
    keep the first, NaNs the last), padding is never picked, and the index starts at the window's
    first element inside the input. Values never read the index chain, so dead-code removal
    drops it when only values are used."""
    shape = tuple(x.shape[: x.ndim - nsp]) + tuple(out_sizes)
    xp = _padded(x, nsp, kernel, stride, padding, dilation, out_sizes, _lowest(x.dtype))
    best = idx = None
    found = None  # bool tensor: an earlier offset lay inside the input; True when always so
    for offsets in _offsets(kernel):
        v = _offset_slice(xp, nsp, offsets, stride, dilation, out_sizes)
        flat, inside = _offset_index(shape, offsets, in_sizes, stride, padding, dilation, x.device)
        if best is None:
            best = v
            idx = flat if inside is None else prims.where(inside, flat, -1)
            found = True if inside is None else inside
            continue
        better = prims.gt(v, best)
        if x.dtype.is_floating_point:
            better = prims.logical_or(better, prims.isnan(v))
        take = better
        if found is not True:
            first_inside = prims.logical_not(found)
            if inside is not None:
                first_inside = prims.logical_and(inside, first_inside)
            take = prims.logical_or(better, first_inside)
            found = True if inside is None else prims.logical_or(found, inside)
        best = prims.where(better, v, best)
        idx = prims.where(take, flat, idx)
    return best, idx


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


def _covering_windows(shape, nsp, i, window, count, n_out, device):
    """Along spatial dim i, for each input coordinate c, the `count` output coordinates whose
    windows can cover c, ascending: [(the coordinate clamped into range, of the spatial sizes;
    whether it is in range, of `shape`)].

    The first window that can cover c starts at ceil((c + p - (k-1)d) / s). Index tensors span the
    spatial dims only (prims.index keeps the leading ones); the index math is done on broadcast
    iotas, as in the forward."""
    k, s, p, d = window
    n_in = shape[len(shape) - nsp + i]
    low = p - (k - 1) * d
    lift = max(0, -((low + s - 1) // s))  # keeps the floor division's operand >= 0
    per = []
    for sizes in (tuple(shape[len(shape) - nsp :]), tuple(shape)):
        base = _spatial(_iota(n_in, device, low + s - 1 + lift * s, 1), sizes, nsp, i)
        if s > 1:
            base = prims.floor_div(base, s)
        per.append(prims.sub(base, lift) if lift else base)
    out = []
    for j in range(count):
        o_idx, o_full = (prims.add(b, j) if j else b for b in per)
        ok = prims.logical_and(prims.ge(o_full, 0), prims.lt(o_full, n_out))
        out.append((prims.minimum(prims.maximum(o_idx, 0), n_out - 1), ok))
    return out


def _max_pool_backward(grad_output, self, nsp, kernel_size, stride, padding, dilation, indices):
    """Pointwise over the input: each element sums, in output order (as torch's loop adds them),
    the gradients of the few windows that can cover it and picked it. Falls back to a scatter when
    many windows overlap."""
    kernel, stride, padding, dilation = _pool_params(nsp, kernel_size, stride, padding, dilation)
    # Windows covering one input coordinate along dim i: start in [c + p - (k-1)d, c + p], step s.
    reach = [((k - 1) * d) // s + 1 for k, d, s in zip(kernel, dilation, stride)]
    if math.prod(reach) > _MAX_CHAIN:
        return _scatter_back(grad_output, self, indices, nsp)
    lead = self.ndim - nsp
    shape = tuple(self.shape)
    in_sizes, out_sizes = list(shape[lead:]), list(grad_output.shape[lead:])
    device = self.device
    here = None  # each input element's flat spatial index
    for i in range(nsp):
        term = _spatial(_iota(in_sizes[i], device, 0, math.prod(in_sizes[i + 1 :])), shape, nsp, i)
        here = term if here is None else prims.add(here, term)
    windows = list(zip(kernel, stride, padding, dilation))
    cands = [
        _covering_windows(shape, nsp, i, windows[i], reach[i], out_sizes[i], device)
        for i in range(nsp)
    ]
    g = _opmath(grad_output)
    total = None
    for combo in _offsets(reach):
        where_ = [None] * lead + [cands[i][j][0] for i, j in enumerate(combo)]
        ok = None
        for i, j in enumerate(combo):
            ok = cands[i][j][1] if ok is None else prims.logical_and(ok, cands[i][j][1])
        picked = prims.eq(prims.index(indices, where_), here)
        term = prims.where(prims.logical_and(ok, picked), prims.index(g, where_), 0.0)
        total = term if total is None else prims.add(total, term)
    return convert(total, grad_output.dtype)


@register_decomposition(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, 2, kernel_size, stride, padding, dilation, indices)


@register_decomposition(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, 3, kernel_size, stride, padding, dilation, indices)


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


def _avg_divisor(shape, in_sizes, kernel, stride, padding, count_include_pad, device):
    """Each output position's divisor (int64, of the output's `shape`), from broadcast iotas so
    that inductor inlines it rather than computing it into a buffer."""
    nsp = len(in_sizes)
    total = None
    for i in range(nsp):
        n, k, s, p = in_sizes[i], kernel[i], stride[i], padding[i]
        start = _spatial(_iota(shape[len(shape) - nsp + i], device, -p, s), shape, nsp, i)
        end = prims.minimum(prims.add(start, k), n + p)
        if count_include_pad:
            size = prims.sub(end, start)
        else:
            size = prims.sub(prims.minimum(end, n), prims.maximum(start, 0))
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
    zero = 0.0 if floating else 0
    ones = (1,) * nsp
    if math.prod(kernel) <= _MAX_CHAIN:
        # A sum of strided views, in torch's window order: pointwise, so it fuses into one kernel.
        xp = _padded(x, nsp, kernel, stride, padding, ones, out_sizes, zero)
        total = None
        for offsets in _offsets(kernel):
            v = _offset_slice(xp, nsp, offsets, stride, ones, out_sizes)
            total = v if total is None else prims.add(total, v)
    else:
        win = _windows(x, nsp, kernel, stride, padding, ones, out_sizes, zero)
        total = prims.sum(win, (win.ndim - 1,))
    # Integer inputs divide with truncation, as torch's integer kernels do.
    divide = prims.div if floating else prims.trunc_div
    if divisor_override:
        out = divide(total, float(divisor_override) if floating else int(divisor_override))
    else:
        div = _avg_divisor(
            tuple(total.shape), in_sizes, kernel, stride, padding, count_include_pad, self.device
        )
        out = divide(total, convert(div, x.dtype))
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
            tuple(g.shape), in_sizes, kernel, stride, padding, count_include_pad, self.device
        )
        g = prims.div(g, convert(div, g.dtype))
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
    """The column matrix (N, C*K, L) as one copy out of a strided view of the padded input:
    the windows stacked by a concatenation of K shifted slices made every element test all K
    (a chain of K masked loads: ConvBERT's 9-tap unfold ran 6x slower than a copy)."""
    batched = self.ndim == 4
    x = self if batched else prims.expand_dims(self, (0,))
    kernel, dilation = _tuple(kernel_size, 2), _tuple(dilation, 2)
    padding, stride = _tuple(padding, 2), _tuple(stride, 2)
    out_sizes = [
        _pool_out_size(n, k, s, p, d, False)
        for n, k, s, p, d in zip(x.shape[2:], kernel, stride, padding, dilation)
    ]
    win = window_view(x, kernel, stride, padding, dilation, out_sizes)  # (N, C, KH, KW, OH, OW)
    n, c = x.shape[0], x.shape[1]
    out = prims.reshape(win, (n, c * math.prod(kernel), out_sizes[0] * out_sizes[1]))
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
