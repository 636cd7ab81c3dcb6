"""Reduction prims: the reduced dims are removed (keepdim is a broadcast_in_dim afterwards).

`dims` lists the reduced dimensions; an empty list reduces nothing (a full reduction names every
dim). Outputs are contiguous. Accumulation happens in the output dtype's opmath type, as in torch.
"""

from __future__ import annotations

import builtins

import torch

from ember.ir import TensorMeta

from .. import utils
from .core import prim

_REDUCTION = ("reduction",)


def _dims_canon(a, dims, *rest, **kwargs):
    return (a, tuple(sorted(utils.canonicalize_dims(a.ndim, dims))), *rest), kwargs


def _out_meta(a, dims, dtype) -> TensorMeta:
    sizes = utils.reduction_output_shape(a.sizes, dims)
    return TensorMeta(dtype, sizes, utils.make_contiguous_strides_for(sizes), 0, a.device)


def _reduce(fn, a, dims, **kwargs):
    # torch reads an empty dim list as "every dim"; for a prim it means "no dim": reduce over a
    # new trailing size-1 dim instead.
    if not dims:
        return fn(a.unsqueeze(-1), [-1], **kwargs).contiguous()
    return fn(a, list(dims), **kwargs).contiguous()


def _check_dims(name, a, dims):
    if len(set(dims)) != len(dims) or builtins.any(
        not 0 <= d < builtins.max(a.ndim, 1) for d in dims
    ):
        raise ValueError(f"prims.{name}: bad dims {dims} for {a.ndim} dims")


def _sum_like(name, fn, cls):
    def meta(a, dims, output_dtype=None):
        _check_dims(name, a, dims)
        if not cls(a.dtype):
            raise TypeError(f"prims.{name} does not accept {a.dtype}")
        return _out_meta(a, dims, output_dtype or a.dtype)

    def ref(a, dims, output_dtype=None):
        return _reduce(fn, a, dims, dtype=output_dtype or a.dtype)

    return prim(
        name,
        "(Tensor a, int[] dims, Optional[dtype] output_dtype=None) -> Tensor",
        meta=meta,
        ref=ref,
        canon=_dims_canon,
        tags=_REDUCTION,
    )


sum = _sum_like("sum", torch.sum, lambda d: True)


def _prod_fn(a, dims, dtype):
    # torch.prod reduces one dim at a time; move the reduced dims last and flatten them.
    moved = a.movedim(tuple(dims), tuple(range(-len(dims), 0))).flatten(-len(dims))
    return torch.prod(moved, -1, dtype=dtype)


prod = _sum_like("prod", _prod_fn, lambda d: True)


def _minmax(name, fn):
    def meta(a, dims):
        _check_dims(name, a, dims)
        if a.dtype.is_complex:
            raise TypeError(f"prims.{name} does not accept complex inputs")
        return _out_meta(a, dims, a.dtype)

    return prim(
        name,
        "(Tensor a, int[] dims) -> Tensor",
        meta=meta,
        ref=lambda a, dims: _reduce(fn, a, dims),
        canon=_dims_canon,
        tags=_REDUCTION,
        doc="NaN-propagating; errors on an empty reduction, as torch does",
    )


amax = _minmax("amax", torch.amax)
amin = _minmax("amin", torch.amin)


def _bool_reduction(name, fn):
    def meta(a, dims):
        _check_dims(name, a, dims)
        return _out_meta(a, dims, torch.bool)

    return prim(
        name,
        "(Tensor a, int[] dims) -> Tensor",
        meta=meta,
        ref=lambda a, dims: _reduce(fn, a, dims),
        canon=_dims_canon,
        tags=_REDUCTION,
    )


any = _bool_reduction("any", lambda a, dims: torch.any(a, dim=tuple(dims)))
all = _bool_reduction("all", lambda a, dims: torch.all(a, dim=tuple(dims)))


def _xor_sum_meta(a, dims):
    _check_dims("xor_sum", a, dims)
    if not (utils.is_integer_dtype(a.dtype) or a.dtype is torch.bool):
        raise TypeError(f"prims.xor_sum takes integer or bool inputs, got {a.dtype}")
    return _out_meta(a, dims, a.dtype)


def _xor_sum_fn(a, dims):
    out = a.movedim(dims, list(range(-len(dims), 0))).flatten(-len(dims))
    acc = torch.zeros(out.shape[:-1], dtype=a.dtype, device=a.device)
    for i in range(out.shape[-1]):
        acc = torch.bitwise_xor(acc, out[..., i])
    return acc


xor_sum = prim(
    "xor_sum",
    "(Tensor a, int[] dims) -> Tensor",
    meta=_xor_sum_meta,
    ref=lambda a, dims: _reduce(_xor_sum_fn, a, dims),
    canon=_dims_canon,
    tags=_REDUCTION,
    doc="bitwise xor of the reduced elements",
)


def _var_meta(a, dims, correction, output_dtype=None):
    _check_dims("var", a, dims)
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise TypeError(f"prims.var takes floating or complex inputs, got {a.dtype}")
    return _out_meta(a, dims, output_dtype or utils.real_dtype(a.dtype))


def _var_ref(a, dims, correction, output_dtype=None):
    out = _reduce(lambda x, d: torch.var(x, d, correction=correction), a, dims)
    return out.to(output_dtype) if output_dtype is not None else out


var = prim(
    "var",
    "(Tensor a, int[] dims, float correction, Optional[dtype] output_dtype=None) -> Tensor",
    meta=_var_meta,
    ref=_var_ref,
    canon=_dims_canon,
    tags=_REDUCTION,
    doc="variance over dims with sum((x - mean)^2) / (N - correction)",
)


def _arg_canon(a, dim=None):
    return (a, None if dim is None else utils.canonicalize_dim(a.ndim, dim)), {}


def _arg_meta(name):
    def meta(a, dim=None):
        if a.dtype.is_complex:
            raise TypeError(f"prims.{name} does not accept complex inputs")
        dims = tuple(range(a.ndim)) if dim is None else (dim,)
        return _out_meta(a, dims, torch.int64)

    return meta


argmax = prim(
    "argmax",
    "(Tensor a, Optional[int] dim=None) -> Tensor",
    meta=_arg_meta("argmax"),
    ref=lambda a, dim=None: torch.argmax(a, dim).contiguous(),
    canon=_arg_canon,
    tags=_REDUCTION,
    doc="index of the first maximum along dim (of the flattened tensor when dim is None)",
)
argmin = prim(
    "argmin",
    "(Tensor a, Optional[int] dim=None) -> Tensor",
    meta=_arg_meta("argmin"),
    ref=lambda a, dim=None: torch.argmin(a, dim).contiguous(),
    canon=_arg_canon,
    tags=_REDUCTION,
    doc="index of the first minimum along dim (of the flattened tensor when dim is None)",
)
