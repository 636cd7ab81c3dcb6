"""Reductions: sum, mean, var/std, amax/amin, max/min, argmax, prod, any/all, norms, softmax."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, c, canon_dims, convert, is_float, is_integral, like, numel
from ._registry import register_decomposition


def _dims(x, dim):
    """Canonical reduction dims of x (a 0-dim tensor reduces over nothing)."""
    if x.ndim == 0:
        if dim is not None and not isinstance(dim, int):
            for d in dim:
                utils.canonicalize_dim(0, d)
        elif isinstance(dim, int):
            utils.canonicalize_dim(0, dim)
        return ()
    if isinstance(dim, int):
        dim = (dim,)
    return canon_dims(x.ndim, dim)


def _finish(out, dims, keepdim):
    if keepdim and dims:
        return prims.expand_dims(out, tuple(sorted(dims)))
    return out


def _reduce(prim_name, x, dims, keepdim):
    """Apply a reduction prim over dims (none: the value itself), restoring dims on keepdim."""
    # No dims: the value itself, as a new tensor (eager never returns an alias of its input).
    out = getattr(prims, prim_name)(x, tuple(dims)) if dims else prims.clone(x)
    return _finish(out, dims, keepdim)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch accumulates a sum in: float32 for 16-bit floats, int64 for integers."""
    if is_integral(dtype):
        return torch.int64
    return utils.opmath_dtype(dtype)


@register_decomposition(aten.sum)
def sum(self, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or (torch.int64 if is_integral(self.dtype) else self.dtype)
    dims = _dims(self, dim)
    x = convert(self, acc_dtype(out_dtype) if dtype is None or not is_integral(dtype) else dtype)
    return convert(_reduce("sum", x, dims, keepdim), out_dtype)


@register_decomposition(aten.nansum)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    if is_float(self.dtype):
        self = prims.where(prims.ne(self, self), c(0, self), self)
    return aten.sum(self, dim, keepdim, dtype=dtype)


@register_decomposition(aten.mean)
def mean(self, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or self.dtype
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        raise TypeError(f"mean(): could not infer output dtype from {self.dtype}")
    dims = _dims(self, dim)
    x = convert(self, utils.opmath_dtype(out_dtype))
    total = _reduce("sum", x, dims, keepdim)
    count = numel([self.shape[d] for d in dims])
    return convert(prims.div(total, c(count, total)), out_dtype)


def _var(self, dim, correction, keepdim):
    if correction is None:
        correction = 1
    dims = _dims(self, dim)
    compute = utils.opmath_dtype(self.dtype if is_float(self.dtype) else torch.get_default_dtype())
    x = convert(self, compute)
    if not dims:
        # var over no dims: every group has one element (0/(1-c) like torch: nan for c >= 1).
        n = 1
        out = prims.div(prims.sub(x, x), c(max(0, n - correction), x))
        return out, x
    out = _finish(prims.var(x, dims, correction), dims, keepdim)
    return out, compute


@register_decomposition(aten.var)
def var(self, dim=None, *, correction=None, keepdim=False):
    out, _ = _var(self, dim, correction, keepdim)
    return convert(out, _real_out(self))


def _real_out(x):
    return x.dtype if is_float(x.dtype) else torch.get_default_dtype()


@register_decomposition(aten.std)
def std(self, dim=None, *, correction=None, keepdim=False):
    out, _ = _var(self, dim, correction, keepdim)
    return convert(prims.sqrt(out), _real_out(self))


@register_decomposition(aten.var_mean)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    out, _ = _var(self, dim, correction, keepdim)
    return convert(out, _real_out(self)), aten.mean(self, dim, keepdim)


@register_decomposition(aten.std_mean)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    out, _ = _var(self, dim, correction, keepdim)
    return convert(prims.sqrt(out), _real_out(self)), aten.mean(self, dim, keepdim)


@register_decomposition(aten.amax)
def amax(self, dim=(), keepdim=False):
    return _reduce("amax", self, _dims(self, dim), keepdim)


@register_decomposition(aten.amin)
def amin(self, dim=(), keepdim=False):
    return _reduce("amin", self, _dims(self, dim), keepdim)


@register_decomposition(aten.aminmax)
def aminmax(self, *, dim=None, keepdim=False):
    return aten.amin(self, () if dim is None else dim, keepdim), aten.amax(
        self, () if dim is None else dim, keepdim
    )


def _arg_reduce(x, dim, keepdim, largest: bool):
    """Index of the first max (min) along dim (of the flattened tensor when dim is None)."""
    prim = prims.argmax if largest else prims.argmin
    if x.dtype is torch.bool:
        x = convert(x, torch.uint8)
    if x.ndim == 0:
        if dim is not None:
            utils.canonicalize_dim(0, dim)
        return like(0, x, torch.int64)
    if dim is None:
        out = prim(x, None)
        return prims.reshape(out, (1,) * x.ndim) if keepdim else out
    dim = utils.canonicalize_dim(x.ndim, dim)
    return _finish(prim(x, dim), (dim,), keepdim)


@register_decomposition(aten.argmax)
def argmax(self, dim=None, keepdim=False):
    return _arg_reduce(self, dim, keepdim, largest=True)


@register_decomposition(aten.argmin)
def argmin(self, dim=None, keepdim=False):
    return _arg_reduce(self, dim, keepdim, largest=False)


@register_decomposition(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return aten.amax(self, [dim], keepdim), _arg_reduce(self, dim, keepdim, largest=True)


@register_decomposition(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return aten.amin(self, [dim], keepdim), _arg_reduce(self, dim, keepdim, largest=False)


@register_decomposition(aten.max.default)
def max_all(self):
    return aten.amax(self)


@register_decomposition(aten.min.default)
def min_all(self):
    return aten.amin(self)


@register_decomposition(aten.max.other)
def max_other(self, other):
    return aten.maximum(self, other)


@register_decomposition(aten.min.other)
def min_other(self, other):
    return aten.minimum(self, other)


@register_decomposition(aten.prod)
def prod(self, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or (torch.int64 if is_integral(self.dtype) else self.dtype)
    dims = _dims(self, dim)
    x = convert(self, acc_dtype(out_dtype) if not is_integral(out_dtype) else out_dtype)
    return convert(_reduce("prod", x, dims, keepdim), out_dtype)


def _bool_reduce(prim_name, self, dim, keepdim):
    dims = _dims(self, dim)
    if not dims:
        out = prims.ne(self, c(0, self)) if self.dtype is not torch.bool else prims.clone(self)
    else:
        out = _reduce(prim_name, self, dims, keepdim)
    # torch keeps uint8 for uint8 inputs (a legacy rule); everything else gives bool.
    return convert(out, torch.uint8) if self.dtype is torch.uint8 else out


@register_decomposition(aten.any)
def any(self, dim=None, keepdim=False):
    return _bool_reduce("any", self, dim, keepdim)


@register_decomposition(aten.all)
def all(self, dim=None, keepdim=False):
    return _bool_reduce("all", self, dim, keepdim)


@register_decomposition(aten.count_nonzero)
def count_nonzero(self, dim=None):
    x = convert(prims.ne(self, c(0, self)), torch.int64)
    return _reduce("sum", x, _dims(self, dim), False)


@register_decomposition(aten.linalg_vector_norm)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or self.dtype
    x = convert(self, utils.opmath_dtype(out_dtype))
    dims = _dims(self, dim)
    a = prims.abs(x)
    if ord == math.inf:
        out = _reduce("amax", a, dims, keepdim)
    elif ord == -math.inf:
        out = _reduce("amin", a, dims, keepdim)
    elif ord == 0:
        out = _reduce("sum", convert(prims.ne(x, c(0, x)), x.dtype), dims, keepdim)
    elif ord == 1:
        out = _reduce("sum", a, dims, keepdim)
    elif ord == 2:
        out = prims.sqrt(_reduce("sum", prims.mul(x, x), dims, keepdim))
    else:
        s = _reduce("sum", prims.pow(a, c(float(ord), a)), dims, keepdim)
        out = prims.pow(s, c(1.0 / ord, s))
    return convert(out, out_dtype)


@register_decomposition(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dtype)
def norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
    return aten.linalg_vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@register_decomposition(aten.norm.ScalarOpt_dim_dtype)
def norm_dtype(self, p, dim, keepdim, *, dtype):
    return aten.linalg_vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@register_decomposition(aten.logsumexp)
def logsumexp(self, dim, keepdim=False):
    out_dtype = self.dtype if is_float(self.dtype) else torch.get_default_dtype()
    x = convert(self, utils.opmath_dtype(out_dtype))
    dims = _dims(self, dim)
    if not dims:
        return prims.clone(convert(x, out_dtype))
    m = prims.amax(x, dims)
    # An all -inf (or +inf) slice would give inf - inf; shift by 0 there instead.
    m = prims.where(prims.eq(prims.abs(m), c(math.inf, m)), c(0.0, m), m)
    keep = tuple(i for i in range(x.ndim) if i not in dims)
    mb = prims.broadcast_in_dim(m, tuple(x.shape), keep)
    s = prims.sum(prims.exp(prims.sub(x, mb)), dims)
    out = prims.add(prims.log(s), m)
    return convert(_finish(out, dims, keepdim), out_dtype)


def _softmax_parts(x, dim):
    dim = utils.canonicalize_dim(x.ndim, dim)
    if x.ndim == 0 or x.shape[dim] == 0:
        return x, None, ()
    keep = tuple(i for i in range(x.ndim) if i != dim)
    m = prims.amax(x, (dim,))
    m = prims.where(prims.eq(prims.abs(m), c(math.inf, m)), c(0.0, m), m)
    shifted = prims.sub(x, prims.broadcast_in_dim(m, tuple(x.shape), keep))
    return shifted, dim, keep


def _sum_keep(x, dim, keep):
    return prims.broadcast_in_dim(prims.sum(x, (dim,)), tuple(x.shape), keep)


@register_decomposition(aten._softmax)
def _softmax(self, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else self.dtype
    x = convert(self, utils.opmath_dtype(self.dtype))
    shifted, d, keep = _softmax_parts(x, dim)
    if d is None:  # a 0-dim tensor is its own softmax group; an empty dim has no groups
        return like(1.0 if x.ndim == 0 else 0.0, x, out_dtype)
    e = prims.exp(shifted)
    return convert(prims.div(e, _sum_keep(e, d, keep)), out_dtype)


@register_decomposition(aten._log_softmax)
def _log_softmax(self, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else self.dtype
    x = convert(self, utils.opmath_dtype(self.dtype))
    shifted, d, keep = _softmax_parts(x, dim)
    if d is None:
        return like(0.0, x, out_dtype)
    lse = prims.log(_sum_keep(prims.exp(shifted), d, keep))
    return convert(prims.sub(shifted, lse), out_dtype)


@register_decomposition(aten._safe_softmax)
def _safe_softmax(self, dim, dtype=None):
    x = convert(self, dtype) if dtype is not None else self
    out = aten._softmax(x, dim, False)
    # Rows that are entirely -inf give 0 instead of NaN.
    all_masked = aten.all(aten.eq(x, -math.inf), dim, True)
    return aten.where(all_masked, 0.0, out)


@register_decomposition(aten._softmax_backward_data)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g = convert(grad_output, utils.opmath_dtype(grad_output.dtype))
    y = convert(output, g.dtype)
    if y.ndim == 0:
        return convert(prims.sub(g, g), input_dtype)
    d = utils.canonicalize_dim(y.ndim, dim)
    keep = tuple(i for i in range(y.ndim) if i != d)
    gy = prims.mul(g, y)
    out = prims.sub(gy, prims.mul(y, _sum_keep(gy, d, keep)))
    return convert(out, input_dtype)


@register_decomposition(aten._log_softmax_backward_data)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g = convert(grad_output, utils.opmath_dtype(grad_output.dtype))
    y = convert(output, g.dtype)
    if y.ndim == 0:
        return convert(prims.sub(g, g), input_dtype)
    d = utils.canonicalize_dim(y.ndim, dim)
    keep = tuple(i for i in range(y.ndim) if i != d)
    out = prims.sub(g, prims.mul(prims.exp(y), _sum_keep(g, d, keep)))
    return convert(out, input_dtype)
