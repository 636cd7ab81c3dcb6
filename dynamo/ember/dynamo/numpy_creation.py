"""NumPy mapping table entries: array creation (float64 by default, as NumPy, made on the device
the arrays compute on), conversion (np.array, np.asarray, astype, copy) and NumPy scalar types
(np.float32(x), np.dtype(x))."""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from . import variables as V
from .exc import Unsupported
from .numpy_map import (FUNCTIONS, NO, asarray, const, given, graph_call, graph_method, method,
                        refuse, register, shape_arg)  # fmt: skip
from .numpy_device import device_kwargs
from .numpy_values import (cast, check_writable, const_tensor, dtype_arg, np_dtype, result,
                           torch_dtype)  # fmt: skip


# -- creation -------------------------------------------------------------------------------------
def _creation(fn, default):
    def impl(tx, shape, dtype=NO, order=NO, *, device=NO, like=NO):
        refuse(f"np.{fn.__name__}", device=device, like=like)
        dt = dtype_arg(dtype) or np.dtype(default)
        out = graph_call(tx, fn, shape_arg(shape), dtype=torch_dtype(dt), **device_kwargs(tx))
        return result(out, False)

    return impl


register("zeros")(_creation(torch.zeros, np.float64))
register("ones")(_creation(torch.ones, np.float64))
register("empty")(_creation(torch.empty, np.float64))


@register("full")
def np_full(tx, shape, fill_value, dtype=NO, order=NO, *, device=NO, like=NO):
    refuse("np.full", device=device, like=like)
    value = const(fill_value, "fill_value")
    dt = dtype_arg(dtype) or np.asarray(value).dtype
    value = dt.type(value).item()
    out = graph_call(tx, torch.full, shape_arg(shape), value, dtype=torch_dtype(dt),
                     **device_kwargs(tx))  # fmt: skip
    return result(out, False)


def _like(fn, fill=False):
    def impl(tx, a, *rest, dtype=NO, order=NO, subok=NO, shape=NO, device=NO):
        refuse(f"np.{fn.__name__}", shape=shape, device=device)
        if len(rest) > (1 if fill else 0):
            dtype = rest[-1]
        a = asarray(tx, a)
        dt = dtype_arg(dtype) or np_dtype(a)
        args = [a.tensor]
        if fill:
            args.append(dt.type(const(rest[0], "fill_value")).item())
        return result(graph_call(tx, fn, *args, dtype=torch_dtype(dt)), False)

    return impl


register("zeros_like")(_like(torch.zeros_like))
register("ones_like")(_like(torch.ones_like))
register("empty_like")(_like(torch.empty_like))
register("full_like")(_like(torch.full_like, fill=True))


@register("arange")
def np_arange(tx, start_or_stop, stop=NO, step=NO, *, dtype=NO, device=NO, like=NO):
    refuse("np.arange", device=device, like=like)
    first, stop, step = (None if v is NO else const(v) for v in (start_or_stop, stop, step))
    start, stop = (0, first) if stop is None else (first, stop)
    step = 1 if step is None else step
    if any(not isinstance(v, (int, float, np.integer, np.floating)) for v in (start, stop, step)):
        raise Unsupported("np.arange with non-real bounds")
    # NumPy picks the dtype from the bounds' types (np.arange(np.int32(5)) is int64): ask it,
    # on an empty range of the same types.
    dt = dtype_arg(dtype) or np.arange(type(start)(0), type(stop)(0), type(step)(1)).dtype
    if dt.kind in "biu" and any(isinstance(v, (float, np.floating)) for v in (start, stop, step)):
        raise Unsupported("np.arange with float bounds and an integer dtype")
    bounds = [v.item() if isinstance(v, np.generic) else v for v in (start, stop, step)]
    if all(isinstance(v, int) for v in bounds):
        expected = len(range(*bounds))
    else:
        expected = max(0, math.ceil((bounds[1] - bounds[0]) / bounds[2]))
    out = graph_call(tx, torch.arange, *bounds, dtype=torch_dtype(dt), **device_kwargs(tx))
    if out.example.shape[0] != expected:  # torch and NumPy round the length differently here
        raise Unsupported(f"np.arange{tuple(bounds)}: torch.arange gives another length")
    return result(out, False)


@register("linspace")
def np_linspace(tx, start, stop, num=50, endpoint=True, retstep=False, dtype=NO, axis=0, *,
                device=NO):  # fmt: skip
    refuse("np.linspace", device=device)
    c = lambda v: const(v)  # noqa: E731
    start, stop, num, endpoint, retstep, axis = map(c, (start, stop, num, endpoint, retstep, axis))
    if not all(isinstance(v, (int, float, np.number)) for v in (start, stop)) or axis != 0:
        raise Unsupported("np.linspace with array bounds or axis != 0")
    ct = np.result_type(start, stop, float(num))  # NumPy computes in this dtype, then casts
    tdt = torch_dtype(ct)
    div = num - 1 if endpoint else num
    delta = float(stop) - float(start)
    y = graph_call(tx, torch.arange, num, dtype=tdt, **device_kwargs(tx))
    step = delta / div if div > 0 else float("nan")
    if div > 0 and step != 0:
        y = graph_call(tx, operator.mul, y, step)
    elif div > 0:
        y = graph_call(tx, operator.mul, graph_call(tx, operator.truediv, y, div), delta)
    else:
        y = graph_call(tx, operator.mul, y, delta)
    y = graph_call(tx, operator.add, y, float(start))
    if endpoint and num > 1:
        last = graph_call(tx, torch.full, (1,), float(stop), dtype=tdt, **device_kwargs(tx))
        head = graph_call(tx, operator.getitem, y, slice(None, -1))
        y = graph_call(tx, torch.cat, V.ListVT([head, last]))
    dt = dtype_arg(dtype) or ct
    if dt.kind in "iu":
        y = graph_call(tx, torch.floor, y)
    out = result(cast(tx, y, dt), False)
    return V.TupleVT([out, V.ConstVT(ct.type(step))]) if retstep else out


@register("eye")
def np_eye(tx, N, M=None, k=0, dtype=NO, order=NO, *, device=NO, like=NO):
    refuse("np.eye", device=device, like=like)
    n, m, k = (const(v) for v in (N, M, k))
    if k != 0:
        raise Unsupported("np.eye with k != 0")
    dt = dtype_arg(dtype) or np.dtype(np.float64)
    out = graph_call(tx, torch.eye, n, n if m is None else m, dtype=torch_dtype(dt),
                     **device_kwargs(tx))  # fmt: skip
    return result(out, False)


@register("identity")
def np_identity(tx, n, dtype=NO, *, like=NO):
    return np_eye(tx, n, dtype=dtype, like=like)


def array_from_sequence(tx, seq, dtype) -> V.NdarrayVT:
    """np.array([...]) of arrays and numbers: stacked in their common dtype."""
    items = [asarray(tx, i) if not isinstance(i, V.ListVT) else array_from_sequence(tx, i, None)
             for i in seq.items]  # fmt: skip
    if not items:
        raise Unsupported("np.array of an empty sequence")
    dt = dtype or np.result_type(*[np_dtype(i) for i in items])
    ts = V.ListVT([cast(tx, i.tensor, dt) for i in items])
    return V.NdarrayVT(graph_call(tx, torch.stack, ts))


def _array(tx, obj, dtype, copy):
    from .calls import try_const

    dt = dtype_arg(dtype)
    if isinstance(obj, V.NdarrayVT):
        t = obj.tensor if dt is None else cast(tx, obj.tensor, dt)
        if copy and t is obj.tensor:
            t = graph_method(tx, "clone", t)
        if t is obj.tensor and not obj.scalar:
            return obj  # np.asarray(a) is a itself
        return V.NdarrayVT(t)
    if isinstance(obj, V.ListVT) and not try_const(obj)[0]:
        return array_from_sequence(tx, obj, dt)
    value = const(obj, "array contents")
    return V.NdarrayVT(const_tensor(tx, np.asarray(value, dtype=dt)))


@register("array")
def np_array(tx, object, dtype=NO, *, copy=True, order=NO, subok=NO, ndmin=0, ndmax=0,
             like=NO):  # fmt: skip
    refuse("np.array", like=like)
    if any(const(v) for v in (ndmin, ndmax)):
        raise Unsupported("np.array with ndmin/ndmax")
    copy = const(copy)
    return _array(tx, object, dtype, copy is not False)


@register("asarray", "asanyarray")
def np_asarray(tx, a, dtype=NO, order=NO, *, device=NO, copy=NO, like=NO):
    refuse("np.asarray", device=device, like=like)
    return _array(tx, a, dtype, given(copy) and bool(const(copy)))


@register("ascontiguousarray")
def np_ascontiguousarray(tx, a, dtype=NO, *, like=NO):
    out = _array(tx, a, dtype, False)
    if out.tensor.example.dim() == 0:
        raise Unsupported("np.ascontiguousarray of a 0-d array")
    return V.NdarrayVT(graph_method(tx, "contiguous", out.tensor))


@register("copy")
def np_copy(tx, a, order=NO, subok=NO):
    a = asarray(tx, a)
    return V.NdarrayVT(graph_method(tx, "clone", a.tensor))


@method("copy")
def ndarray_copy(tx, a, order=NO):
    fmt = torch.contiguous_format  # ndarray.copy() defaults to C order, np.copy to 'K'
    return V.NdarrayVT(graph_method(tx, "clone", a.tensor, memory_format=fmt), a.scalar)


@method("astype")
def ndarray_astype(tx, a, dtype, order=NO, casting=NO, subok=NO, copy=True):
    refuse("ndarray.astype", order=order, casting=casting)
    dt = dtype_arg(dtype)
    t = cast(tx, a.tensor, dt)
    copy = const(copy)
    if t is a.tensor and copy:
        t = graph_method(tx, "clone", t)
    return V.NdarrayVT(t, a.scalar)


@method("fill")
def ndarray_fill(tx, a, value):
    check_writable(tx, a, "ndarray.fill")
    if isinstance(value, V.NdarrayVT):
        if value.tensor.example.dim() != 0:
            raise Unsupported("ndarray.fill with an array (NumPy takes a scalar)")
        fill = cast(tx, value.tensor, np_dtype(a))  # NumPy casts unsafely, as torch does
    else:
        fill = np_dtype(a).type(const(value)).item()
    graph_method(tx, "fill_", a.tensor, fill)
    return V.ConstVT(None)


# -- NumPy scalar types and np.dtype --------------------------------------------------------------
def np_dtype_call(tx, obj, align=False, copy=False):
    """`np.dtype(x)`."""
    return V.ConstVT(dtype_arg(obj))


def _scalar_type(cls):
    def impl(tx, value=0):
        """`np.float32(x)`: a NumPy scalar, or (of an array) the array cast."""
        dt = dtype_arg(V.ClassVT(cls))
        if isinstance(value, V.NdarrayVT):
            t = cast(tx, value.tensor, dt)
            return V.NdarrayVT(t, value.scalar or t.example.dim() == 0)
        return V.ConstVT(cls(const(value)))

    return impl


FUNCTIONS[np.dtype] = np_dtype_call
_SCALAR_TYPES = [np.dtype(n).type for n in ("bool", "uint8", "int8", "int16", "int32", "int64",
                 "uint16", "uint32", "uint64", "float16", "float32", "float64", "complex64",
                 "complex128")]  # fmt: skip
FUNCTIONS.update({cls: _scalar_type(cls) for cls in _SCALAR_TYPES})
