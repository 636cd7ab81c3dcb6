"""Data movement: cat/stack, padding, indexing, gather/scatter, masks, roll/flip/repeat, tril."""

from __future__ import annotations

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert, is_tensor, like, result_type
from ._registry import register_decomposition


def _canon(ndim, dim):
    return utils.canonicalize_dim(ndim, dim)


def _iota(n, device, start=0, step=1):
    return prims.iota(n, start, step, torch.int64, device)


@register_decomposition(aten.cat)
def cat(tensors, dim=0):
    # torch skips legacy empty 1-D inputs (shape [0]) when the others have more dims.
    dtype = result_type(*tensors)
    live = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not live:
        return (
            convert(tensors[0], dtype)
            if len(tensors) == 1
            else prims.cat([convert(t, dtype) for t in tensors], 0)
        )
    dim = _canon(live[0].ndim, dim)
    if len(live) == 1:
        return (
            prims.clone(convert(live[0], dtype))
            if live[0].dtype == dtype
            else convert(live[0], dtype)
        )
    return prims.cat([convert(t, dtype) for t in live], dim)


@register_decomposition(aten.stack)
def stack(tensors, dim=0):
    dim = _canon(tensors[0].ndim + 1, dim)
    return aten.cat([aten.unsqueeze(t, dim) for t in tensors], dim)


@register_decomposition(aten.hstack)
def hstack(tensors):
    tensors = [aten.atleast_1d(t) for t in tensors]
    return aten.cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@register_decomposition(aten.constant_pad_nd)
def constant_pad_nd(self, pad, value=0):
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise ValueError(f"constant_pad_nd: bad padding {pad} for a {self.ndim}-d tensor")
    low, high = [0] * self.ndim, [0] * self.ndim
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    value = (
        value
        if self.dtype.is_floating_point
        else (bool(value) if self.dtype is torch.bool else int(value))
    )
    return prims.pad(self, value, tuple(low), tuple(high), (0,) * self.ndim)


def _pad_index(n, lo, hi, device, mode):
    """Source indices along one dim for reflect/replicate/circular padding of size n by (lo, hi)."""
    idx = _iota(n + lo + hi, device, -lo)
    if mode == "reflect":
        idx = prims.abs(idx)
        return prims.sub(n - 1, prims.abs(prims.sub(n - 1, idx)))
    if mode == "replicate":
        return prims.minimum(prims.maximum(idx, 0), n - 1)
    return prims.remainder(idx, n)  # circular


def _pad_modes(self, padding, mode):
    out = self
    for i in range(len(padding) // 2):
        d = self.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        idx = _pad_index(self.shape[d], lo, hi, self.device, mode)
        out = aten.index_select(out, d, idx)
    return out


def _register_pad(mode, *ops):
    def decomp(self, padding):
        return _pad_modes(self, padding, mode)

    register_decomposition(*ops)(decomp)


@register_decomposition(aten._pad_circular)
def _pad_circular(self, pad):
    return _pad_modes(self, pad, "circular")


_register_pad("reflect", aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d)
_register_pad("replicate", aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d)


def _expand_masks(indices):
    """Boolean masks become integer indices (one per mask dim) through extern.nonzero."""
    out = []
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            # The count of selected elements is data-dependent: an unbacked size in the graph.
            nz = aten.nonzero(idx if idx.dtype is torch.bool else aten.ne(idx, 0))
            out.extend(aten.select(nz, 1, k) for k in range(idx.ndim))
        else:
            out.append(idx)
    return out


@register_decomposition(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(self, indices):
    indices = _expand_masks(indices)
    if not any(i is not None for i in indices):
        return prims.clone(self)
    return prims.index(self, [None if i is None else _as_index(i) for i in indices])


def _as_index(i):
    return i if i.dtype in (torch.int64, torch.int32) else convert(i, torch.int64)


def _bool_mask_put(self, mask, values):
    # x[mask] = v with one value for every selected element is a select: where(mask, v, x).
    m = mask if mask.dtype is torch.bool else prims.ne(mask, 0)
    if m.ndim < self.ndim:
        m = prims.expand_dims(m, tuple(range(m.ndim, self.ndim)))
    m = utils.broadcast_to(m, tuple(self.shape))
    v = prims.reshape(convert(values, self.dtype), ())
    return prims.where(m, utils.broadcast_to(v, tuple(self.shape)), self)


def index_put_dense(x, indices, values, accumulate):
    """prims.index_put with no None entries: indexed dims are moved to the front first."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    present = [d for d, i in enumerate(indices) if i is not None]
    if present == list(range(len(present))):
        idx = [_as_index(indices[d]) for d in present]
        return prims.index_put(x, idx, values, accumulate)
    rest = [d for d in range(x.ndim) if d not in present]
    perm = present + rest
    bshape = utils.broadcast_shapes(*(tuple(indices[d].shape) for d in present))
    bshape = tuple(int(s) if s.is_Integer else s for s in bshape)
    nb = len(bshape)
    # values broadcast to torch's indexed shape: bshape in place of adjacent indexed dims, else
    # in front; then laid out as x.permute(perm)[indices] (bshape first, then the rest).
    adjacent = present == list(range(present[0], present[-1] + 1))
    lead = present[0] if adjacent else 0
    rest_sizes = [x.shape[d] for d in rest]
    indexed = tuple(rest_sizes[:lead]) + bshape + tuple(rest_sizes[lead:])
    v = values if not is_tensor(values) else utils.broadcast_to(values, indexed)
    if is_tensor(v) and lead:
        order = (
            tuple(range(lead, lead + nb))
            + tuple(range(lead))
            + tuple(range(lead + nb, len(indexed)))
        )
        v = prims.permute(v, order)
    xp = prims.permute(x, tuple(perm))
    out = prims.index_put(xp, [_as_index(indices[d]) for d in present], v, accumulate)
    return prims.permute(out, tuple(perm.index(d) for d in range(x.ndim)))


@register_decomposition(aten.index_put, aten._unsafe_index_put)
def index_put(self, indices, values, accumulate=False):
    values = convert(values, self.dtype)
    masks = [i for i in indices if i is not None and i.dtype in (torch.bool, torch.uint8)]
    if masks and len(indices) == 1 and not accumulate and values.numel() == 1:
        return _bool_mask_put(self, indices[0], values)
    return index_put_dense(self, _expand_masks(indices), values, accumulate)


@register_decomposition(aten._unsafe_masked_index)
def _unsafe_masked_index(self, mask, indices, fill):
    safe = [None if i is None else aten.where(mask, i, 0) for i in indices]
    return aten.where(mask, aten._unsafe_index(self, safe), fill)


@register_decomposition(aten._unsafe_masked_index_put_accumulate)
def _unsafe_masked_index_put_accumulate(self, mask, indices, values):
    safe = [None if i is None else aten.where(mask, i, 0) for i in indices]
    masked = aten.where(mask, values, 0)
    return aten.index_put(self, safe, masked, True)


def _index_along(dim, index):
    return [None] * dim + [index]


def _put_along(x, dim, index, values, accumulate):
    """x with x[(:,) * dim + (index,)] = values (+= when accumulate)."""
    return index_put_dense(x, _index_along(dim, index), values, accumulate)


@register_decomposition(aten.index_select)
def index_select(self, dim, index):
    if self.ndim == 0:
        picked = prims.index(prims.reshape(self, (1,)), [prims.reshape(index, (-1,))])
        return prims.reshape(picked, ())
    dim = _canon(self.ndim, dim)
    index = prims.reshape(index, (-1,)) if index.ndim == 0 else index
    return prims.index(self, _index_along(dim, index))


@register_decomposition(aten.index_add)
def index_add(self, dim, index, source, *, alpha=1):
    if alpha != 1:
        source = aten.mul(source, alpha)
    if self.ndim == 0:
        flat = aten.index_add(
            prims.reshape(self, (1,)), 0, prims.reshape(index, (-1,)), prims.reshape(source, (-1,))
        )
        return prims.reshape(flat, ())
    dim = _canon(self.ndim, dim)
    source = _as_dims(source, self.ndim)
    return _put_along(self, dim, index, convert(source, self.dtype), True)


def _as_dims(t, ndim):
    return prims.reshape(t, (1,) * ndim) if t.ndim == 0 and ndim > 0 else t


@register_decomposition(aten.index_copy)
def index_copy(self, dim, index, source):
    if self.ndim == 0:
        return prims.reshape(convert(source, self.dtype), ())
    dim = _canon(self.ndim, dim)
    source = _as_dims(source, self.ndim)
    return _put_along(self, dim, index, convert(source, self.dtype), False)


@register_decomposition(aten.index_fill)
def index_fill(self, dim, index, value):
    value = convert(value, self.dtype) if is_tensor(value) else _coerce(value, self.dtype)
    if self.ndim == 0:
        return aten.full_like(self, value) if not is_tensor(value) else prims.clone(value)
    dim = _canon(self.ndim, dim)
    index = prims.reshape(index, (-1,)) if index.ndim == 0 else index
    if not is_tensor(value):
        value = prims.scalar_tensor(value, self.dtype, self.device)
    return _put_along(self, dim, index, value, False)


def _coerce(value, dtype):
    if dtype is torch.bool:
        return bool(value)
    return value if dtype.is_floating_point or dtype.is_complex else int(value)


@register_decomposition(aten.masked_fill)
def masked_fill(self, mask, value):
    if is_tensor(value):
        if value.ndim != 0:
            raise ValueError("masked_fill only supports a 0-dimensional value tensor")
        value = convert(value, self.dtype)
    else:
        value = _coerce(value, self.dtype)
    return aten.where(mask, value, self)


@register_decomposition(aten.gather)
def gather(self, dim, index, *, sparse_grad=False):
    if index.numel() == 0:
        return prims.full(tuple(index.shape), 0, self.dtype, self.device)
    if self.ndim == 0:
        flat = prims.gather(prims.reshape(self, (1,)), 0, prims.reshape(index, (-1,)))
        return prims.reshape(flat, tuple(index.shape))
    return prims.gather(self, _canon(self.ndim, dim), _as_index(index))


def _scalar_src(self, index, value):
    return prims.full(tuple(index.shape), _coerce(value, self.dtype), self.dtype, self.device)


@register_decomposition(aten.scatter.src, aten.scatter.value)
def scatter(self, dim, index, src=None, value=None):
    src = src if is_tensor(src) else _scalar_src(self, index, src if src is not None else value)
    return prims.scatter(self, _canon(self.ndim, dim), index, convert(src, self.dtype))


@register_decomposition(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    src = src if is_tensor(src) else _scalar_src(self, index, src)
    mode = {"add": "sum", "multiply": "prod"}[reduce]
    return prims.scatter_reduce(self, _canon(self.ndim, dim), index, convert(src, self.dtype), mode)


@register_decomposition(aten.scatter_add)
def scatter_add(self, dim, index, src):
    return prims.scatter_add(self, _canon(self.ndim, dim), index, convert(src, self.dtype))


@register_decomposition(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    return prims.scatter_reduce(
        self, _canon(self.ndim, dim), index, convert(src, self.dtype), reduce, include_self
    )


@register_decomposition(aten.take)
def take(self, index):
    flat = prims.reshape(self, (-1,))
    return prims.reshape(prims.index(flat, [prims.reshape(index, (-1,))]), tuple(index.shape))


@register_decomposition(aten.flip)
def flip(self, dims):
    return prims.rev(self, tuple(_canon(self.ndim, d) for d in dims))


@register_decomposition(aten.roll)
def roll(self, shifts, dims=()):
    if isinstance(shifts, int):
        shifts = (shifts,)
    if isinstance(dims, int):
        dims = (dims,)
    if not dims:
        flat = prims.reshape(self, (-1,))
        return prims.reshape(aten.roll(flat, shifts, [0]), tuple(self.shape))
    out = self
    for shift, dim in zip(shifts, dims):
        d = _canon(self.ndim, dim)
        n = self.shape[d]
        if n == 0:
            continue
        # out[i] = in[(i - shift) mod n]
        idx = prims.remainder(_iota(n, self.device, -shift), n)
        out = aten.index_select(out, d, idx)
    return out


@register_decomposition(aten.repeat)
def repeat(self, repeats):
    repeats = list(repeats)
    if len(repeats) < self.ndim:
        raise ValueError("repeat: fewer repeat dims than tensor dims")
    pad = len(repeats) - self.ndim
    shape = [1] * pad + list(self.shape)
    x = prims.reshape(self, tuple(shape))
    # Interleave (repeat, size) pairs, broadcast along the repeat axes, then merge each pair.
    expanded, bdims = [], []
    for i, (r, s) in enumerate(zip(repeats, shape)):
        expanded += [r, s]
        bdims.append(2 * i + 1)
    out = prims.broadcast_in_dim(x, tuple(expanded), tuple(bdims))
    return prims.reshape(out, tuple(r * s for r, s in zip(repeats, shape)))


def _tri_mask(self, diagonal, upper):
    n, m = self.shape[-2], self.shape[-1]
    rows = prims.broadcast_in_dim(_iota(n, self.device), (n, m), (0,))
    cols = prims.broadcast_in_dim(_iota(m, self.device), (n, m), (1,))
    diff = prims.sub(cols, rows)
    mask = prims.ge(diff, diagonal) if upper else prims.le(diff, diagonal)
    return utils.broadcast_to(mask, tuple(self.shape))


@register_decomposition(aten.tril)
def tril(self, diagonal=0):
    return prims.where(_tri_mask(self, diagonal, False), self, like(0, self))


@register_decomposition(aten.triu)
def triu(self, diagonal=0):
    return prims.where(_tri_mask(self, diagonal, True), self, like(0, self))


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, max((end - start + step - 1) // step, 0)


def _embed(src, dim, size, start, step, value):
    """src placed along dim of a size-`size` dim at start, start + step, ... (value elsewhere)."""
    n = src.shape[dim]
    low = [0] * src.ndim
    high = [0] * src.ndim
    interior = [0] * src.ndim
    low[dim] = start
    high[dim] = size - start - (n - 1) * step - 1 if n else size - start
    interior[dim] = step - 1
    return prims.pad(src, value, tuple(low), tuple(high), tuple(interior))


def _scatter_slice(self, src, dim, start, step):
    src = convert(src, self.dtype)
    if str(src.device) != str(self.device):  # a CPU scalar written into a CUDA tensor, as copy_
        src = prims.device_put(src, self.device)
    size = self.shape[dim]
    zero = False if self.dtype is torch.bool else 0
    placed = _embed(src, dim, size, start, step, zero)
    mask = _embed(like(True, src, torch.bool), dim, size, start, step, False)
    return prims.where(mask, placed, self)


@register_decomposition(aten.slice_scatter)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = _canon(self.ndim, dim)
    start, _, _ = _slice_bounds(self.shape[dim], start, end, step)
    return _scatter_slice(self, src, dim, start, step)


@register_decomposition(aten.select_scatter)
def select_scatter(self, src, dim, index):
    dim = _canon(self.ndim, dim)
    if index < 0:
        index = index + self.shape[dim]
    return _scatter_slice(self, prims.expand_dims(src, (dim,)), dim, index, 1)


@register_decomposition(aten.slice_backward)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    dim = _canon(len(input_sizes), dim)
    start, _, _ = _slice_bounds(input_sizes[dim], start, end, step)
    zero = False if grad_output.dtype is torch.bool else 0
    return _embed(grad_output, dim, input_sizes[dim], start, step, zero)


@register_decomposition(aten.select_backward)
def select_backward(grad_output, input_sizes, dim, index):
    dim = _canon(len(input_sizes), dim)
    if index < 0:
        index = index + input_sizes[dim]
    g = prims.expand_dims(grad_output, (dim,))
    return _embed(g, dim, input_sizes[dim], index, 1, 0)


@register_decomposition(aten.diagonal_backward)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    zeros = prims.full(tuple(input_sizes), 0, grad_output.dtype, grad_output.device)
    return aten.diagonal_scatter(zeros, grad_output, offset, dim1, dim2)


@register_decomposition(aten.diagonal_scatter)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _canon(self.ndim, dim1), _canon(self.ndim, dim2)
    n = src.shape[-1]
    rows = _iota(n, self.device, max(-offset, 0))
    cols = _iota(n, self.device, max(offset, 0))
    # Put the two diagonal dims first; the diagonal index is src's last dim.
    rest = [d for d in range(self.ndim) if d not in (d1, d2)]
    perm = [d1, d2] + rest
    x = prims.permute(self, tuple(perm))
    values = prims.permute(convert(src, self.dtype), (src.ndim - 1,) + tuple(range(src.ndim - 1)))
    out = prims.index_put(x, [rows, cols], values, False)
    inverse = [perm.index(d) for d in range(self.ndim)]
    return prims.permute(out, tuple(inverse))


@register_decomposition(aten.as_strided_scatter)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    # Scatter src into a contiguous copy of self through the flat positions the view would read.
    offset = 0 if storage_offset is None else storage_offset
    flat = prims.reshape(prims.copy_strided(self, _contiguous(self)), (-1,))
    pos = like(offset, src, torch.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx = prims.broadcast_in_dim(_iota(n, self.device, 0, s), tuple(size), (d,))
        pos = prims.add(pos, idx)
    out = prims.index_put(
        flat, [prims.reshape(pos, (-1,))], prims.reshape(convert(src, self.dtype), (-1,)), False
    )
    return prims.reshape(out, tuple(self.shape))


def _contiguous(t):
    return tuple(int(s) for s in utils.make_contiguous_strides_for(tuple(t.shape)))


@register_decomposition(aten.diag_embed)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    ndim = self.ndim + 1
    d1, d2 = _canon(ndim, dim1), _canon(ndim, dim2)
    n = self.shape[-1] + abs(offset)
    shape = list(self.shape[:-1])
    for d in sorted((d1, d2)):
        shape.insert(d, n)
    zeros = prims.full(tuple(shape), _coerce(0, self.dtype), self.dtype, self.device)
    return aten.diagonal_scatter(zeros, self, offset, d1, d2)
