"""View and shape prims: the output aliases the input's storage (reshape only when it can).

Each meta rule computes the strides and storage offset that torch's own view op gives, and the
reference implementation is that view op, so a traced program aliases exactly as eager does.
"""

from __future__ import annotations

import builtins

import sympy
import torch

from ember.ir import TensorMeta, as_expr
from ember.ir.symbols import CeilDiv

from .. import utils
from .core import prim

_VIEW = ("view",)


def _like(a: TensorMeta, sizes, strides, offset=None) -> TensorMeta:
    return TensorMeta(
        a.dtype, tuple(sizes), tuple(strides),
        a.storage_offset if offset is None else offset, a.device,
    )  # fmt: skip


def _ints(values):
    return tuple(int(v) for v in values)


def _plain(values):
    """Static sizes as Python ints (how graphs print them), symbolic ones as sympy expressions."""
    return tuple(int(v) if as_expr(v).is_Integer else as_expr(v) for v in values)


def _numel(a):
    return a.numel() if isinstance(a, TensorMeta) else utils.numel(a.shape)


# --- broadcast_in_dim ----------------------------------------------------------------------------


def _broadcast_canon(a, shape, broadcast_dimensions):
    return (a, tuple(shape), tuple(broadcast_dimensions)), {}


def _broadcast_meta(a, shape, broadcast_dimensions):
    shape = tuple(as_expr(s) for s in shape)
    if len(broadcast_dimensions) != a.ndim:
        raise ValueError(
            f"prims.broadcast_in_dim: {a.ndim} input dims but {len(broadcast_dimensions)} "
            "broadcast_dimensions"
        )
    if list(broadcast_dimensions) != sorted(set(broadcast_dimensions)) or any(
        not 0 <= d < len(shape) for d in broadcast_dimensions
    ):
        raise ValueError(
            f"prims.broadcast_in_dim: broadcast_dimensions {broadcast_dimensions} must be "
            f"strictly increasing dims of the {len(shape)}-d output"
        )
    # Unsqueeze the new dims one by one as torch does (their stride is then size*stride of the next
    # dim, or 1), then expand: a broadcast dim gets stride 0.
    sizes, strides = list(a.sizes), list(a.strides)
    for d in range(len(shape)):
        if d not in broadcast_dimensions:
            stride = sizes[d] * strides[d] if d < len(sizes) else sympy.S.One
            sizes.insert(d, sympy.S.One)
            strides.insert(d, stride)
    out_strides = []
    for d, (old, new) in enumerate(zip(sizes, shape)):
        if utils.known_eq(old, new):
            out_strides.append(strides[d])
        elif utils.known_eq(old, 1):
            out_strides.append(sympy.S.Zero)
        else:
            raise ValueError(
                f"prims.broadcast_in_dim: cannot broadcast size {old} to {new} at dimension {d}"
            )
    return _like(a, shape, out_strides)


def _broadcast_ref(a, shape, broadcast_dimensions):
    v = a
    for d in range(len(shape)):
        if d not in broadcast_dimensions:
            v = v.unsqueeze(d)
    return v.expand(_ints(shape))


broadcast_in_dim = prim(
    "broadcast_in_dim",
    "(Tensor a, int[] shape, int[] broadcast_dimensions) -> Tensor",
    meta=_broadcast_meta,
    ref=_broadcast_ref,
    canon=_broadcast_canon,
    tags=_VIEW,
    doc="a broadcast to shape; input dim i becomes output dim broadcast_dimensions[i]",
)

# --- reshape family ------------------------------------------------------------------------------


def _reshape_meta(a, shape):
    shape = utils.infer_size(shape, a.numel())
    if not utils.known_eq(utils.numel(shape), a.numel()):
        raise ValueError(f"prims.reshape: cannot reshape {a.sizes} into {shape}")
    strides = utils.compute_view_strides(a.sizes, a.strides, shape)
    if strides is None:
        return TensorMeta(a.dtype, shape, utils.make_contiguous_strides_for(shape), 0, a.device)
    return _like(a, shape, strides)


reshape = prim(
    "reshape",
    "(Tensor a, int[] shape) -> Tensor",
    meta=_reshape_meta,
    ref=lambda a, shape: a.reshape(_ints(shape)),
    canon=lambda a, shape: ((a, _plain(utils.infer_size(shape, _numel(a)))), {}),
    tags=_VIEW,
    doc="torch.reshape: a view when the strides allow one, else a contiguous copy",
)


def _split_dim_meta(a, dim, outer_length):
    size = a.sizes[dim]
    inner = sympy.simplify(size / as_expr(outer_length))
    if not inner.is_integer and not (inner.is_Integer):
        raise ValueError(f"prims.split_dim: {outer_length} does not divide size {size}")
    sizes = a.sizes[:dim] + (as_expr(outer_length), inner) + a.sizes[dim + 1 :]
    strides = a.strides[:dim] + (a.strides[dim] * inner, a.strides[dim]) + a.strides[dim + 1 :]
    return _like(a, sizes, strides)


def _split_dim_ref(a, dim, outer_length):
    return a.unflatten(dim, (int(outer_length), -1))


split_dim = prim(
    "split_dim",
    "(Tensor a, int dim, int outer_length) -> Tensor",
    meta=_split_dim_meta,
    ref=_split_dim_ref,
    canon=lambda a, dim, outer_length: ((a, utils.canonicalize_dim(a.ndim, dim), outer_length), {}),
    tags=_VIEW,
    doc="dim split into (outer_length, size // outer_length)",
)


def _collapse_shape(a, start, end):
    if not 0 <= start < end <= max(a.ndim, 1):
        raise ValueError(f"prims.collapse_view: bad range [{start}, {end}) for {a.ndim} dims")
    return tuple(a.sizes[:start]) + (utils.numel(a.sizes[start:end]),) + tuple(a.sizes[end:])


def _collapse_view_meta(a, start, end):
    shape = _collapse_shape(a, start, end)
    strides = utils.compute_view_strides(a.sizes, a.strides, shape)
    if strides is None:
        raise ValueError(
            f"prims.collapse_view: dims [{start}, {end}) of sizes {a.sizes} and strides "
            f"{a.strides} cannot be collapsed without a copy"
        )
    return _like(a, shape, strides)


collapse_view = prim(
    "collapse_view",
    "(Tensor a, int start, int end) -> Tensor",
    meta=_collapse_view_meta,
    ref=lambda a, start, end: a.view(_ints(_collapse_shape(TensorMeta.from_tensor(a), start, end))),
    tags=_VIEW,
    doc="dims [start, end) merged into one, as a view (an error when a copy would be needed)",
)


def _squeeze_canon(a, dims):
    return (a, tuple(sorted(utils.canonicalize_dims(a.ndim, dims)))), {}


def _squeeze_meta(a, dims):
    for d in dims:
        if not utils.known_eq(a.sizes[d], 1):
            raise ValueError(f"prims.squeeze: dimension {d} has size {a.sizes[d]}, not 1")
    keep = [d for d in range(a.ndim) if d not in dims]
    return _like(a, [a.sizes[d] for d in keep], [a.strides[d] for d in keep])


squeeze = prim(
    "squeeze",
    "(Tensor a, int[] dims) -> Tensor",
    meta=_squeeze_meta,
    ref=lambda a, dims: a.squeeze(tuple(dims)) if dims else a.view(a.shape),
    canon=_squeeze_canon,
    tags=_VIEW,
    doc="the size-1 dims removed",
)


def _expand_dims_canon(a, dims):
    ndim = a.ndim + len(dims)
    return (a, tuple(sorted(utils.canonicalize_dims(ndim, dims)))), {}


def _expand_dims_meta(a, dims):
    sizes, strides = list(a.sizes), list(a.strides)
    for d in dims:
        stride = sizes[d] * strides[d] if d < len(sizes) else sympy.S.One
        sizes.insert(d, sympy.S.One)
        strides.insert(d, stride)
    return _like(a, sizes, strides)


def _expand_dims_ref(a, dims):
    v = a.view(a.shape)
    for d in dims:
        v = v.unsqueeze(d)
    return v


expand_dims = prim(
    "expand_dims",
    "(Tensor a, int[] dims) -> Tensor",
    meta=_expand_dims_meta,
    ref=_expand_dims_ref,
    canon=_expand_dims_canon,
    tags=_VIEW,
    doc="size-1 dims inserted so that they are at `dims` of the output (unsqueeze)",
)


def _permute_canon(a, dims):
    dims = utils.canonicalize_dims(a.ndim, dims)
    if sorted(dims) != list(range(a.ndim)):
        raise ValueError(f"prims.permute: {dims} is not a permutation of {a.ndim} dims")
    return (a, dims), {}


permute = prim(
    "permute",
    "(Tensor a, int[] dims) -> Tensor",
    meta=lambda a, dims: _like(a, [a.sizes[d] for d in dims], [a.strides[d] for d in dims]),
    ref=lambda a, dims: a.permute(dims),
    canon=_permute_canon,
    tags=_VIEW,
    doc="output dim i is input dim dims[i]",
)

# --- slicing -------------------------------------------------------------------------------------


def _slice_canon(a, start_indices, limit_indices, strides=None):
    strides = tuple(strides) if strides is not None else (1,) * a.ndim
    return (a, tuple(start_indices), tuple(limit_indices), strides), {}


def _slice_meta(a, start_indices, limit_indices, strides):
    if not len(start_indices) == len(limit_indices) == len(strides) == a.ndim:
        raise ValueError(f"prims.slice: need {a.ndim} starts, limits and strides")
    sizes, out_strides, offset = [], [], a.storage_offset
    for d, (lo, hi, step) in enumerate(zip(start_indices, limit_indices, strides)):
        lo, hi, step = as_expr(lo), as_expr(hi), as_expr(step)
        bounds = (0, lo), (lo, hi), (hi, a.sizes[d]), (1, step)
        if not all(utils.known_le(x, y) for x, y in bounds):
            raise ValueError(
                f"prims.slice: need 0 <= start <= limit <= size and step >= 1 at dim {d}, got "
                f"start={lo} limit={hi} size={a.sizes[d]} step={step}"
            )
        sizes.append(CeilDiv(hi - lo, step))
        out_strides.append(a.strides[d] * step)
        offset = offset + lo * a.strides[d]
    return _like(a, sizes, out_strides, offset)


def _slice_ref(a, start_indices, limit_indices, strides):
    index = tuple(builtins.slice(int(lo), int(hi), int(st))
                  for lo, hi, st in zip(start_indices, limit_indices, strides))  # fmt: skip
    return a[index] if index else a.view(a.shape)


slice = prim(
    "slice",
    "(Tensor a, int[] start_indices, int[] limit_indices, Optional[int[]] strides=None) -> Tensor",
    meta=_slice_meta,
    ref=_slice_ref,
    canon=_slice_canon,
    tags=_VIEW,
    doc="a[start:limit:stride] in every dim (0 <= start <= limit <= size, stride >= 1)",
)


def _slice_in_dim_args(a, start, limit, stride, axis):
    axis = utils.canonicalize_dim(a.ndim, axis)
    starts = [0] * a.ndim
    limits = list(a.sizes) if isinstance(a, TensorMeta) else list(a.shape)
    steps = [1] * a.ndim
    starts[axis], limits[axis], steps[axis] = start, limit, stride
    return starts, limits, steps


def _slice_in_dim_canon(a, start, limit, stride=1, axis=0):
    return (a, start, limit, stride, utils.canonicalize_dim(a.ndim, axis)), {}


slice_in_dim = prim(
    "slice_in_dim",
    "(Tensor a, int start, int limit, int stride=1, int axis=0) -> Tensor",
    meta=lambda a, start, limit, stride, axis: _slice_meta(
        a, *_slice_in_dim_args(a, start, limit, stride, axis)
    ),
    ref=lambda a, start, limit, stride, axis: _slice_ref(
        a, *_slice_in_dim_args(a, start, limit, stride, axis)
    ),
    canon=_slice_in_dim_canon,
    tags=_VIEW,
    doc="a[start:limit:stride] along one axis",
)


def _as_strided_meta(a, size, stride, storage_offset):
    if len(size) != len(stride):
        raise ValueError("prims.as_strided: size and stride lengths differ")
    return _like(a, size, stride, as_expr(storage_offset))


as_strided = prim(
    "as_strided",
    "(Tensor a, int[] size, int[] stride, int storage_offset) -> Tensor",
    meta=_as_strided_meta,
    ref=lambda a, size, stride, storage_offset: torch.as_strided(
        a, _ints(size), _ints(stride), int(storage_offset)
    ),
    canon=lambda a, size, stride, storage_offset: (
        (a, tuple(size), tuple(stride), storage_offset),
        {},
    ),
    tags=_VIEW,
    doc="torch.as_strided: a view of a's storage (storage_offset is absolute, as in torch)",
)

view_of = prim(
    "view_of",
    "(Tensor a) -> Tensor",
    meta=lambda a: _like(a, a.sizes, a.strides),
    ref=lambda a: a.view(a.shape),
    tags=_VIEW,
    doc="a new view of all of a (an alias)",
)


def _view_element_type_meta(a, dtype):
    old, new = _itemsize(a.dtype), _itemsize(dtype)
    if old != new:
        raise ValueError(
            f"prims.view_element_type: {a.dtype} and {dtype} differ in size; only same-size "
            "reinterpretation is a prim"
        )
    return TensorMeta(dtype, a.sizes, a.strides, a.storage_offset, a.device)


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


view_element_type = prim(
    "view_element_type",
    "(Tensor a, dtype dtype) -> Tensor",
    meta=_view_element_type_meta,
    ref=lambda a, dtype: a.view(dtype),
    tags=_VIEW,
    doc="the bits of a reinterpreted as a same-size dtype (Tensor.view(dtype))",
)
