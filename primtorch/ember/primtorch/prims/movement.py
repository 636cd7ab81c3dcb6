"""Data-movement prims: concatenation, padding, gathers and scatters, indexing, copies, flips.

Outputs are new tensors (never aliases); meta rules give the layout torch's own kernel picks.
"""

from __future__ import annotations

import builtins

import sympy
import torch

from ember.ir import TensorMeta, as_expr

from .. import utils
from .core import prim
from .views import _broadcast_meta

_MOVE = ("movement",)


def _ints(values):
    return tuple(int(v) for v in values)


def _materialise(out: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """`out`'s values in the layout `meta` gives (out itself when it already has it)."""
    strides = _ints(meta.strides)
    if out.stride() == strides or out.numel() <= 1:
        return out
    return torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device).copy_(out)


# --- cat and pad ---------------------------------------------------------------------------------


def _cat_canon(tensors, dim):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("prims.cat needs at least one tensor")
    return (tensors, utils.canonicalize_dim(tensors[0].ndim, dim)), {}


def _cat_meta(tensors, dim):
    first = tensors[0]
    utils.check_same_dtype(*tensors, name="prims.cat")
    size = sympy.S.Zero
    for t in tensors:
        if t.ndim != first.ndim or any(
            not utils.known_eq(a, b)
            for d, (a, b) in enumerate(zip(t.sizes, first.sizes))
            if d != dim
        ):
            raise ValueError(f"prims.cat: sizes {t.sizes} and {first.sizes} differ off dim {dim}")
        size = size + t.sizes[dim]
    sizes = first.sizes[:dim] + (size,) + first.sizes[dim + 1 :]
    # torch keeps a memory format only when every input suggests the same one.
    formats = {utils.suggest_memory_format(t.sizes, t.strides) for t in tensors}
    fmt = formats.pop() if len(formats) == 1 else torch.contiguous_format
    strides = utils.memory_format_strides(sizes, fmt)
    return TensorMeta(first.dtype, sizes, strides, 0, utils.device_of(*tensors))


cat = prim(
    "cat",
    "(Tensor[] tensors, int dim) -> Tensor",
    meta=_cat_meta,
    ref=lambda tensors, dim: torch.cat(tensors, dim),
    canon=_cat_canon,
    tags=_MOVE,
    doc="tensors concatenated along dim (same dtype and sizes elsewhere)",
)


def _pad_canon(a, padding_value, low, high, interior):
    if not len(low) == len(high) == len(interior) == a.ndim:
        raise ValueError(f"prims.pad: need {a.ndim} low, high and interior paddings")
    return (a, padding_value, tuple(low), tuple(high), tuple(interior)), {}


def _pad_meta(a, padding_value, low, high, interior):
    sizes = []
    for d, (size, lo, hi, mid) in enumerate(zip(a.sizes, low, high, interior)):
        if utils.known_lt(mid, 0):
            raise ValueError(f"prims.pad: interior padding {mid} at dim {d} is negative")
        inner = size + sympy.Max(size - 1, 0) * mid
        out = as_expr(lo) + as_expr(hi) + inner
        if utils.known_lt(out, 0):
            raise ValueError(f"prims.pad: dim {d} would have size {out}")
        sizes.append(out)
    fmt = utils.suggest_memory_format(a.sizes, a.strides)
    return TensorMeta(a.dtype, sizes, utils.memory_format_strides(sizes, fmt), 0, a.device)


def _pad_ref(a, padding_value, low, high, interior):
    meta = _pad_meta(TensorMeta.from_tensor(a), padding_value, low, high, interior)
    # Pad with the non-negative parts first, then crop the negative ones.
    big_shape, inner, crop = [], [], []
    for size, lo, hi, mid in zip(a.shape, low, high, interior):
        lo_p, hi_p = builtins.max(lo, 0), builtins.max(hi, 0)
        big = lo_p + hi_p + size + builtins.max(size - 1, 0) * mid
        big_shape.append(big)
        inner.append(
            builtins.slice(lo_p, lo_p + builtins.max(size - 1, 0) * (mid + 1) + 1, mid + 1)
        )
        crop.append(builtins.slice(lo_p - lo, big - (hi_p - hi)))
    out = torch.full(big_shape, padding_value, dtype=a.dtype, device=a.device)
    if a.numel() > 0:
        out[tuple(inner)] = a
    out = out[tuple(crop)]
    return _materialise(out.clone(), meta)


pad = prim(
    "pad",
    "(Tensor a, Scalar padding_value, int[] low, int[] high, int[] interior) -> Tensor",
    meta=_pad_meta,
    ref=_pad_ref,
    canon=_pad_canon,
    tags=_MOVE,
    doc="lax.pad: per dim, low/high edge padding (negative crops) and interior padding",
)

# --- gather and scatter --------------------------------------------------------------------------


def _check_index_tensor(name, index):
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"prims.{name}: index must be int64 or int32, got {index.dtype}")


def _gather_meta(a, dim, index):
    _check_index_tensor("gather", index)
    if index.ndim != a.ndim:
        raise ValueError(f"prims.gather: index has {index.ndim} dims, input {a.ndim}")
    sizes = index.sizes
    return TensorMeta(a.dtype, sizes, utils.make_contiguous_strides_for(sizes), 0, a.device)


def _dim_canon(a, dim, *rest, **kwargs):
    return (a, utils.canonicalize_dim(a.ndim, dim), *rest), kwargs


gather = prim(
    "gather",
    "(Tensor a, int dim, Tensor index) -> Tensor",
    meta=_gather_meta,
    ref=lambda a, dim, index: torch.gather(a, dim, index),
    canon=_dim_canon,
    tags=_MOVE,
    doc="out[i][j] = a[index[i][j]][j] for dim 0 (torch.gather)",
)


def _scatter_meta(name):
    def meta(a, dim, index, src, *extra):
        _check_index_tensor(name, index)
        if utils.is_tensor_like(src) and src.dtype != a.dtype:
            raise TypeError(f"prims.{name}: src is {src.dtype}, input {a.dtype}")
        return TensorMeta(a.dtype, a.sizes, utils.make_contiguous_strides_for(a.sizes), 0, a.device)

    return meta


def _scatter_ref(a, dim, index, src):
    return torch.scatter(a, dim, index, src)


scatter = prim(
    "scatter",
    "(Tensor a, int dim, Tensor index, Tensor src) -> Tensor",
    meta=_scatter_meta("scatter"),
    ref=_scatter_ref,
    canon=_dim_canon,
    tags=_MOVE,
    doc="a copy of a with src written at index along dim (src may be a number; duplicates: any)",
)

scatter_add = prim(
    "scatter_add",
    "(Tensor a, int dim, Tensor index, Tensor src) -> Tensor",
    meta=_scatter_meta("scatter_add"),
    ref=lambda a, dim, index, src: torch.scatter_add(a, dim, index, src),
    canon=_dim_canon,
    tags=_MOVE,
    doc="a copy of a with src accumulated at index along dim",
)

_SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_meta(a, dim, index, src, reduce, include_self=True):
    if reduce not in _SCATTER_REDUCTIONS:
        raise ValueError(f"prims.scatter_reduce: reduce must be one of {_SCATTER_REDUCTIONS}")
    return _scatter_meta("scatter_reduce")(a, dim, index, src)


scatter_reduce = prim(
    "scatter_reduce",
    "(Tensor a, int dim, Tensor index, Tensor src, str reduce, bool include_self=True) -> Tensor",
    meta=_scatter_reduce_meta,
    ref=lambda a, dim, index, src, reduce, include_self=True: torch.scatter_reduce(
        a, dim, index, src, reduce, include_self=include_self
    ),
    canon=_dim_canon,
    tags=_MOVE,
    doc="torch.scatter_reduce (sum, prod, mean, amax, amin)",
)

# --- advanced indexing ---------------------------------------------------------------------------


def _index_operands(a: TensorMeta, indices):
    """The output sizes and TensorIterator operands of a[indices] (torch's restrided layout)."""
    idx = list(indices) + [None] * (a.ndim - len(indices))
    if len(idx) > a.ndim:
        raise IndexError(f"prims.index: {len(indices)} indices for {a.ndim} dims")
    present = [d for d, t in enumerate(idx) if t is not None]
    if not present:
        raise ValueError("prims.index needs at least one index tensor")
    for d in present:
        if idx[d].dtype in (torch.bool, torch.uint8):
            raise TypeError(
                "prims.index: boolean masks give data-dependent sizes; turn them into integer "
                "indices first (extern.nonzero)"
            )
        _check_index_tensor("index", idx[d])
    bshape = utils.broadcast_shapes(*(idx[d].sizes for d in present))
    sizes, strides = list(a.sizes), list(a.strides)
    if present != list(range(present[0], present[-1] + 1)):
        # Non-adjacent indexed dims: torch moves them to the front first.
        order = present + [d for d in range(a.ndim) if d not in present]
        sizes, strides, idx = (
            [sizes[d] for d in order],
            [strides[d] for d in order],
            [idx[d] for d in order],
        )
        present = list(range(len(present)))
    before, after = present[0], len(sizes) - present[-1] - 1
    out_sizes = tuple(sizes[:before]) + bshape + tuple(sizes[present[-1] + 1 :])
    src = TensorMeta(a.dtype, out_sizes, tuple(strides[:before]) + (0,) * len(bshape)
                     + tuple(strides[present[-1] + 1 :]), 0, a.device)  # fmt: skip
    ops = [src]
    for d in present:
        t = _broadcast_meta(idx[d], bshape, tuple(range(len(bshape) - idx[d].ndim, len(bshape))))
        dims = tuple(range(before, before + len(bshape)))
        ops.append(_broadcast_meta(t, out_sizes, dims))
    del after
    return out_sizes, ops


def _index_meta(a, indices):
    sizes, ops = _index_operands(a, indices)
    return TensorMeta(a.dtype, sizes, utils.elementwise_output_strides(*ops), 0, a.device)


index = prim(
    "index",
    "(Tensor a, Optional[Tensor][] indices) -> Tensor",
    meta=_index_meta,
    ref=lambda a, indices: torch.ops.aten.index.Tensor(a, list(indices)),
    canon=lambda a, indices: ((a, list(indices)), {}),
    tags=_MOVE,
    doc="a[indices] with integer index tensors (None keeps a dim), numpy advanced indexing",
)


def _index_put_meta(a, indices, values, accumulate=False):
    sizes, _ = _index_operands(a, indices)
    if utils.is_tensor_like(values):
        if values.dtype != a.dtype:
            raise TypeError(f"prims.index_put: values are {values.dtype}, input {a.dtype}")
        utils.broadcast_shapes(values.sizes, sizes)
    strides = utils.preserve_format_strides(a.sizes, a.strides)
    return TensorMeta(a.dtype, a.sizes, strides, 0, a.device)


def _index_put_ref(a, indices, values, accumulate=False):
    if not isinstance(values, torch.Tensor):
        values = torch.scalar_tensor(values, dtype=a.dtype, device=a.device)
    return torch.ops.aten.index_put.default(a, list(indices), values, accumulate)


index_put = prim(
    "index_put",
    "(Tensor a, Optional[Tensor][] indices, Tensor values, bool accumulate=False) -> Tensor",
    meta=_index_put_meta,
    ref=_index_put_ref,
    canon=lambda a, indices, values, accumulate=False: ((a, list(indices), values, accumulate), {}),
    tags=_MOVE,
    doc="a copy of a with a[indices] = values (or += when accumulate)",
)

# --- copies --------------------------------------------------------------------------------------


def _clone_meta(a):
    strides = utils.preserve_format_strides(a.sizes, a.strides)
    return TensorMeta(a.dtype, a.sizes, strides, 0, a.device)


clone = prim(
    "clone",
    "(Tensor a) -> Tensor",
    meta=_clone_meta,
    ref=lambda a: torch.clone(a, memory_format=torch.preserve_format),
    tags=_MOVE,
    doc="a copy of a in the layout torch's clone(preserve_format) gives",
)


def _copy_strided_meta(a, stride):
    if len(stride) != a.ndim:
        raise ValueError(f"prims.copy_strided: {len(stride)} strides for {a.ndim} dims")
    return TensorMeta(a.dtype, a.sizes, tuple(stride), 0, a.device)


copy_strided = prim(
    "copy_strided",
    "(Tensor a, int[] stride) -> Tensor",
    meta=_copy_strided_meta,
    ref=lambda a, stride: torch.empty_strided(
        a.shape, _ints(stride), dtype=a.dtype, device=a.device
    ).copy_(a),
    canon=lambda a, stride: ((a, tuple(stride)), {}),
    tags=_MOVE,
    doc="a copy of a with the given strides (the layout decompositions choose explicitly)",
)

device_put = prim(
    "device_put",
    "(Tensor a, device device) -> Tensor",
    meta=lambda a, device: TensorMeta(
        a.dtype, a.sizes, utils.preserve_format_strides(a.sizes, a.strides), 0, str(device)
    ),
    ref=lambda a, device: a.to(device, copy=True),
    tags=_MOVE,
    doc="a copied to device",
)


def _rev_canon(a, dims):
    return (a, tuple(sorted(utils.canonicalize_dims(a.ndim, dims)))), {}


rev = prim(
    "rev",
    "(Tensor a, int[] dims) -> Tensor",
    meta=lambda a, dims: TensorMeta(
        a.dtype, a.sizes, utils.elementwise_output_strides(a), 0, a.device
    ),
    ref=lambda a, dims: torch.flip(a, dims) if dims else a.clone(),
    canon=_rev_canon,
    tags=_MOVE,
    doc="a reversed along dims (torch.flip)",
)
