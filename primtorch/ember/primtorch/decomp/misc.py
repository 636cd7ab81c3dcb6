"""The long tail: outer products, distances, searches, order statistics, shuffles, histograms."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import (
    INT_TO_FLOAT,
    aten,
    convert,
    elementwise_dtypes,
    is_tensor,
    like,
    numel,
    result_type,
)
from ._registry import register_decomposition


def _iota(n, device, start=0, step=1):
    return prims.iota(n, start, step, torch.int64, device)


@register_decomposition(aten.addr)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    outer = aten.mul(aten.unsqueeze(vec1, 1), aten.unsqueeze(vec2, 0))
    if result_type(self, vec1, vec2) is torch.bool:
        # Booleans: beta and alpha act as truth values (and), the sum as or.
        out = outer if alpha else aten.zeros_like(outer)
        return aten.logical_or(self, out) if beta else out
    if alpha != 1:
        outer = aten.mul(outer, alpha)
    if beta == 0:
        # beta == 0 ignores self entirely (NaN and inf included), as torch does.
        return convert(outer, result_type(self, vec1, vec2))
    scaled = self if beta == 1 else aten.mul(self, beta)
    return aten.add(scaled, outer)


# Matrix-vector and vector-vector products as the matrix product they are (`matrix @ vector`
# traces to aten.mv, `vector @ vector` to aten.dot: neither had a decomposition, and the compile
# that meets them first runs at the call, where the error reached the user's program).
@register_decomposition(aten.mv)
def mv(self, vec):
    return aten.squeeze(aten.mm(self, aten.unsqueeze(vec, 1)), 1)


@register_decomposition(aten.dot)
def dot(self, tensor):
    return aten.reshape(aten.mm(aten.unsqueeze(self, 0), aten.unsqueeze(tensor, 1)), ())


@register_decomposition(aten.addmv)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    product = mv(mat, vec)
    if alpha != 1:
        product = aten.mul(product, alpha)
    if beta == 0:  # beta == 0 ignores self (NaN and inf included), as torch does
        return aten.expand(product, torch.broadcast_shapes(self.shape, product.shape))
    return aten.add(self if beta == 1 else aten.mul(self, beta), product)


@register_decomposition(aten.block_diag)
def block_diag(tensors):
    mats = [
        t if t.ndim == 2 else prims.reshape(t, (1, -1) if t.ndim == 1 else (1, 1)) for t in tensors
    ]
    dtype = result_type(*mats) if mats else torch.float32
    width = sum(m.shape[1] for m in mats)
    rows, col = [], 0
    for m in mats:
        w = m.shape[1]
        rows.append(
            prims.pad(
                convert(m, dtype),
                0 if not dtype.is_floating_point else 0.0,
                (0, col),
                (0, width - col - w),
                (0, 0),
            )
        )
        col += w
    return prims.cat(rows, 0)


@register_decomposition(aten.frexp.Tensor)
def frexp(self):
    x = self
    a = prims.abs(x)
    special = prims.bitwise_or(prims.eq(a, 0.0), prims.logical_not(prims.isfinite(x)))
    safe = prims.where(special, like(1.0, x), a)
    compute = torch.float64 if x.dtype is torch.float64 else torch.float32
    e = prims.add(prims.floor(prims.log2(convert(safe, compute))), 1.0)
    m = prims.div(convert(x, compute), prims.exp2(e))
    # log2 may be off by one near powers of two: renormalise |m| into [0.5, 1).
    big = prims.ge(prims.abs(m), 1.0)
    m = prims.where(big, prims.mul(m, 0.5), m)
    e = prims.where(big, prims.add(e, 1.0), e)
    small = prims.bitwise_and(prims.lt(prims.abs(m), 0.5), prims.logical_not(special))
    m = prims.where(small, prims.mul(m, 2.0), m)
    e = prims.where(small, prims.sub(e, 1.0), e)
    mantissa = prims.where(special, x, convert(m, x.dtype))
    exponent = prims.where(special, 0, convert(e, torch.int32))
    return mantissa, exponent


@register_decomposition(aten.ldexp.Tensor)
def ldexp(self, other):
    _, dtype = elementwise_dtypes(self, other, kind=INT_TO_FLOAT)
    return aten.mul(convert(self, dtype), aten.pow(2.0, convert(other, dtype)))


@register_decomposition(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    if not is_tensor(test_elements):
        hit = aten.eq(elements, test_elements)
    else:
        tests = aten.reshape(test_elements, (-1,))
        elems = aten.unsqueeze(elements, -1) if is_tensor(elements) else elements
        hit = (
            aten.any(aten.eq(elems, tests), -1)
            if tests.shape[0]
            else aten.zeros_like(elems if is_tensor(elems) else tests, dtype=torch.bool)
        )
        if not is_tensor(elements):
            hit = aten.any(aten.eq(tests, elements))
    return aten.logical_not(hit) if invert else hit


# --- order statistics through the sort extern ----------------------------------------------------


@register_decomposition(aten.kthvalue)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return prims.clone(self), like(0, self, torch.int64)
    dim = utils.canonicalize_dim(self.ndim, dim)
    values, indices = aten.sort.stable(self, stable=True, dim=dim)
    v, i = aten.select(values, dim, k - 1), aten.select(indices, dim, k - 1)
    if keepdim:
        v, i = aten.unsqueeze(v, dim), aten.unsqueeze(i, dim)
    return v, i


def _median_dim(self, dim, keepdim, ignore_nan):
    if self.ndim == 0:
        return prims.clone(self), like(0, self, torch.int64)
    dim = utils.canonicalize_dim(self.ndim, dim)
    values, indices = aten.sort.stable(self, stable=True, dim=dim)  # NaN sorts last
    n = self.shape[dim]
    if ignore_nan and self.dtype.is_floating_point:
        count = aten.sum(aten.logical_not(aten.isnan(self)), [dim], True)
        pos = aten.where(aten.eq(count, 0), 0, aten.floor_divide(aten.sub(count, 1), 2))
    else:
        # Any NaN makes the median NaN: the first NaN (sorted last) is then the answer.
        pos_int = (n - 1) // 2
        pos = aten.full_like(aten.select(values, dim, 0).unsqueeze(dim), pos_int, dtype=torch.int64)
        if self.dtype.is_floating_point:
            nan_count = aten.sum(aten.isnan(self), [dim], True)
            pos = aten.where(aten.gt(nan_count, 0), aten.sub(n, nan_count), pos)
    v = aten.gather(values, dim, pos)
    i = aten.gather(indices, dim, pos)
    if not keepdim:
        v, i = aten.squeeze(v, [dim]), aten.squeeze(i, [dim])
    return v, i


@register_decomposition(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, False)


@register_decomposition(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, True)


@register_decomposition(aten.median.default)
def median(self):
    return _median_dim(aten.reshape(self, (-1,)), 0, False, False)[0]


@register_decomposition(aten.nanmedian.default)
def nanmedian(self):
    return _median_dim(aten.reshape(self, (-1,)), 0, False, True)[0]


# --- scatters with reductions --------------------------------------------------------------------


@register_decomposition(aten.index_reduce)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    dim = utils.canonicalize_dim(self.ndim, dim)
    if self.ndim == 0:
        out = index_reduce(
            prims.reshape(self, (1,)),
            0,
            prims.reshape(index, (-1,)),
            prims.reshape(source, (1,)),
            reduce,
            include_self=include_self,
        )
        return prims.reshape(out, ())
    idx = prims.broadcast_in_dim(convert(index, torch.int64), tuple(source.shape), (dim,))
    return prims.scatter_reduce(self, dim, idx, convert(source, self.dtype), reduce, include_self)


@register_decomposition(aten.masked_scatter)
def masked_scatter(self, mask, source):
    shape = tuple(utils.broadcast_shapes(tuple(self.shape), tuple(mask.shape)))
    mask = aten.expand(mask, shape)
    base = aten.expand(self, shape)
    # Masked position k (in row-major order) takes source's k-th element.
    flat_mask = aten.reshape(mask, (-1,))
    pos = aten.sub(aten.cumsum(flat_mask, 0), 1)
    pos = aten.clamp(pos, 0, max(numel(source.shape) - 1, 0))
    picked = aten.index(aten.reshape(source, (-1,)), [pos])
    return aten.where(mask, aten.reshape(picked, shape), base)


@register_decomposition(aten.put)
def put(self, index, source, accumulate=False):
    flat = prims.reshape(self, (-1,))
    idx = prims.reshape(convert(index, torch.int64), (-1,))
    n = numel(self.shape)
    idx = prims.where(prims.lt(idx, 0), prims.add(idx, n), idx)
    out = prims.index_put(
        flat, [idx], prims.reshape(convert(source, self.dtype), (-1,)), accumulate
    )
    return prims.reshape(out, tuple(self.shape))


# --- geometry and distances ----------------------------------------------------------------------


@register_decomposition(aten.linalg_cross)
def linalg_cross(self, other, *, dim=-1):
    shape = tuple(int(s) for s in utils.broadcast_shapes(tuple(self.shape), tuple(other.shape)))
    a, b = aten.expand(self, shape), aten.expand(other, shape)
    dim = utils.canonicalize_dim(len(shape), dim)
    i1 = _index_list([1, 2, 0], self.device)
    i2 = _index_list([2, 0, 1], self.device)
    a1, a2 = aten.index_select(a, dim, i1), aten.index_select(a, dim, i2)
    b1, b2 = aten.index_select(b, dim, i1), aten.index_select(b, dim, i2)
    return aten.sub(aten.mul(a1, b2), aten.mul(a2, b1))


def _index_list(values, device):
    return prims.cat([prims.full((1,), v, torch.int64, device) for v in values], 0)


def _pairwise(x1, x2, p):
    diff = aten.sub(aten.unsqueeze(x1, -2), aten.unsqueeze(x2, -3))
    return aten.linalg_vector_norm(diff, p, [-1])


@register_decomposition(aten._cdist_forward)
def _cdist_forward(x1, x2, p, compute_mode=None):
    return _pairwise(x1, x2, p)


@register_decomposition(aten._euclidean_dist)
def _euclidean_dist(x1, x2):
    return _pairwise(x1, x2, 2.0)


@register_decomposition(aten._pdist_forward)
def _pdist_forward(self, p=2.0):
    n = self.shape[0]
    m = n * (n - 1) // 2
    if m == 0:
        return prims.full((0,), 0, self.dtype, self.device)
    # Row pair (i, j), i < j, of flat position k in torch's order, by the closed form.
    k = convert(_iota(m, self.device), torch.float64)
    disc = prims.sqrt(prims.add(prims.mul(k, -8.0), float(4 * n * (n - 1) - 7)))
    i = prims.sub(float(n - 2), prims.floor(prims.sub(prims.div(disc, 2.0), 0.5)))
    j = prims.add(
        prims.sub(prims.add(k, i), float(m - 1)),
        prims.div(prims.mul(prims.sub(float(n), i), prims.sub(float(n - 1), i)), 2.0),
    )
    i, j = convert(i, torch.int64), convert(j, torch.int64)
    diff = aten.sub(aten.index_select(self, 0, i), aten.index_select(self, 0, j))
    return aten.linalg_vector_norm(diff, p, [-1])


@register_decomposition(aten.dist)
def dist(self, other, p=2):
    return aten.linalg_vector_norm(aten.sub(self, other), p)


@register_decomposition(aten.trace)
def trace(self):
    return aten.sum(aten.diagonal(self))


def _other_dims(t, dim):
    """Every dim of `t` but `dim` (the dims a per-slice norm reduces)."""
    dim = utils.canonicalize_dim(t.ndim, dim)
    return [d for d in range(t.ndim) if d != dim]


@register_decomposition(aten.renorm)
def renorm(self, p, dim, maxnorm):
    compute = utils.opmath_dtype(self.dtype)
    norm = aten.linalg_vector_norm(self, p, _other_dims(self, dim), True, dtype=compute)
    factor = aten.where(aten.gt(norm, maxnorm), aten.div(maxnorm, aten.add(norm, 1e-7)), 1.0)
    return convert(aten.mul(convert(self, compute), factor), self.dtype)


# --- weight normalization (torch.nn.utils.weight_norm: w = g * v / ||v||) ------------------------


@register_decomposition(aten._weight_norm_interface)
def weight_norm_interface(v, g, dim=0):
    """(w, norm): the norm of v over every dim but `dim` (kept, in the compute dtype: float32 for
    half types, as torch's kernel returns it) and w = v * (g / norm) in v's dtype."""
    compute = utils.opmath_dtype(v.dtype)
    norm = aten.linalg_vector_norm(v, 2, _other_dims(v, dim), True, dtype=compute)
    w = aten.mul(convert(v, compute), aten.div(convert(g, compute), norm))
    return convert(w, v.dtype), norm


@register_decomposition(aten._weight_norm_interface_backward)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """d/dg = sum(grad_w * v) / norm; d/dv = (g / norm) * (grad_w - v * sum(grad_w * v) / norm^2),
    the sums over every dim but `dim`."""
    compute = utils.opmath_dtype(saved_v.dtype)
    gw, v = convert(grad_w, compute), convert(saved_v, compute)
    g, norm = convert(saved_g, compute), convert(saved_norms, compute)
    dot = aten.sum(aten.mul(gw, v), _other_dims(saved_v, dim), True)
    grad_g = aten.div(dot, norm)
    scale = aten.div(dot, aten.mul(norm, norm))
    grad_v = aten.mul(aten.div(g, norm), aten.sub(gw, aten.mul(v, scale)))
    return convert(grad_v, saved_v.dtype), convert(grad_g, saved_g.dtype)


# --- shuffles ------------------------------------------------------------------------------------


@register_decomposition(aten.pixel_shuffle)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = prims.reshape(self, tuple(lead) + (c // (r * r), r, r, h, w))
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2)
    return prims.reshape(prims.permute(x, perm), tuple(lead) + (c // (r * r), h * r, w * r))


@register_decomposition(aten.pixel_unshuffle)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    x = prims.reshape(self, tuple(lead) + (c, h // r, r, w // r, r))
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3)
    return prims.reshape(prims.permute(x, perm), tuple(lead) + (c * r * r, h // r, w // r))


@register_decomposition(aten.channel_shuffle, aten.native_channel_shuffle)
def channel_shuffle(self, groups):
    n, c = self.shape[0], self.shape[1]
    rest = tuple(self.shape[2:])
    x = prims.reshape(self, (n, groups, c // groups) + rest)
    x = prims.permute(x, (0, 2, 1) + tuple(range(3, x.ndim)))
    return prims.reshape(x, tuple(self.shape))


# --- searches and histograms ---------------------------------------------------------------------


def _count_before(seq, values, right):
    """For each value, how many entries of the sorted last dim of seq are < (<= if right) it."""
    cmp = aten.le if right else aten.lt
    if seq.ndim == 1:  # one sequence for every value
        return aten.sum(cmp(seq, aten.unsqueeze(values, -1)), [-1])
    return aten.sum(cmp(aten.unsqueeze(seq, -2), aten.unsqueeze(values, -1)), [-1])


@register_decomposition(aten.bucketize.Tensor)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    out = _count_before(boundaries, self, right)
    return convert(out, torch.int32 if out_int32 else torch.int64)


@register_decomposition(aten.bucketize.Scalar)
def bucketize_scalar(self, boundaries, *, out_int32=False, right=False):
    v = prims.full((), self, boundaries.dtype, boundaries.device)
    return aten.bucketize(v, boundaries, out_int32=out_int32, right=right)


@register_decomposition(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    seq = sorted_sequence if sorter is None else aten.gather(sorted_sequence, -1, sorter)
    out = _count_before(seq, self, right)
    return convert(out, torch.int32 if out_int32 else torch.int64)


@register_decomposition(aten.searchsorted.Scalar)
def searchsorted_scalar(
    sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None
):
    v = prims.full(
        tuple(sorted_sequence.shape[:-1]), self, sorted_sequence.dtype, sorted_sequence.device
    )
    out = aten.searchsorted(
        sorted_sequence,
        aten.unsqueeze(v, -1),
        out_int32=out_int32,
        right=right,
        side=side,
        sorter=sorter,
    )
    return aten.squeeze(out, [-1])


@register_decomposition(aten.histc)
def histc(self, bins=100, min=0, max=0):
    x = aten.reshape(self, (-1,))
    if numel(x.shape) == 0:
        return prims.full((bins,), 0, self.dtype, self.device)
    lo, hi = float(min), float(max)
    if lo == hi:
        # torch takes the data's range, widened by one each way when it is a single value.
        lo_t, hi_t = aten.amin(x), aten.amax(x)
        same = aten.eq(lo_t, hi_t)
        lo_t, hi_t = (
            aten.where(same, aten.sub(lo_t, 1), lo_t),
            aten.where(same, aten.add(hi_t, 1), hi_t),
        )
    else:
        lo_t, hi_t = lo, hi
    width = aten.sub(hi_t, lo_t) if is_tensor(hi_t) else hi_t - lo_t
    pos = aten.floor(aten.div(aten.mul(aten.sub(x, lo_t), bins), width))
    pos = aten.where(aten.eq(x, hi_t), bins - 1, pos)
    inside = aten.logical_and(aten.ge(x, lo_t), aten.le(x, hi_t))
    idx = aten.where(inside, pos, bins).to(torch.int64)
    counts = aten.index_put(
        aten.zeros((bins + 1,), dtype=self.dtype, device=self.device),
        [idx],
        aten.ones_like(x),
        True,
    )
    return aten.slice(counts, 0, 0, bins)


@register_decomposition(aten.embedding_renorm)
def embedding_renorm(self, indices, max_norm, norm_type):
    idx = prims.reshape(convert(indices, torch.int64), (-1,))
    rows = aten.index_select(self, 0, idx)
    norm = aten.linalg_vector_norm(rows, norm_type, [-1], True)
    scale = aten.where(aten.gt(norm, max_norm), aten.div(max_norm, aten.add(norm, 1e-7)), 1.0)
    return aten.index_put(self, [idx], aten.mul(rows, scale))


@register_decomposition(aten.nonzero_static)
def nonzero_static(self, *, size, fill_value=-1):
    # Row k of the result is the k-th non-zero's coordinates: scatter each through its rank.
    flat = prims.ne(prims.reshape(self, (-1,)), 0 if not self.dtype.is_floating_point else 0.0)
    n = numel(self.shape)
    rank = aten.sub(aten.cumsum(convert(flat, torch.int64), 0), 1)
    row = aten.where(aten.logical_and(flat, aten.lt(rank, size)), rank, size)
    coords, rem = [], _iota(n, self.device)
    for d in reversed(range(self.ndim)):
        coords.insert(0, prims.remainder(rem, self.shape[d]))
        rem = prims.floor_div(rem, self.shape[d])
    values = (
        prims.cat([prims.expand_dims(c, (1,)) for c in coords], 1)
        if coords
        else prims.full((n, 0), 0, torch.int64, self.device)
    )
    out = prims.full((size + 1, self.ndim), fill_value, torch.int64, self.device)
    out = prims.index_put(out, [row], values, False)
    return prims.slice_in_dim(out, 0, size, 1, 0)


@register_decomposition(aten.rot90)
def rot90(self, k=1, dims=(0, 1)):
    d0, d1 = (utils.canonicalize_dim(self.ndim, d) for d in dims)
    k = k % 4
    if k == 1:
        return aten.transpose(aten.flip(self, [d1]), d0, d1)
    if k == 2:
        return aten.flip(self, [d0, d1])
    if k == 3:
        return aten.flip(aten.transpose(self, d0, d1), [d1])
    return prims.clone(self)


@register_decomposition(aten.angle)
def angle(self):
    _, dtype = elementwise_dtypes(self, kind=INT_TO_FLOAT)
    x = convert(self, dtype)
    # Real input: pi for negatives, 0 otherwise; NaN stays NaN.
    out = prims.where(prims.lt(x, 0.0), like(math.pi, x), 0.0)
    return prims.where(prims.ne(x, x), x, out)


@register_decomposition(aten.mode)
def mode(self, dim=-1, keepdim=False):
    """(most frequent value, index of its last occurrence); ties go to the smallest value."""
    if self.ndim == 0:
        return prims.clone(self), like(0, self, torch.int64)
    dim = utils.canonicalize_dim(self.ndim, dim)
    x = aten.movedim(self, dim, -1)
    n = x.shape[-1]
    # Pairwise equality along the dim counts each element's occurrences (n is a small static size).
    counts = aten.sum(aten.eq(aten.unsqueeze(x, -1), aten.unsqueeze(x, -2)), [-1])
    best = aten.amax(counts, [-1], True)
    top = aten.eq(counts, best)
    if self.dtype is torch.bool:
        value = aten.logical_not(aten.any(aten.logical_and(top, aten.logical_not(x)), [-1], True))
    else:
        big = (
            torch.finfo(self.dtype).max
            if self.dtype.is_floating_point
            else torch.iinfo(self.dtype).max
        )
        value = aten.amin(aten.where(top, x, big), [-1], True)
    pos = prims.broadcast_in_dim(_iota(n, self.device), tuple(x.shape), (x.ndim - 1,))
    index = aten.amax(aten.where(aten.eq(x, value), pos, -1), [-1], True)
    value, index = aten.squeeze(value, [-1]), aten.squeeze(index, [-1])
    if keepdim:
        value, index = aten.unsqueeze(value, dim), aten.unsqueeze(index, dim)
    return value, index


@register_decomposition(aten._chunk_cat)
def _chunk_cat(tensors, dim, num_chunks):
    dim = utils.canonicalize_dim(tensors[0].ndim, dim)
    parts = []
    for t in tensors:
        size = t.shape[dim]
        chunk = -(-size // num_chunks)
        high = [0] * t.ndim
        high[dim] = chunk * num_chunks - size
        padded = prims.pad(
            t,
            0 if not t.dtype.is_floating_point else 0.0,
            (0,) * t.ndim,
            tuple(high),
            (0,) * t.ndim,
        )
        rest = math.prod(padded.shape[dim:]) // num_chunks
        parts.append(prims.reshape(padded, tuple(t.shape[:dim]) + (num_chunks, rest)))
    return aten.cat(parts, dim + 1)


@register_decomposition(aten.histogram.bin_ct)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    x = aten.reshape(self, (-1,))
    if range is not None:
        lo, hi = (
            aten.full((), range[0], dtype=self.dtype),
            aten.full((), range[1], dtype=self.dtype),
        )
    elif numel(x.shape):
        lo, hi = aten.amin(x), aten.amax(x)
    else:  # torch's range for an empty input
        lo, hi = aten.zeros((), dtype=self.dtype), aten.ones((), dtype=self.dtype)
    same = aten.eq(lo, hi)
    lo = aten.where(same, aten.sub(lo, 0.5), lo) if range is None else lo
    hi = aten.where(same, aten.add(hi, 0.5), hi) if range is None else hi
    edges = aten.linspace(lo, hi, bins + 1, dtype=self.dtype)
    return _histogram(x, edges, weight, density), edges


@register_decomposition(aten.histogram.bins_tensor)
def histogram_edges(self, bins, *, weight=None, density=False):
    return _histogram(aten.reshape(self, (-1,)), bins, weight, density), prims.clone(bins)


def _histogram(x, edges, weight, density):
    """Counts (or weights) of x in the bins edges[i] <= x < edges[i + 1] (the last one closed)."""
    nb = edges.shape[0] - 1
    lo, hi = aten.select(edges, 0, 0), aten.select(edges, 0, nb)
    pos = aten.sub(aten.sum(aten.le(edges, aten.unsqueeze(x, -1)), [-1]), 1)
    pos = aten.where(aten.eq(x, hi), nb - 1, pos)
    inside = aten.logical_and(aten.ge(x, lo), aten.le(x, hi))
    idx = aten.where(inside, pos, nb)
    w = aten.reshape(weight, (-1,)) if weight is not None else aten.ones_like(x)
    counts = aten.index_put(aten.zeros((nb + 1,), dtype=x.dtype, device=x.device), [idx], w, True)
    hist = aten.slice(counts, 0, 0, nb)
    if density:
        widths = aten.sub(aten.slice(edges, 0, 1, nb + 1), aten.slice(edges, 0, 0, nb))
        hist = aten.div(hist, aten.mul(aten.sum(hist), widths))
    return hist


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


@register_decomposition(aten.segment_reduce)
def segment_reduce(
    data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    """Reduce runs of data along axis, selected by a dense (segments x positions) mask."""
    axis = utils.canonicalize_dim(data.ndim, axis)
    if lengths is not None:
        ends = aten.cumsum(lengths, -1)
        starts = aten.sub(ends, lengths)
    elif offsets is not None:
        n_off = offsets.shape[-1]
        starts, ends = aten.slice(offsets, -1, 0, n_off - 1), aten.slice(offsets, -1, 1, n_off)
    else:
        raise NotImplementedError("segment_reduce needs lengths or offsets")
    n = data.shape[axis]
    pos = prims.iota(n, 0, 1, torch.int64, data.device)
    member = aten.logical_and(
        aten.le(aten.unsqueeze(starts, -1), pos), aten.lt(pos, aten.unsqueeze(ends, -1))
    )  # (..., S, N)
    trail = data.ndim - axis - 1
    for _ in range(trail):
        member = aten.unsqueeze(member, -1)
    x = aten.unsqueeze(data, axis)  # (..., 1, N, trail...)
    fill = _SEGMENT_IDENTITY[reduce]
    masked = aten.where(member, x, fill)
    red = {"sum": aten.sum, "mean": aten.sum, "prod": aten.prod, "max": aten.amax, "min": aten.amin}
    out = red[reduce](masked, axis + 1) if reduce in ("prod",) else red[reduce](masked, [axis + 1])
    count = aten.sum(member, [axis + 1])
    if initial is not None:
        combine = {
            "sum": aten.add,
            "mean": aten.add,
            "prod": aten.mul,
            "max": aten.maximum,
            "min": aten.minimum,
        }[reduce]
        out = (
            combine(out, initial)
            if reduce not in ("max", "min")
            else combine(out, aten.full_like(out, initial))
        )
    if reduce == "mean":
        mean = aten.div(out, count)
        out = (
            mean
            if initial is None
            else aten.where(aten.eq(count, 0), aten.full_like(out, initial), mean)
        )
    return convert(out, data.dtype)
