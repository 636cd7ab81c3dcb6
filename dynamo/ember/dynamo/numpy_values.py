"""NumPy ndarrays in traced code: graph inputs, NumPy's dtype rules, operators, items, attributes.

An ndarray the frame reads becomes a graph input as `torch.from_numpy(array)` (guarded on its
type, dtype, shape, strides and writeability), so the graph works on the array's own memory and an
in-place update reaches the caller's array, as in NumPy. Under a non-CPU default torch device
(`with torch.device("cuda")`, guarded) the input is a copy on that device instead, every array the
graph creates is made there, results come back as host arrays and an input the graph wrote is
copied back into the caller's array after the graph (numpy_device.py). Each ndarray value is an
`NdarrayVT` over the tensor that computes it; operations follow NumPy's type promotion (NEP 50:
Python scalars are weak, NumPy scalars and arrays are not), worked out at trace time by NumPy
itself (`ufunc.resolve_dtypes`, `np.result_type`), and operands are cast explicitly so the tensor
op computes in the dtype NumPy would. The functions themselves are in numpy_map.py.
"""

from __future__ import annotations

import dataclasses
import operator

import numpy as np
import torch

from . import variables as V
from .exc import Unsupported
from .numpy_device import (array_device, check_no_written_overlap, copy_back_when_written,
                           device_kwargs, state, storage_of, to_device)  # fmt: skip
from .source import AttrSource, Source

_PAIRS = [(np.bool_, torch.bool), (np.uint8, torch.uint8), (np.int8, torch.int8),
          (np.int16, torch.int16), (np.int32, torch.int32), (np.int64, torch.int64),
          (np.uint16, torch.uint16), (np.uint32, torch.uint32), (np.uint64, torch.uint64),
          (np.float16, torch.float16), (np.float32, torch.float32), (np.float64, torch.float64),
          (np.complex64, torch.complex64), (np.complex128, torch.complex128)]  # fmt: skip
TO_TORCH = {np.dtype(n): t for n, t in _PAIRS}
TO_NUMPY = {t: np.dtype(n) for n, t in _PAIRS}


def torch_dtype(dt: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (native byte order, numbers and bool only)."""
    try:
        return TO_TORCH[dt]
    except (KeyError, TypeError):
        raise Unsupported(f"NumPy dtype {dt!r} has no tensor equivalent") from None


def np_dtype(vt: V.NdarrayVT) -> np.dtype:
    return numpy_dtype_of(vt.tensor.example.dtype)


def numpy_dtype_of(dt: torch.dtype) -> np.dtype:
    try:
        return TO_NUMPY[dt]
    except KeyError:
        raise Unsupported(f"a {dt} tensor as a NumPy array (NumPy has no {dt})") from None


def check_writable(tx, a: V.NdarrayVT, what: str) -> None:
    """Every NumPy write into an array goes through here first."""
    if a.readonly or storage_of(a.tensor) in state(tx.output).copied:
        raise Unsupported(f"{what} into a read-only NumPy array, or one that np.flip returned or "
                          "read (a view in NumPy, a copy here)")  # fmt: skip
    copy_back_when_written(tx, a)


# -- inputs ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NumpyTensorSource(Source):
    """`torch.from_numpy(base)`: the tensor view of an ndarray the frame reads (a graph input), or
    with `device` its copy there; guards are installed on `base`, never on this source."""

    base: Source
    device: object = None

    @property
    def closure_objects(self):
        return (torch.from_numpy,) if self.device is None else (to_device, self.device)

    def expr(self):
        if self.device is None:
            return f"___c_{id(torch.from_numpy)}({self.base.expr()})"
        return f"___c_{id(to_device)}({self.base.expr()}, ___c_{id(self.device)})"

    def name(self):
        return self.base.name()


def is_numpy_callable(value) -> bool:
    from .builder import maybe_numpy

    return callable(value) and not isinstance(value, type) and maybe_numpy(value)


def wrap_numpy_value(builder, value, source):
    """The VT of a NumPy value the frame reads, with its guards; None: not one handled here."""
    if type(value) is np.ndarray:
        return wrap_input(builder, value, source)
    if isinstance(value, np.ndarray) or isinstance(value, type):
        return None  # ndarray subclasses (np.matrix, masked arrays) stay opaque objects
    if isinstance(value, np.dtype):
        if value not in TO_TORCH:
            return None
        builder.guard("EQ", source, value)  # the guard VM's EQ also checks the exact type
        return V.ConstVT(value, source)
    if isinstance(value, np.generic):
        if value.dtype not in TO_TORCH:
            return None
        builder.guard("EQ", source, value)
        return V.ConstVT(value, source)
    if is_numpy_callable(value):
        builder.guard("ID", source, value)
        return V.NumpyFunctionVT(value, source)
    return None


def wrap_input(builder, array: np.ndarray, source) -> V.NdarrayVT:
    """A graph input for an ndarray: `torch.from_numpy(array)`, sharing the array's memory, or
    its copy on the device the arrays compute on."""
    if source is None:
        raise Unsupported("a NumPy array reached without a source (a closure or default value?)")
    output = builder.output
    if array.dtype not in TO_TORCH:
        raise Unsupported(f"a NumPy array of dtype {array.dtype} as an input")
    if any(s < 0 or s % array.itemsize for s in array.strides):
        raise Unsupported("a NumPy array with negative or unaligned strides as an input")
    if not array.flags.writeable:
        raise Unsupported("a read-only NumPy array as an input")
    seen = state(output).inputs
    prev = seen.get(id(array))
    if prev is not None and prev[0] is array:  # one array reached by two names: one input
        builder.guard("SAME", source, prev[1].source)
        return prev[1]
    builder.guard("TYPE", source, np.ndarray)
    builder.guard("EQ", AttrSource(source, "dtype"), array.dtype)
    builder.guard("EQ", AttrSource(AttrSource(source, "flags"), "writeable"), True)
    device = array_device(output)
    if device is not None:
        check_no_written_overlap(output, array)
    value = torch.from_numpy(array) if device is None else to_device(array, device)
    # Dynamic sizes as for tensors (marked, dynamic=True, or changed since the last compile),
    # on the CPU, where the graph reads the array's own memory; one guard checks the sizes it
    # keeps, C order, and reads the dynamic ones.
    dims = {}
    if device is None and output.policy is not None:
        dims = output.policy.dims(value, source)
    tensor = output.add_input(value, NumpyTensorSource(source, device), guarded=False, dims=dims)
    if dims:
        builder.guard("SYM_ARRAY", source, (array.itemsize, tensor.size_spec))
    else:
        builder.guard("EQ", AttrSource(source, "shape"), array.shape)
        builder.guard("EQ", AttrSource(source, "strides"), array.strides)
    vt = V.NdarrayVT(tensor, source=source)
    seen[id(array)] = (array, vt)
    return vt


# -- results and casts ----------------------------------------------------------------------------
def result(t: V.VT, scalar_if_0d=True) -> V.VT:
    """The NumPy value of an op's tensor result: 0-d results of ufuncs, reductions and element
    reads are NumPy scalars (as NumPy returns them); tuples element-wise."""
    if isinstance(t, V.ListVT):
        return V.ListVT([result(i, scalar_if_0d) for i in t.items], is_tuple=t.is_tuple)
    if not isinstance(t, V.TensorVT):
        raise Unsupported(f"a NumPy mapping returned a {type(t).__name__}")
    numpy_dtype_of(t.example.dtype)
    return V.NdarrayVT(t, scalar=scalar_if_0d and t.example.dim() == 0)


def cast(tx, t: V.TensorVT, dt: np.dtype) -> V.TensorVT:
    """`t` as dtype `dt` (a graph cast only when it differs)."""
    target = torch_dtype(dt)
    if t.example.dtype == target:
        return t
    return tx.output.call("call_method", "to", (t, V.ConstVT(target)), {})


def const_tensor(tx, value) -> V.TensorVT:
    """A constant array (a list of numbers in the program) as a graph tensor of NumPy's dtype."""
    arr = np.asarray(value)
    if arr.dtype not in TO_TORCH:
        raise Unsupported(f"a constant of NumPy dtype {arr.dtype} used as an array")
    return tx.output.call("call_function", torch.tensor, (V.ConstVT(arr.tolist()),),
                          {"dtype": V.ConstVT(torch_dtype(arr.dtype)), **device_kwargs(tx)})


def scalar_tensor(tx, value, dt: np.dtype) -> V.TensorVT:
    return tx.output.call("call_function", torch.scalar_tensor, (V.ConstVT(value),),
                          {"dtype": V.ConstVT(torch_dtype(dt)), **device_kwargs(tx)})


def dtype_arg(vt):
    """A NumPy dtype argument (np.float32, 'float32', float, np.dtype(...)), or None."""
    from .calls import const_of

    if not isinstance(vt, V.VT):
        return None  # not passed
    value = vt.cls if isinstance(vt, V.ClassVT) else const_of(vt, "NumPy dtype")
    if value is None:
        return None
    try:
        dt = np.dtype(value)
    except TypeError as e:
        raise Unsupported(f"NumPy dtype {value!r}: {e}") from None
    torch_dtype(dt)
    return dt


# -- operands -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Operand:
    """One argument of a NumPy operation: an array (tensor) or a scalar (Python value)."""

    tensor: object  # TensorVT, or None for a scalar
    value: object  # the Python scalar (weak) or NumPy scalar (strong) when tensor is None
    key: object  # np.dtype, or int/float/complex for a weak Python scalar (NEP 50)
    scalar: bool  # a NumPy scalar or Python number (0-d results stay scalars)


def operand(tx, vt, sym_ok=False) -> Operand:
    """What NumPy makes of `vt` as an array argument. `sym_ok`: a symbolic size stays one, a weak
    Python int (as_tensor decides whether it can stay symbolic), else its value is guarded."""
    from .calls import try_const
    from .symbolic import SymIntVT

    if isinstance(vt, V.NdarrayVT):
        return Operand(vt.tensor, None, np_dtype(vt), vt.scalar)
    if isinstance(vt, SymIntVT):
        if sym_ok:
            return Operand(None, vt, int, True)
        vt = V.ConstVT(vt.env.specialize(vt))
    if isinstance(vt, V.TensorVT):
        raise Unsupported("a torch.Tensor mixed with NumPy arrays (convert it with .numpy())")
    if isinstance(vt, V.ListVT) and any(isinstance(i, V.NdarrayVT) for i in vt.items):
        from .numpy_creation import array_from_sequence

        arr = array_from_sequence(tx, vt, None)
        return Operand(arr.tensor, None, np_dtype(arr), False)
    ok, value = try_const(vt)
    if not ok:
        raise Unsupported(f"a {type(vt).__name__} as a NumPy array argument")
    if isinstance(value, np.generic):
        if value.dtype not in TO_TORCH:
            raise Unsupported(f"a NumPy scalar of dtype {value.dtype}")
        return Operand(None, value.item(), value.dtype, True)
    if type(value) is bool:
        return Operand(None, value, np.dtype(bool), True)
    if type(value) in (int, float, complex):
        return Operand(None, value, type(value), True)
    if isinstance(value, (list, tuple)):
        t = const_tensor(tx, value)
        return Operand(t, None, numpy_dtype_of(t.example.dtype), False)
    raise Unsupported(f"a {type(value).__name__} as a NumPy array argument")


def key_for_result_type(op: Operand):
    """What np.result_type takes for an operand (a weak Python scalar is passed as its value)."""
    return op.key if isinstance(op.key, np.dtype) else op.value


def as_tensor(tx, op: Operand, dt: np.dtype, keep_scalar=False):
    """The operand as a tensor of dtype `dt` (a Python scalar stays one when `keep_scalar`)."""
    from .symbolic import SymIntVT

    if op.tensor is not None:
        return cast(tx, op.tensor, dt)
    value = op.value
    if isinstance(value, SymIntVT):
        # A size (>= 2) is exact in a float loop and fits int64: the op takes it symbolic, as
        # NumPy takes the weak int. Narrower ints (NumPy raises past their range) and a
        # scalar that must become a tensor use its value, guarded.
        if keep_scalar and (dt.kind in "fc" or dt == np.dtype(np.int64)):
            return value
        value = value.env.specialize(value)
    if dt.kind in "iu" and isinstance(value, (bool, int)):
        info = np.iinfo(dt)
        if not info.min <= value <= info.max:  # NumPy raises OverflowError here
            raise Unsupported(f"Python integer {value} out of bounds for {dt}")
    if dt.kind == "f" and not isinstance(value, complex):
        value = float(value)
    elif dt.kind in "iu":
        value = int(value)
    elif dt.kind == "b":
        value = bool(value)
    if keep_scalar:
        return V.ConstVT(value)
    return scalar_tensor(tx, value, dt)


# -- ufuncs ---------------------------------------------------------------------------------------
_UFUNC_KWARGS = {"out": None, "where": True, "casting": "same_kind", "order": "K", "subok": True,
                 "dtype": None, "signature": None}  # fmt: skip
# Torch callables taking a Python scalar on either side (the others get 0-d tensors).
SCALAR_OK = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
             operator.mod, operator.pow, operator.eq, operator.ne, operator.lt, operator.le,
             operator.gt, operator.ge, operator.and_, operator.or_, operator.xor,
             operator.lshift, operator.rshift}  # fmt: skip


def ufunc_name(uf) -> str:
    return f"np.{uf.__name__}"


def apply_ufunc(tx, uf, torch_fn, args, kwargs) -> V.VT:
    """`uf(*args, **kwargs)` as `torch_fn` over operands cast to the loop NumPy would pick."""
    from .calls import try_const

    dtype = dtype_arg(kwargs.get("dtype"))
    for k, v in kwargs.items():
        if k == "dtype":
            continue
        ok, value = try_const(v)
        if k not in _UFUNC_KWARGS or not ok:
            raise Unsupported(f"{ufunc_name(uf)}(..., {k}=...) is not supported in compiled code")
        if value is not _UFUNC_KWARGS[k] and value != _UFUNC_KWARGS[k]:
            raise Unsupported(f"{ufunc_name(uf)}(..., {k}={value!r}) is not supported in "
                              "compiled code")  # fmt: skip
    if len(args) != uf.nin or uf.nout != 1:
        raise Unsupported(f"{ufunc_name(uf)} with {len(args)} arguments")
    # torch's Tensor.__pow__ refuses a SymInt exponent: a size there is guarded
    ops = [operand(tx, a, sym_ok=torch_fn is not operator.pow) for a in args]
    if all(op.tensor is None for op in ops):  # all scalars: NumPy computes it now
        ops = [operand(tx, a) for a in args]
        value = uf(*[_const_value(op) for op in ops], **({"dtype": dtype} if dtype else {}))
        return V.ConstVT(value)
    try:
        sig = {} if dtype is None else {"signature": (None,) * uf.nin + (dtype,)}
        loop = uf.resolve_dtypes(tuple(op.key for op in ops) + (None,), **sig)
    except Exception as e:  # noqa: BLE001  (NumPy raises the same when the program runs)
        raise Unsupported(f"{ufunc_name(uf)}: {type(e).__name__}: {e}") from None
    scalars_ok = torch_fn in SCALAR_OK
    targs = [as_tensor(tx, op, dt, scalars_ok) for op, dt in zip(ops, loop)]
    if uf in _BOOL_IDENTITIES and loop[0].kind == "b":  # torch has no bool kernels for these
        return result(tx.output.call("call_method", "clone", (targs[0],), {}))
    if torch_fn is operator.pow and isinstance(targs[0], V.ConstVT):
        torch_fn = torch.pow  # fx prints pow(-1, x) as `-1 ** x`, which Python reads as -(1 ** x)
    if uf in _INT_DIVISIONS and loop[1].kind in "biu" and isinstance(targs[1], V.TensorVT):
        return result(cast(tx, _int_division(tx, torch_fn, *targs), loop[-1]))
    out = tx.output.call("call_function", torch_fn, tuple(targs), {})
    return result(cast(tx, out, loop[-1]))


_INT_DIVISIONS = {np.floor_divide, np.remainder, np.fmod}
_BOOL_IDENTITIES = {np.absolute, np.fabs, np.floor, np.ceil, np.trunc, np.rint}


def _int_division(tx, torch_fn, a, b):
    """Integer `//`, `%`, fmod as NumPy computes them: 0 where the divisor is 0 (NumPy warns;
    torch would raise)."""
    call = tx.output.call
    zero = call("call_function", operator.eq, (b, V.ConstVT(0)), {})
    safe = call("call_function", torch.where, (zero, V.ConstVT(1), b), {})
    out = call("call_function", torch_fn, (a, safe), {})
    return call("call_function", torch.where, (zero, V.ConstVT(0), out), {})


def _const_value(op: Operand):
    return np.dtype(op.key).type(op.value) if isinstance(op.key, np.dtype) else op.value


# -- operators ------------------------------------------------------------------------------------
_BINOPS = {operator.add: "add", operator.sub: "subtract", operator.mul: "multiply",
           operator.truediv: "true_divide", operator.floordiv: "floor_divide",
           operator.mod: "remainder", operator.pow: "power", operator.matmul: "matmul",
           operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
           operator.lshift: "left_shift", operator.rshift: "right_shift",
           operator.eq: "equal", operator.ne: "not_equal", operator.lt: "less",
           operator.le: "less_equal", operator.gt: "greater",
           operator.ge: "greater_equal"}  # fmt: skip
_UNOPS = {operator.neg: "negative", operator.pos: "positive", operator.invert: "invert",
          operator.abs: "absolute"}  # fmt: skip


def handles(a, b=None) -> bool:
    """Whether an operator over these values is NumPy's (an ndarray, or a dtype compared)."""
    return any(isinstance(x, V.NdarrayVT) or _np_const(x) for x in (a, b))


def _np_const(x) -> bool:
    return isinstance(x, V.ConstVT) and isinstance(x.value, (np.generic, np.dtype))


def binop(tx, op, a, b) -> V.VT:
    """`a <op> b` where one side is a NumPy value."""
    from .calls import _INPLACE
    from .numpy_map import UFUNCS

    if not isinstance(a, V.NdarrayVT) and not isinstance(b, V.NdarrayVT):
        return _const_binop(op, a, b)  # dtype == np.float32, np.float32(2) * 3 ...
    base = _INPLACE.get(op, op)
    name = _BINOPS.get(base)
    if name is None:
        raise Unsupported(f"operator {op.__name__} on NumPy arrays")
    uf = getattr(np, name)
    if uf is np.power and _square_fast_path(a, b):
        uf = np.square  # `array ** 2` is np.square(array) in NumPy (bool ** 2 is int8)
    out = apply_ufunc(tx, uf, UFUNCS[uf], [a] if uf is np.square else [a, b], {})
    if op is base or not isinstance(a, V.NdarrayVT) or a.scalar:
        return out  # NumPy scalars are immutable: `s += 1` makes a new one
    return write_back(tx, a, out, f"{op.__name__} ({name})")


def _square_fast_path(a, b) -> bool:
    return (isinstance(a, V.NdarrayVT) and not a.scalar and isinstance(b, V.ConstVT)
            and type(b.value) is int and b.value == 2)  # fmt: skip


def write_back(tx, a: V.NdarrayVT, out: V.VT, what: str) -> V.NdarrayVT:
    """An in-place update of array `a` with the value `out` computed for it, with NumPy's
    casting rule (same_kind) and shape check."""
    check_writable(tx, a, f"in-place {what}")
    dt = np_dtype(a)
    src = out.tensor if isinstance(out, V.NdarrayVT) else scalar_tensor(tx, out.value, dt)
    src_dt = numpy_dtype_of(src.example.dtype)
    if not np.can_cast(src_dt, dt, "same_kind"):
        raise Unsupported(f"in-place {what}: NumPy cannot cast {src_dt} to {dt} (same_kind)")
    if a.tensor.sym != src.sym:  # the check below reads sizes: equal symbols need none
        static_shape(a.tensor, f"in-place {what}")
        static_shape(src, f"in-place {what}")
    shape = a.tensor.example.shape
    if src.example.shape != shape and torch.broadcast_shapes(src.example.shape, shape) != shape:
        raise Unsupported(f"in-place {what}: shapes do not broadcast to the array's")
    tx.output.call("call_method", "copy_", (a.tensor, src), {})
    return a


def _const_binop(op, a, b):
    """An operator over NumPy constants (np.float32(2) * 3, dtype == np.float32): computed now by
    NumPy, as the program would (a size in it counts as its current value, guarded)."""
    from .builder import is_const_value
    from .calls import const_of

    va, vb = (x.cls if isinstance(x, V.ClassVT) else const_of(x, "operand") for x in (a, b))
    try:
        value = op(va, vb)
    except Exception as e:  # noqa: BLE001  (the program raises it when it runs)
        raise Unsupported(f"{op.__name__}({va!r}, {vb!r}) raised {type(e).__name__}") from e
    if not (is_const_value(value) or isinstance(value, (np.generic, np.dtype))):
        raise Unsupported(f"{op.__name__} of NumPy constants gave a {type(value).__name__}")
    return V.ConstVT(value)


def unop(tx, op, a) -> V.VT:
    from .numpy_map import UFUNCS

    name = _UNOPS.get(op)
    if name is None or not isinstance(a, V.NdarrayVT):
        raise Unsupported(f"{getattr(op, '__name__', op)} of a NumPy value")
    uf = getattr(np, name)
    return apply_ufunc(tx, uf, UFUNCS[uf], [a], {})


def truth(tx, a) -> bool:
    if isinstance(a, V.NdarrayVT):
        raise Unsupported("data-dependent branch on a NumPy array value (if array: ...)")
    raise Unsupported(f"truth of a {type(a).__name__}")


# -- items ----------------------------------------------------------------------------------------
def _index(tx, key, for_write=False):
    """A NumPy index as a torch index; and whether it holds an Ellipsis."""
    if isinstance(key, V.NdarrayVT):
        dt = np_dtype(key)
        if dt.kind == "b":
            if not for_write:
                raise Unsupported("indexing with a boolean mask (output shape depends on data)")
            return key.tensor, False
        if dt.kind not in "iu":
            raise Unsupported(f"indexing with an array of dtype {dt}")
        return cast(tx, key.tensor, np.dtype(np.int64)), False
    if isinstance(key, V.ListVT) and key.is_tuple:
        parts = [_index(tx, k, for_write) for k in key.items]
        return V.TupleVT([p for p, _ in parts]), any(e for _, e in parts)
    if isinstance(key, V.ConstVT):
        v = key.value
        if isinstance(v, np.generic):
            return V.ConstVT(v.item()), False
        if isinstance(v, tuple):
            return _index(tx, V.TupleVT([V.ConstVT(i) for i in v]), for_write)
        return key, v is Ellipsis
    if isinstance(key, V.TensorVT):
        raise Unsupported("indexing a NumPy array with a torch.Tensor")
    return key, False


def _check_placement(a: V.NdarrayVT, index, torch_shape) -> None:
    """NumPy counts integers among the advanced indices and moves the indexed axes to the front
    when a slice separates them (a[1, :, idx] is (len(idx), n)); torch applies integers first.
    The shape NumPy gives (indexing a zero-stride stand-in) must be the one torch gave."""

    def real(i):
        if isinstance(i, V.TensorVT):
            if i.example.is_meta:
                raise Unsupported("an index array into a NumPy array on the meta device (its "
                                  "values decide where NumPy places the axes)")  # fmt: skip
            return i.example.cpu().numpy()
        if isinstance(i, V.ListVT):
            return tuple(real(x) for x in i.items) if i.is_tuple else [real(x) for x in i.items]
        return i.value if isinstance(i, V.ConstVT) else _NO_KEY

    key = real(index)
    flat = key if isinstance(key, tuple) else (key,)
    if any(k is _NO_KEY for k in flat):
        return
    stand_in = np.broadcast_to(np.empty((), np_dtype(a)), tuple(a.tensor.example.shape))
    try:
        numpy_shape = stand_in[key].shape
    except (IndexError, ValueError, TypeError) as e:  # NumPy raises it when the program runs
        raise Unsupported(f"NumPy indexing: {type(e).__name__}: {e}") from None
    if tuple(numpy_shape) != tuple(torch_shape(key)):
        raise Unsupported("NumPy places these indexed axes differently from torch (advanced "
                          "indices and integers separated by a slice)")  # fmt: skip


_NO_KEY = object()


def getitem(tx, a: V.NdarrayVT, key) -> V.VT:
    index, has_ellipsis = _index(tx, key)
    out = tx.output.call("call_function", operator.getitem, (a.tensor, index), {})
    _check_placement(a, index, lambda key: out.example.shape)
    return result(out, scalar_if_0d=not has_ellipsis)


def setitem(tx, a: V.NdarrayVT, key, value) -> None:
    if a.scalar:
        raise Unsupported("item assignment into a NumPy scalar")
    check_writable(tx, a, "item assignment")
    index, _ = _index(tx, key, for_write=True)
    _check_placement(a, index, lambda key: a.tensor.example[_example_key(index)].shape)
    dt = np_dtype(a)
    op = operand(tx, value)
    if op.tensor is not None:
        src = cast(tx, op.tensor, dt)  # NumPy casts assigned values unsafely, as torch does
    else:
        if isinstance(op.value, complex) and dt.kind != "c":
            raise Unsupported("assigning a complex value into a real NumPy array")
        src = V.ConstVT(op.value if dt.kind in "fc" else np.dtype(dt).type(op.value).item())
    tx.output.call("call_function", operator.setitem, (a.tensor, index, src), {})


def _example_key(index):
    if isinstance(index, V.TensorVT):
        return index.example
    if isinstance(index, V.ListVT):
        items = [_example_key(i) for i in index.items]
        return tuple(items) if index.is_tuple else items
    return index.value if isinstance(index, V.ConstVT) else index


def static_shape(t: V.TensorVT, what: str) -> torch.Size:
    """The sizes of an array's tensor where NumPy code reads them as Python ints; one with a
    dynamic size traces the frame again with static sizes (reading the example's would bake
    one size into a graph run for every size)."""
    if t.sym is not None and not all(e.is_Integer for e in t.sym):
        from .symbolic import SymbolicFallback

        raise SymbolicFallback(f"{what} of a NumPy array with dynamic sizes")
    return t.example.shape


def iterate(tx, a: V.NdarrayVT) -> list:
    if a.tensor.example.dim() == 0:
        raise Unsupported("iteration over a 0-d NumPy array")
    return [getitem(tx, a, V.ConstVT(i))
            for i in range(static_shape(a.tensor, "iteration")[0])]  # fmt: skip


def length(tx, a: V.NdarrayVT) -> V.VT:
    if a.tensor.example.dim() == 0:
        raise Unsupported("len() of a 0-d NumPy array")
    shape = shape_of(tx, a)
    return V.ConstVT(shape.value[0]) if isinstance(shape, V.ConstVT) else shape.items[0]


def shape_of(tx, a: V.NdarrayVT) -> V.VT:
    """`a.shape`: a tuple of ints, symbolic where the size is dynamic."""
    if a.tensor.sym is None:
        return V.ConstVT(tuple(a.tensor.example.shape))
    from .tensor_ops import size_read

    return V.ListVT(size_read(tx, a.tensor, "size", []).items, is_tuple=True)


# -- attributes -----------------------------------------------------------------------------------
def getattr_ndarray(tx, a: V.NdarrayVT, name: str) -> V.VT:
    """`a.name` for an ndarray value: metadata as constants, .T as a graph op, methods."""
    from .exc import AttrMissing
    from .numpy_map import lookup_method

    ex = a.tensor.example
    if name == "shape":
        return shape_of(tx, a)
    if name == "ndim":
        return V.ConstVT(ex.dim())
    if name == "size":
        return V.ConstVT(static_shape(a.tensor, "ndarray.size").numel())
    if name == "dtype":
        return V.ConstVT(np_dtype(a))
    if name == "itemsize":
        return V.ConstVT(ex.element_size())
    if name == "nbytes":
        return V.ConstVT(static_shape(a.tensor, "ndarray.nbytes").numel() * ex.element_size())
    if name == "T":
        return lookup_method("transpose")(tx, a)
    if name == "mT":
        if ex.dim() < 2:
            raise Unsupported("ndarray.mT of an array with fewer than 2 dimensions")
        return lookup_method("swapaxes")(tx, a, V.ConstVT(-1), V.ConstVT(-2))
    if name == "__class__":
        return V.ClassVT(a.python_type())
    if not hasattr(np.ndarray, name):
        raise AttrMissing(f"numpy.ndarray has no attribute {name!r}")
    if callable(getattr(np.ndarray, name)):  # a method with no mapping breaks where it is called
        return V.MethodVT(a, name)
    raise Unsupported(f"ndarray.{name} is not supported in compiled code (no tensor mapping)")


def call_ndarray_method(tx, a: V.NdarrayVT, name: str, args, kwargs) -> V.VT:
    from .numpy_map import lookup_method

    impl = lookup_method(name)
    if impl is None:
        raise Unsupported(f"ndarray.{name}() is not supported in compiled code (no tensor mapping)")
    return call_impl(impl, f"ndarray.{name}", tx, [a, *args], kwargs)


def call_impl(impl, what, tx, args, kwargs):
    """Run one mapping; a call NumPy would reject (unknown keyword) is left to NumPy."""
    try:
        return impl(tx, *args, **kwargs)
    except (TypeError, ValueError, ArithmeticError) as e:  # NumPy raises it when the code runs
        raise Unsupported(f"{what}: {type(e).__name__}: {e}") from None


# -- torch interop --------------------------------------------------------------------------------
def from_numpy(tx, args, kwargs) -> V.VT:
    """`torch.from_numpy(a)`: the array's tensor itself (they share memory)."""
    if len(args) != 1 or kwargs or not isinstance(args[0], V.NdarrayVT):
        raise Unsupported("torch.from_numpy of something other than a NumPy array")
    a = args[0]
    if a.scalar:
        raise Unsupported("torch.from_numpy of a NumPy scalar (NumPy would raise TypeError)")
    device = array_device(tx.output)
    if device is not None:  # the array's values are a copy on the device: no CPU view of them
        raise Unsupported(f"torch.from_numpy where NumPy arrays compute on {device} (the default "
                          "device): it gives a CPU tensor sharing the array's memory, so the "
                          "frame continues eagerly from here")  # fmt: skip
    return a.tensor


def tensor_numpy(tx, t: V.TensorVT, args, kwargs) -> V.VT:
    """`t.numpy()`: an ndarray sharing the tensor's memory."""
    from .calls import const_of

    force = bool(const_of(kwargs.get("force", args[0] if args else V.ConstVT(False))))
    if t.sym is not None:  # ndarray shapes are static: trace the frame again with static sizes
        from .symbolic import SymbolicFallback

        raise SymbolicFallback("Tensor.numpy() of a tensor with dynamic sizes")
    ex = t.example
    if force or ex.requires_grad or ex.device.type != "cpu" or ex.is_conj() or ex.is_neg():
        raise Unsupported("Tensor.numpy() of a tensor that needs grad, is not on the CPU, or "
                          "with force=True")  # fmt: skip
    numpy_dtype_of(ex.dtype)
    device = array_device(tx.output)
    if device is not None:  # arrays compute on the device, this one would share CPU memory
        raise Unsupported(f"Tensor.numpy() where NumPy arrays compute on {device} (the default "
                          "device): the array shares the CPU tensor's memory, so the frame "
                          "continues eagerly from here")  # fmt: skip
    return V.NdarrayVT(t)
