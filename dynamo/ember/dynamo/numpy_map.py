"""The NumPy mapping table: each supported NumPy function (and ndarray method) -> its tensor ops.

`FUNCTIONS` is keyed by the NumPy callable itself (`np.sum`, `np.sin`, `np.linalg.norm`) and
`METHODS` by ndarray method name; an entry takes the symbolic arguments and returns the NumPy
value (numpy_values.NdarrayVT) computed by graph ops with NumPy's result dtype. A NumPy function
with no entry is a graph break naming it. Ufuncs share one implementation (apply_ufunc), given the
torch callable computing them in `UFUNCS`; the other entries are registered by the modules in
`_ENTRY_MODULES` (loaded on first use), which take their argument helpers from here.
"""

from __future__ import annotations

import importlib
import operator

import numpy as np
import torch

from . import variables as V
from .exc import Unsupported
from .numpy_values import apply_ufunc, call_impl, operand, scalar_tensor

FUNCTIONS: dict = {}
METHODS: dict = {}
NO = object()  # an argument the program did not pass
_ENTRY_MODULES = ("numpy_functions", "numpy_creation")
_loaded: list = []


def _load() -> None:
    if not _loaded:
        for name in _ENTRY_MODULES:
            importlib.import_module(f"{__package__}.{name}")
        _loaded.append(True)


def lookup_method(name: str):
    """The mapping of ndarray method `name`, or None."""
    _load()
    return METHODS.get(name)

# -- ufuncs: NumPy ufunc -> the torch callable computing it on operands of the loop's dtypes -----
_T, _O = torch, operator
UFUNCS = {
    np.add: _O.add, np.subtract: _O.sub, np.multiply: _O.mul, np.true_divide: _O.truediv,
    np.floor_divide: _O.floordiv, np.remainder: _O.mod, np.power: _O.pow,
    np.equal: _O.eq, np.not_equal: _O.ne, np.less: _O.lt, np.less_equal: _O.le,
    np.greater: _O.gt, np.greater_equal: _O.ge, np.bitwise_and: _O.and_,
    np.bitwise_or: _O.or_, np.bitwise_xor: _O.xor, np.left_shift: _O.lshift,
    np.right_shift: _O.rshift, np.matmul: _T.matmul, np.maximum: _T.maximum,
    np.minimum: _T.minimum, np.fmax: _T.fmax, np.fmin: _T.fmin, np.fmod: _T.fmod,
    np.arctan2: _T.atan2, np.hypot: _T.hypot, np.logaddexp: _T.logaddexp,
    np.logaddexp2: _T.logaddexp2, np.copysign: _T.copysign, np.float_power: _T.float_power,
    np.heaviside: _T.heaviside, np.nextafter: _T.nextafter, np.gcd: _T.gcd, np.lcm: _T.lcm,
    np.logical_and: _T.logical_and, np.logical_or: _T.logical_or,
    np.logical_xor: _T.logical_xor,
    np.negative: _T.neg, np.positive: _T.positive, np.absolute: _T.abs, np.fabs: _T.abs,
    np.sign: _T.sign, np.sqrt: _T.sqrt, np.square: _T.square, np.reciprocal: _T.reciprocal,
    np.exp: _T.exp, np.exp2: _T.exp2, np.expm1: _T.expm1, np.log: _T.log, np.log2: _T.log2,
    np.log10: _T.log10, np.log1p: _T.log1p, np.sin: _T.sin, np.cos: _T.cos, np.tan: _T.tan,
    np.arcsin: _T.asin, np.arccos: _T.acos, np.arctan: _T.atan, np.sinh: _T.sinh,
    np.cosh: _T.cosh, np.tanh: _T.tanh, np.arcsinh: _T.asinh, np.arccosh: _T.acosh,
    np.arctanh: _T.atanh, np.deg2rad: _T.deg2rad, np.rad2deg: _T.rad2deg,
    np.radians: _T.deg2rad, np.degrees: _T.rad2deg, np.floor: _T.floor, np.ceil: _T.ceil,
    np.trunc: _T.trunc, np.rint: _T.round, np.conjugate: _T.conj_physical,
    np.logical_not: _T.logical_not, np.isnan: _T.isnan, np.isinf: _T.isinf,
    np.isfinite: _T.isfinite, np.signbit: _T.signbit, np.invert: _T.bitwise_not,
}  # fmt: skip


def _ufunc_entry(uf, fn):
    return lambda tx, *args, **kwargs: apply_ufunc(tx, uf, fn, args, kwargs)


FUNCTIONS.update({uf: _ufunc_entry(uf, fn) for uf, fn in UFUNCS.items()})


def register(*names):
    """Register the decorated mapping for `np.<name>` (dotted: `linalg.norm`) for each name."""

    def add(impl):
        for name in names:
            obj = np
            for part in name.split("."):
                obj = getattr(obj, part, None)  # None: not in this NumPy version
            if obj is not None:
                FUNCTIONS[obj] = impl
        return impl

    return add


def method(*names):
    """Register the decorated mapping as the ndarray methods `names`."""

    def add(impl):
        for name in names:
            METHODS[name] = impl
        return impl

    return add


def call_function(tx, fn_vt, args, kwargs) -> V.VT:
    """A call of a NumPy function or class (np.float32(x)): its mapping, or a graph break naming
    it."""
    fn = fn_vt.fn if isinstance(fn_vt, V.VT) else fn_vt
    _load()
    try:
        impl = FUNCTIONS.get(fn)
    except TypeError:
        impl = None
    if impl is None:
        raise Unsupported(f"NumPy function {qualified_name(fn)}() is not supported in compiled "
                          "code (no tensor mapping in ember.dynamo.numpy_map)")  # fmt: skip
    return call_impl(impl, qualified_name(fn), tx, args, kwargs)


def qualified_name(fn) -> str:
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", type(fn).__name__)
    if isinstance(owner, np.ufunc):
        return f"numpy.{owner.__name__}.{name}"
    if owner is not None and not isinstance(owner, type(np)):
        return f"{type(owner).__module__.split('.mtrand')[0]}.{name}"
    module = getattr(fn, "__module__", None) or "numpy"
    return f"{module}.{name}"


# -- argument helpers -----------------------------------------------------------------------------
def const(vt, what="argument"):
    """The constant value of an argument (a default the program did not override is one)."""
    from .calls import const_of

    return const_of(vt, f"NumPy {what}") if isinstance(vt, V.VT) else vt


def given(vt) -> bool:
    """Whether the program passed the argument (None counts as not passed)."""
    return vt is not NO and vt is not None and not (isinstance(vt, V.ConstVT) and vt.value is None)


def refuse(what, **args):
    """A graph break for arguments the mappings do not support (out=, where=, ...)."""
    for name, vt in args.items():
        if given(vt):
            raise Unsupported(f"{what}(..., {name}=...) is not supported in compiled code")


def asarray(tx, vt) -> V.NdarrayVT:
    """`vt` as an ndarray value (a Python number or list becomes a constant array)."""
    if isinstance(vt, V.NdarrayVT):
        return vt
    op = operand(tx, vt)
    if op.tensor is not None:
        return V.NdarrayVT(op.tensor)
    dt = op.key if isinstance(op.key, np.dtype) else np.asarray(op.value).dtype
    return V.NdarrayVT(scalar_tensor(tx, op.value, dt))


def axes_arg(vt, ndim, what="axis"):
    """A normalised tuple of axes, or None for all of them."""
    value = None if vt is NO else const(vt, what)
    if value is None:
        return None
    try:
        return np.lib.array_utils.normalize_axis_tuple(value, ndim)
    except Exception as e:  # noqa: BLE001  (NumPy raises AxisError when the program runs)
        raise Unsupported(f"NumPy {what} {value!r}: {e}") from None


def _wrap(a) -> V.VT:
    """A node argument: a plain Python value becomes a constant; a tuple holding symbolic sizes
    a tuple of them."""
    if isinstance(a, tuple) and any(isinstance(i, V.VT) for i in a):
        return V.ListVT([_wrap(i) for i in a], is_tuple=True)
    return a if isinstance(a, V.VT) else V.ConstVT(a)


def graph_call(tx, fn, *args, **kwargs) -> V.TensorVT:
    """A call_function node (plain Python arguments become constants)."""
    wrap = _wrap
    return tx.output.call("call_function", fn, tuple(wrap(a) for a in args),
                          {k: wrap(v) for k, v in kwargs.items()})  # fmt: skip


def graph_method(tx, name, t, *args, **kwargs) -> V.TensorVT:
    """A call_method node on tensor `t`."""
    wrap = _wrap
    return tx.output.call("call_method", name, (t, *(wrap(a) for a in args)),
                          {k: wrap(v) for k, v in kwargs.items()})  # fmt: skip


def keep(vt) -> bool:
    """The keepdims flag."""
    return False if vt is NO else bool(const(vt, "keepdims"))


def shape_arg(vt, what="shape"):
    """A shape argument (an int or a sequence) as a tuple; sizes read from arrays with dynamic
    sizes stay symbolic (SymIntVTs), so the graph takes them as inputs."""
    from .symbolic import SymIntVT

    items = vt.items if isinstance(vt, V.ListVT) else [vt]
    if any(isinstance(i, SymIntVT) for i in items):
        return tuple(i if isinstance(i, SymIntVT) else const(i, what) for i in items)
    value = const(vt, what)
    return (value,) if isinstance(value, int) else tuple(value)
