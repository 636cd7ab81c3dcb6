"""View and layout ops: view/reshape, expand, permute, squeeze, select, slice, split, copies."""

from __future__ import annotations

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert, full
from ._registry import register_decomposition


def _canon(ndim, dim):
    return utils.canonicalize_dim(ndim, dim)


@register_decomposition(
    aten.view.default,
    aten._unsafe_view,
    aten.view_copy.default,
    aten._reshape_alias,
    aten._reshape_alias_copy,
)
def view(self, size, stride=None):
    return prims.reshape(self, tuple(size))


@register_decomposition(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(self, dtype):
    if dtype == self.dtype:
        return prims.view_of(self)
    return prims.view_element_type(self, dtype)


@register_decomposition(aten.expand, aten.expand_copy)
def expand(self, size, *, implicit=False):
    size = list(size)
    offset = len(size) - self.ndim
    if offset < 0:
        raise ValueError(f"expand: {len(size)} sizes for a {self.ndim}-d tensor")
    for i, s in enumerate(size):
        if isinstance(s, int) and s == -1:
            if i < offset:
                raise ValueError("expand: -1 is not allowed for a new leading dimension")
            size[i] = self.shape[i - offset]
    return prims.broadcast_in_dim(self, tuple(size), tuple(range(offset, len(size))))


@register_decomposition(aten.permute, aten.permute_copy)
def permute(self, dims):
    return prims.permute(self, tuple(_canon(self.ndim, d) for d in dims))


@register_decomposition(aten.transpose.int, aten.transpose_copy.int)
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        return prims.view_of(self)
    dims = list(range(self.ndim))
    a, b = _canon(self.ndim, dim0), _canon(self.ndim, dim1)
    dims[a], dims[b] = dims[b], dims[a]
    return prims.permute(self, tuple(dims))


@register_decomposition(aten.t, aten.t_copy)
def t(self):
    if self.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}")
    return aten.transpose(self, 0, 1) if self.ndim == 2 else prims.view_of(self)


@register_decomposition(aten.squeeze, aten.squeeze_copy)
def squeeze(self, dim=None):
    if self.ndim == 0:
        return prims.view_of(self)
    if dim is None:
        dims = range(self.ndim)
    else:
        dims = (dim,) if isinstance(dim, int) else dim
        dims = [_canon(self.ndim, d) for d in dims]
    dims = tuple(d for d in dims if self.shape[d] == 1)
    return prims.squeeze(self, dims) if dims else prims.view_of(self)


@register_decomposition(aten.unsqueeze, aten.unsqueeze_copy)
def unsqueeze(self, dim):
    return prims.expand_dims(self, (_canon(self.ndim + 1, dim),))


@register_decomposition(aten.select.int, aten.select_copy.int)
def select(self, dim, index):
    dim = _canon(self.ndim, dim)
    size = self.shape[dim]
    if index < -size or index >= size:
        raise IndexError(f"select(): index {index} out of range for dimension {dim} of size {size}")
    if index < 0:
        index = index + size
    out = prims.slice_in_dim(self, index, index + 1, 1, dim)
    return prims.squeeze(out, (dim,))


def _clamp_slice(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start = start + size
    if end < 0:
        end = end + size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@register_decomposition(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice(self, dim=0, start=None, end=None, step=1):
    if step < 1:
        raise ValueError("slice step must be positive")
    dim = _canon(self.ndim, dim)
    start, end = _clamp_slice(self.shape[dim], start, end, step)
    return prims.slice_in_dim(self, start, end, step, dim)


@register_decomposition(aten.narrow, aten.narrow_copy)
def narrow(self, dim, start, length):
    dim = _canon(self.ndim, dim)
    if start < 0:
        start = start + self.shape[dim]
    return prims.slice_in_dim(self, start, start + length, 1, dim)


@register_decomposition(
    aten.split_with_sizes, aten.unsafe_split_with_sizes, aten.split_with_sizes_copy
)
def split_with_sizes(self, split_sizes, dim=0):
    dim = _canon(self.ndim, dim)
    if sum(split_sizes) != self.shape[dim]:
        raise ValueError(
            f"split_with_sizes: sizes {split_sizes} do not add up to {self.shape[dim]}"
        )
    out, start = [], 0
    for length in split_sizes:
        out.append(prims.slice_in_dim(self, start, start + length, 1, dim))
        start = start + length
    return out


@register_decomposition(aten.split.Tensor, aten.unsafe_split.Tensor, aten.split_copy.Tensor)
def split(self, split_size, dim=0):
    dim = _canon(self.ndim, dim)
    size = self.shape[dim]
    if split_size == 0 and size == 0:
        return [prims.view_of(self)]
    chunks = max((size + split_size - 1) // split_size, 1)
    sizes = [split_size] * (chunks - 1) + [size - split_size * (chunks - 1)]
    return aten.split_with_sizes(self, sizes, dim)


@register_decomposition(aten.unbind.int, aten.unbind_copy.int)
def unbind(self, dim=0):
    dim = _canon(self.ndim, dim)
    return [aten.select(self, dim, i) for i in range(self.shape[dim])]


@register_decomposition(aten.as_strided, aten.as_strided_copy)
def as_strided(self, size, stride, storage_offset=None):
    offset = self.storage_offset() if storage_offset is None else storage_offset
    return prims.as_strided(self, tuple(size), tuple(stride), offset)


@register_decomposition(aten.diagonal, aten.diagonal_copy)
def diagonal(self, offset=0, dim1=0, dim2=1):
    d1, d2 = _canon(self.ndim, dim1), _canon(self.ndim, dim2)
    if d1 == d2:
        raise ValueError("diagonal dimensions cannot be identical")
    n1, n2 = self.shape[d1], self.shape[d2]
    length = max(min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2), 0)
    base = self.storage_offset()
    if length > 0:
        base = base + (offset * self.stride(d2) if offset >= 0 else -offset * self.stride(d1))
    keep = [d for d in range(self.ndim) if d not in (d1, d2)]
    sizes = [self.shape[d] for d in keep] + [length]
    strides = [self.stride(d) for d in keep] + [self.stride(d1) + self.stride(d2)]
    return prims.as_strided(self, tuple(sizes), tuple(strides), base)


@register_decomposition(aten.unfold, aten.unfold_copy)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return prims.reshape(self, (1,))
    d = _canon(self.ndim, dimension)
    n = (self.shape[d] - size) // step + 1
    sizes = list(self.shape)
    strides = list(self.stride())
    sizes[d] = n
    strides[d] = strides[d] * step
    sizes.append(size)
    strides.append(self.stride(d))
    return prims.as_strided(self, tuple(sizes), tuple(strides), self.storage_offset())


@register_decomposition(
    aten.alias,
    aten.alias_copy,
    aten.detach,
    aten.detach_copy,
    aten.lift_fresh,
    aten.lift_fresh_copy,
    aten._conj,
    aten._neg_view,
)
def alias(self):
    return prims.view_of(self)


def _memory_format_copy(x, memory_format):
    if memory_format in (None, torch.preserve_format):
        return prims.clone(x)
    strides = utils.memory_format_strides(utils.shape_of(x), memory_format)
    return prims.copy_strided(x, tuple(int(s) if s.is_Integer else s for s in strides))


@register_decomposition(aten.clone)
def clone(self, *, memory_format=None):
    return _memory_format_copy(self, memory_format)


@register_decomposition(aten.contiguous)
def contiguous(self, memory_format=torch.contiguous_format):
    return _memory_format_copy(self, memory_format)


@register_decomposition(aten._to_copy)
def _to_copy(
    self,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    if layout not in (None, torch.strided):
        raise NotImplementedError(f"_to_copy to layout {layout} is not supported")
    out = self
    if device is not None and torch.device(device) != self.device:
        out = prims.device_put(out, device)
    if dtype is not None and dtype != out.dtype:
        out = convert(out, dtype)
    if out is self or memory_format not in (None, torch.preserve_format):
        out = _memory_format_copy(out, memory_format)
    return out


def _number_as(value, dtype: torch.dtype):
    if dtype is torch.bool:
        return bool(value)
    return value if dtype.is_floating_point or dtype.is_complex else int(value)


@register_decomposition(aten.copy)
def copy(self, src, non_blocking=False):
    # The functional copy: src's values in self's shape, dtype, device and layout.
    if not isinstance(src, torch.Tensor):  # `t.copy_(2)`: a Python number reaches us unwrapped
        src = full((), _number_as(src, self.dtype), self.dtype, self.device)
    out = utils.broadcast_to(src, tuple(self.shape))
    if out.device != self.device:
        out = prims.device_put(out, self.device)
    out = convert(out, self.dtype)
    return prims.copy_strided(out, tuple(self.stride()))
