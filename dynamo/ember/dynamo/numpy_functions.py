"""NumPy mapping table entries: reductions, products, shapes, joins, selection and metadata.

Each entry is registered into numpy_map's table with `register` (np.<name>) and `method`
(ndarray.<name>); it computes NumPy's result dtype and returns the value as NumPy would (0-d
results of reductions are NumPy scalars).
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from . import variables as V
from .exc import Unsupported
from .numpy_map import (NO, asarray, axes_arg, const, given, graph_call, graph_method, keep,
                        method, refuse, register, shape_arg)  # fmt: skip
from .numpy_device import copied_view
from .numpy_values import (apply_ufunc, as_tensor, cast, dtype_arg, getitem, key_for_result_type,
                           np_dtype, operand, result, setitem, shape_of, static_shape,
                           write_back)  # fmt: skip


# -- reductions -----------------------------------------------------------------------------------
def _sum_dtype(dt: np.dtype) -> np.dtype:
    """np.sum's accumulator: small ints (and bool) widen to the platform integer."""
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 8):
        return np.dtype(np.int64)
    if dt.kind == "u" and dt.itemsize < 8:
        return np.dtype(np.uint64)
    return dt


def _mean_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt.kind in "biu" else dt


def _reduce(tx, fn, a, axis, keepdims, dt, **extra):
    a = asarray(tx, a)
    t = cast(tx, a.tensor, dt) if dt is not None else a.tensor
    axes = axes_arg(axis, t.example.dim())
    if axes == ():  # reducing over no axis: the elements themselves
        return result(graph_method(tx, "clone", t))
    dims = axes if axes is not None else tuple(range(t.example.dim()))
    out = graph_call(tx, fn, t, dim=dims, keepdim=keep(keepdims), **extra)
    return result(cast(tx, out, dt) if dt is not None else out)  # torch sums uint8 to int64


@register("sum")
@method("sum")
def np_sum(tx, a, axis=NO, dtype=NO, out=NO, keepdims=NO, initial=NO, where=NO):
    refuse("np.sum", out=out, initial=initial, where=where)
    dt = dtype_arg(dtype) or _sum_dtype(np_dtype(asarray(tx, a)))
    return _reduce(tx, torch.sum, a, axis, keepdims, dt)


@register("prod")
@method("prod")
def np_prod(tx, a, axis=NO, dtype=NO, out=NO, keepdims=NO, initial=NO, where=NO):
    refuse("np.prod", out=out, initial=initial, where=where)
    a = asarray(tx, a)
    dt = dtype_arg(dtype) or _sum_dtype(np_dtype(a))
    axes = axes_arg(axis, a.tensor.example.dim())
    t = cast(tx, a.tensor, dt)
    if axes is None:  # torch.prod takes one dim at a time
        out = graph_call(tx, torch.prod, graph_method(tx, "reshape", t, (-1,)), 0)
        if keep(keepdims):
            out = graph_method(tx, "reshape", out, (1,) * t.example.dim())
        return result(cast(tx, out, dt))
    for d in sorted(axes, reverse=True):
        t = graph_call(tx, torch.prod, t, d, keepdim=keep(keepdims))
    return result(cast(tx, t, dt))


@register("mean")
@method("mean")
def np_mean(tx, a, axis=NO, dtype=NO, out=NO, keepdims=NO, where=NO):
    refuse("np.mean", out=out, where=where)
    dt = dtype_arg(dtype) or _mean_dtype(np_dtype(asarray(tx, a)))
    return _reduce(tx, torch.mean, a, axis, keepdims, dt)


def _var_like(fn, name):
    def impl(tx, a, axis=NO, dtype=NO, out=NO, ddof=0, keepdims=NO, where=NO, mean=NO,
             correction=NO):  # fmt: skip
        refuse(name, out=out, where=where, mean=mean, correction=correction)
        dt = dtype_arg(dtype) or _mean_dtype(np_dtype(asarray(tx, a)))
        if dt.kind == "c":
            raise Unsupported(f"{name} of a complex array")
        ddof = const(ddof, "ddof")
        return _reduce(tx, fn, a, axis, keepdims, dt, correction=ddof)

    return impl


register("std")(method("std")(_var_like(torch.std, "np.std")))
register("var")(method("var")(_var_like(torch.var, "np.var")))


def _extreme(fn, name):
    def impl(tx, a, axis=NO, out=NO, keepdims=NO, initial=NO, where=NO):
        refuse(name, out=out, initial=initial, where=where)
        a = asarray(tx, a)
        if np_dtype(a).kind == "c":
            raise Unsupported(f"{name} of a complex array")
        if a.tensor.example.numel() == 0:
            raise Unsupported(f"{name} of an empty array (NumPy raises ValueError)")
        return _reduce(tx, fn, a, axis, keepdims, None)

    return impl


register("max", "amax")(method("max")(_extreme(torch.amax, "np.max")))
register("min", "amin")(method("min")(_extreme(torch.amin, "np.min")))


def _arg_extreme(fn, name):
    def impl(tx, a, axis=NO, out=NO, keepdims=NO):
        refuse(name, out=out)
        a = asarray(tx, a)
        t, ndim = a.tensor, a.tensor.example.dim()
        if t.example.numel() == 0 or np_dtype(a).kind == "c":
            raise Unsupported(f"{name} of an empty or complex array")
        if np_dtype(a).kind == "b":  # torch's argmax takes no bool
            t = cast(tx, t, np.dtype(np.uint8))
        axes = axes_arg(axis, ndim)
        if axes is None:
            out = graph_call(tx, fn, t)
            if keep(keepdims):
                out = graph_method(tx, "reshape", out, (1,) * ndim)
            return result(out)
        return result(graph_call(tx, fn, t, axes[0], keepdim=keep(keepdims)))

    return impl


register("argmax")(method("argmax")(_arg_extreme(torch.argmax, "np.argmax")))
register("argmin")(method("argmin")(_arg_extreme(torch.argmin, "np.argmin")))


def _logical(fn, name):
    def impl(tx, a, axis=NO, out=NO, keepdims=NO, where=NO):
        refuse(name, out=out, where=where)
        return _reduce(tx, fn, a, axis, keepdims, np.dtype(bool))

    return impl


register("all")(method("all")(_logical(torch.all, "np.all")))
register("any")(method("any")(_logical(torch.any, "np.any")))


def _cumulative(fn, name):
    def impl(tx, a, axis=NO, dtype=NO, out=NO):
        refuse(name, out=out)
        a = asarray(tx, a)
        dt = dtype_arg(dtype) or _sum_dtype(np_dtype(a))
        t = cast(tx, a.tensor, dt)
        axes = axes_arg(axis, t.example.dim())
        if axes is None:
            t, axes = graph_method(tx, "reshape", t, (-1,)), (0,)
        return result(cast(tx, graph_call(tx, fn, t, axes[0]), dt), False)

    return impl


register("cumsum")(method("cumsum")(_cumulative(torch.cumsum, "np.cumsum")))
register("cumprod")(method("cumprod")(_cumulative(torch.cumprod, "np.cumprod")))


@register("linalg.norm")
def np_norm(tx, x, ord=None, axis=None, keepdims=False):
    if given(ord):
        raise Unsupported("np.linalg.norm(..., ord=...) is not supported in compiled code")
    a = asarray(tx, x)
    dt = np_dtype(a)
    dt = np.dtype(np.float64) if dt.kind in "biu" else dt
    axes = axes_arg(axis, a.tensor.example.dim())
    out = graph_call(tx, torch.linalg.vector_norm, cast(tx, a.tensor, dt), 2, dim=axes,
                keepdim=keep(keepdims))
    return result(cast(tx, out, np.dtype(dt.type(0).real.dtype)))


# -- products -------------------------------------------------------------------------------------
@register("dot")
@method("dot")
def np_dot(tx, a, b, out=NO):
    refuse("np.dot", out=out)
    a, b = asarray(tx, a), asarray(tx, b)
    if a.tensor.example.dim() == 0 or b.tensor.example.dim() == 0:
        return apply_ufunc(tx, np.multiply, operator.mul, [a, b], {})
    if a.tensor.example.dim() > 2 or b.tensor.example.dim() > 2:
        raise Unsupported("np.dot of arrays with more than 2 dimensions")
    dt = np.result_type(np_dtype(a), np_dtype(b))
    return result(graph_call(tx, torch.matmul, cast(tx, a.tensor, dt), cast(tx, b.tensor, dt)))


@register("outer")
def np_outer(tx, a, b, out=NO):
    refuse("np.outer", out=out)
    a, b = asarray(tx, a), asarray(tx, b)
    dt = np.result_type(np_dtype(a), np_dtype(b))
    flat = [graph_method(tx, "reshape", cast(tx, x.tensor, dt), (-1,)) for x in (a, b)]
    return result(graph_call(tx, torch.outer, *flat), False)


# -- shapes ---------------------------------------------------------------------------------------
def _reshape(tx, a, shape, order, copy):
    if given(copy) or (order is not NO and const(order, "order") != "C"):
        raise Unsupported("reshape with order= other than 'C' or copy= in compiled code")
    a = asarray(tx, a)
    return result(graph_method(tx, "reshape", a.tensor, shape), False)


@register("reshape")
def np_reshape(tx, a, shape, order=NO, *, copy=NO):
    return _reshape(tx, a, shape_arg(shape), order, copy)


@method("reshape")
def ndarray_reshape(tx, a, *shape, order=NO, copy=NO):
    dims = shape_arg(shape[0]) if len(shape) == 1 else shape_arg(V.ListVT(list(shape)))
    return _reshape(tx, a, dims, order, copy)


def _permute(tx, a, axes):
    a = asarray(tx, a)
    ndim = a.tensor.example.dim()
    perm = tuple(reversed(range(ndim))) if axes is None else axes_arg(V.ConstVT(axes), ndim, "axes")
    if sorted(perm) != list(range(ndim)):
        raise Unsupported(f"transpose axes {axes!r} are not a permutation")
    return result(graph_method(tx, "permute", a.tensor, perm), False)


@register("transpose")
def np_transpose(tx, a, axes=NO):
    return _permute(tx, a, None if not given(axes) else const(axes, "axes"))


@method("transpose")
def ndarray_transpose(tx, a, *axes):
    if len(axes) == 1:
        value = const(axes[0], "axes")
        return _permute(tx, a, None if value is None else value)
    return _permute(tx, a, tuple(const(x, "axes") for x in axes) if axes else None)


@register("swapaxes")
@method("swapaxes")
def np_swapaxes(tx, a, axis1, axis2):
    a = asarray(tx, a)
    d1, d2 = const(axis1), const(axis2)
    return result(graph_call(tx, torch.transpose, a.tensor, d1, d2), False)


@register("moveaxis")
def np_moveaxis(tx, a, source, destination):
    a = asarray(tx, a)
    return result(graph_call(tx, torch.movedim, a.tensor, const(source), const(destination)), False)


@register("expand_dims")
def np_expand_dims(tx, a, axis):
    a = asarray(tx, a)
    t = a.tensor
    axes = axes_arg(axis, t.example.dim() + len(shape_arg(axis, "axis")))
    for d in sorted(axes):  # unsqueeze, not reshape: no size is read (they may be dynamic)
        t = graph_method(tx, "unsqueeze", t, d)
    return result(t, False)


@register("squeeze")
@method("squeeze")
def np_squeeze(tx, a, axis=NO):
    a = asarray(tx, a)
    # Which sizes are 1 holds for every size a graph runs with: dynamic sizes are at least 2.
    shape = a.tensor.example.shape
    axes = axes_arg(axis, len(shape))
    if axes is None:
        axes = tuple(d for d, n in enumerate(shape) if n == 1)
    if any(shape[d] != 1 for d in axes):  # NumPy raises; torch would leave the axis
        raise Unsupported("np.squeeze of an axis whose size is not 1")
    if not axes:
        return result(graph_method(tx, "view", a.tensor, shape_of(tx, a)), False)
    return result(graph_method(tx, "squeeze", a.tensor, tuple(axes)), False)


@register("ravel")
@method("ravel")
def np_ravel(tx, a, order=NO):
    return _reshape(tx, a, (-1,), order, NO)


@method("flatten")
def ndarray_flatten(tx, a, order=NO):
    flat = _reshape(tx, a, (-1,), order, NO)  # flatten always copies
    return result(graph_method(tx, "clone", flat.tensor), False)


@register("broadcast_to")
def np_broadcast_to(tx, array, shape, subok=False):
    a = asarray(tx, array)
    out = result(graph_method(tx, "expand", a.tensor, shape_arg(shape)), False)
    out.readonly = True  # NumPy's broadcast view is read-only
    return out


def _atleast(n):
    def impl(tx, *arys):
        if len(arys) != 1:
            raise Unsupported(f"np.atleast_{n}d of several arrays")
        a = asarray(tx, arys[0])
        t = a.tensor
        if t.example.dim() >= n:
            return V.NdarrayVT(t)
        for _ in range(n - t.example.dim()):  # (N,) -> (1, N), () -> (1,) or (1, 1)
            t = graph_method(tx, "unsqueeze", t, 0)
        return result(t, False)

    return impl


register("atleast_1d")(_atleast(1))
register("atleast_2d")(_atleast(2))


def _joined(tx, arrays, dtype):
    """The arrays of a join, cast to their common dtype (NumPy's result_type)."""
    from .calls import unpack

    items = [asarray(tx, x) for x in unpack(tx, arrays)]
    if not items:
        raise Unsupported("joining no arrays")
    dt = dtype_arg(dtype) or np.result_type(*[np_dtype(x) for x in items])
    return [cast(tx, x.tensor, dt) for x in items]


@register("concatenate", "concat")
def np_concatenate(tx, arrays, axis=0, out=NO, *, dtype=NO, casting=NO):
    refuse("np.concatenate", out=out, casting=casting)
    ts = _joined(tx, arrays, dtype)
    axis = const(axis)
    if axis is None:
        ts, axis = [graph_method(tx, "reshape", t, (-1,)) for t in ts], 0
    return result(graph_call(tx, torch.cat, V.ListVT(ts), axis), False)


@register("stack")
def np_stack(tx, arrays, axis=0, out=NO, *, dtype=NO, casting=NO):
    refuse("np.stack", out=out, casting=casting)
    ts = _joined(tx, arrays, dtype)
    axis = const(axis)
    return result(graph_call(tx, torch.stack, V.ListVT(ts), axis), False)


@register("vstack")
def np_vstack(tx, tup, *, dtype=NO, casting=NO):
    refuse("np.vstack", casting=casting)
    ts = [_at_least_2d(tx, t) for t in _joined(tx, tup, dtype)]
    return result(graph_call(tx, torch.cat, V.ListVT(ts), 0), False)


def _at_least_2d(tx, t):
    for _ in range(2 - t.example.dim()):  # unsqueeze: no size is read (they may be dynamic)
        t = graph_method(tx, "unsqueeze", t, 0)
    return t


@register("hstack")
def np_hstack(tx, tup, *, dtype=NO, casting=NO):
    refuse("np.hstack", casting=casting)
    ts = [t if t.example.dim() else graph_method(tx, "reshape", t, (1,))
          for t in _joined(tx, tup, dtype)]  # fmt: skip
    axis = 0 if ts[0].example.dim() == 1 else 1  # as NumPy decides it
    return result(graph_call(tx, torch.cat, V.ListVT(ts), axis), False)


@register("flip")
def np_flip(tx, m, axis=NO):
    a = asarray(tx, m)
    axes = axes_arg(axis, a.tensor.example.dim())
    dims = axes if axes is not None else tuple(range(a.tensor.example.dim()))
    return copied_view(tx, a, result(graph_call(tx, torch.flip, a.tensor, dims), False))


@register("roll")
def np_roll(tx, a, shift, axis=NO):
    a = asarray(tx, a)
    axes = axes_arg(axis, a.tensor.example.dim())
    shift = const(shift, "shift")
    if axes is None:
        return result(graph_call(tx, torch.roll, a.tensor, shift), False)
    return result(graph_call(tx, torch.roll, a.tensor, shift, axes), False)


@register("repeat")
@method("repeat")
def np_repeat(tx, a, repeats, axis=NO):
    a = asarray(tx, a)
    n = const(repeats, "repeats")
    if not isinstance(n, int):
        raise Unsupported("np.repeat with per-element repeats")
    axes = axes_arg(axis, a.tensor.example.dim())
    dim = {} if axes is None else {"dim": axes[0]}
    return result(graph_call(tx, torch.repeat_interleave, a.tensor, n, **dim), False)


@register("tile")
def np_tile(tx, A, reps):
    a = asarray(tx, A)
    return result(graph_call(tx, torch.tile, a.tensor, shape_arg(reps, "reps")), False)


# -- selection and rounding -----------------------------------------------------------------------
@register("where")
def np_where(tx, condition, x=NO, y=NO):
    if x is NO or y is NO:
        raise Unsupported("np.where(condition) (output shape depends on data)")
    cond = cast(tx, asarray(tx, condition).tensor, np.dtype(bool))
    ops = [operand(tx, v) for v in (x, y)]
    dt = np.result_type(*[key_for_result_type(op) for op in ops])
    tx_, ty = (as_tensor(tx, op, dt) for op in ops)
    return result(graph_call(tx, torch.where, cond, tx_, ty), False)


@register("clip")
@method("clip")
def np_clip(tx, a, a_min=NO, a_max=NO, out=NO, *, min=NO, max=NO, **kwargs):
    refuse("np.clip", out=out, **kwargs)
    lo = a_min if given(a_min) else min
    hi = a_max if given(a_max) else max
    if not given(lo) and not given(hi):
        raise Unsupported("np.clip without bounds")
    if not given(lo):
        return apply_ufunc(tx, np.minimum, torch.minimum, [a, hi], {})
    if not given(hi):
        return apply_ufunc(tx, np.maximum, torch.maximum, [a, lo], {})
    return apply_ufunc(tx, np._core.umath.clip, torch.clamp, [a, lo, hi], {})


@register("round", "around")
@method("round")
def np_round(tx, a, decimals=0, out=NO):
    refuse("np.round", out=out)
    a = asarray(tx, a)
    d = const(decimals, "decimals")
    kind = np_dtype(a).kind
    if kind in "biu":
        if d < 0:
            raise Unsupported("np.round of integers to negative decimals")
        return V.NdarrayVT(graph_method(tx, "clone", a.tensor), a.scalar)
    if kind == "c":
        raise Unsupported("np.round of a complex array")
    return V.NdarrayVT(graph_call(tx, torch.round, a.tensor, decimals=d), a.scalar)


@register("isclose")
def np_isclose(tx, a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    a, b = asarray(tx, a), asarray(tx, b)
    dt = np.result_type(np_dtype(a), np_dtype(b), 1.0)
    c = [const(v) for v in (rtol, atol, equal_nan)]
    out = graph_call(tx, torch.isclose, cast(tx, a.tensor, dt), cast(tx, b.tensor, dt),
                     rtol=c[0], atol=c[1], equal_nan=c[2])  # fmt: skip
    return result(out)


@method("__getitem__")
def ndarray_getitem(tx, a, key):
    return getitem(tx, a, key)


@method("__setitem__")
def ndarray_setitem(tx, a, key, value):
    setitem(tx, a, key, value)
    return V.ConstVT(None)


# -- metadata -------------------------------------------------------------------------------------
@register("shape")
def np_shape(tx, a):
    return shape_of(tx, asarray(tx, a))


@register("ndim")
def np_ndim(tx, a):
    return V.ConstVT(asarray(tx, a).tensor.example.dim())


@register("size")
def np_size(tx, a, axis=NO):
    shape = static_shape(asarray(tx, a).tensor, "np.size")
    axes = axes_arg(axis, len(shape))
    return V.ConstVT(int(np.prod([shape[d] for d in axes])) if axes else shape.numel())


# -- sorting, differences, order statistics, einsum -----------------------------------------------
def _sorted_values(tx, a, axis, what):
    a = asarray(tx, a)
    if np_dtype(a).kind == "c":
        raise Unsupported(f"{what} of a complex array")
    t = a.tensor
    axes = axes_arg(axis, t.example.dim())
    if axes is None:
        t, axes = graph_method(tx, "reshape", t, (-1,)), (0,)
    # Values only: equal keys are indistinguishable, so NumPy's unstable sort gives the same
    # values (NaN last in both).
    return graph_call(tx, torch.sort, t, axes[0]).items[0]  # (values, indices)


@register("sort")
def np_sort(tx, a, axis=-1, kind=NO, order=NO, *, stable=NO):
    refuse("np.sort", order=order)
    return result(_sorted_values(tx, a, axis, "np.sort"), False)


@method("sort")
def ndarray_sort(tx, a, axis=-1, kind=NO, order=NO, *, stable=NO):
    refuse("ndarray.sort", order=order)
    if axes_arg(axis, a.tensor.example.dim()) is None:
        raise Unsupported("ndarray.sort(axis=None)")
    write_back(tx, a, result(_sorted_values(tx, a, axis, "ndarray.sort"), False), "sort")
    return V.ConstVT(None)


@register("diff")
def np_diff(tx, a, n=1, axis=-1, prepend=NO, append=NO):
    refuse("np.diff", prepend=prepend, append=append)
    a = asarray(tx, a)
    n = const(n, "n")
    if n == 0:
        return a
    axes = axes_arg(axis, a.tensor.example.dim())
    return result(graph_call(tx, torch.diff, a.tensor, n, axes[0]), False)


@register("median")
def np_median(tx, a, axis=None, out=NO, overwrite_input=False, keepdims=False):
    refuse("np.median", out=out)
    a = asarray(tx, a)
    dt = _mean_dtype(np_dtype(a))
    if dt.kind != "f" or dt.itemsize < 4:
        raise Unsupported(f"np.median of a {np_dtype(a)} array")
    t, ndim = cast(tx, a.tensor, dt), a.tensor.example.dim()
    axes = axes_arg(axis, ndim)
    if axes is not None and len(axes) != 1:
        raise Unsupported("np.median over several axes")
    if axes is None:  # the median of every element: linear interpolation at 0.5 is NumPy's mean
        out = graph_call(tx, torch.quantile, graph_method(tx, "reshape", t, (-1,)), 0.5)
        if keep(keepdims):
            out = graph_method(tx, "reshape", out, (1,) * ndim)
        return result(out)
    return result(graph_call(tx, torch.quantile, t, 0.5, dim=axes[0], keepdim=keep(keepdims)))


@register("einsum")
def np_einsum(tx, subscripts, *operands, out=NO, dtype=NO, order=NO, casting=NO, optimize=NO):
    refuse("np.einsum", out=out, order=order, casting=casting)
    spec = const(subscripts, "einsum subscripts")
    if not isinstance(spec, str) or not operands:
        raise Unsupported("np.einsum in its operand-list form")
    arrays = [asarray(tx, x) for x in operands]
    dt = dtype_arg(dtype) or np.result_type(*[np_dtype(x) for x in arrays])
    out = graph_call(tx, torch.einsum, spec, *[cast(tx, x.tensor, dt) for x in arrays])
    return result(out)
