"""Behaviour of symbolic values: calls, attributes, operators, items and iteration."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import operator
import types

import sympy
import torch

from . import tensor_ops as T
from . import variables as V
from .autograd_function import CHECKPOINT, call_autograd_function, call_checkpoint
from .builder import is_const_value
from .control_flow import handler_for
from .distributed import eager_call_reason
from .exc import AttrMissing, GenericFallback, PyExc, Unsupported  # noqa: F401 (re-exported)
from .frame import inline_call
from .source import AttrSource, ItemSource, module_param_source
from .typing_forms import is_typing_form, typing_subscript
from .user_kernels import TritonLaunchVT, is_triton_kernel
from .user_kernels import launch as launch_triton_kernel
from .symbolic import COMPARE, INT_OPS, SymIntVT, SymSliceVT, as_sym, is_int_vt
from .tensor_parallel import call_parallel_module, parallel_style


# -- constants ------------------------------------------------------------------------------------
def try_const(vt, specialize=False):
    """(True, python value) when `vt` is a constant or a tuple/list of constants. With
    `specialize`, a symbolic int counts as its current value (guarded)."""
    if isinstance(vt, V.ConstVT):
        return True, vt.value
    if isinstance(vt, SymIntVT):
        return (True, vt.env.specialize(vt)) if specialize else (False, None)
    if isinstance(vt, SymSliceVT) and specialize:
        return True, slice(*(try_const(p, True)[1] for p in vt.parts))
    if isinstance(vt, V.ListVT) and not isinstance(vt, V.NamedTupleVT):
        vals = []
        for i in vt.items:
            ok, v = try_const(i, specialize)
            if not ok:
                return False, None
            vals.append(v)
        return True, (tuple(vals) if vt.is_tuple else vals)
    if isinstance(vt, V.SetVT) and not any(isinstance(k, ObjKey) for k in vt.items):
        return True, set(vt.items)
    return False, None


def const_of(vt, what="value"):
    ok, value = try_const(vt, specialize=True)
    if not ok:
        raise Unsupported(f"{what} must be a constant, got {type(vt).__name__}")
    return value


class ObjKey:
    """A dict/set key standing for a real object (a module, a function): hashed by identity."""

    __slots__ = ("vt", "obj")

    def __init__(self, vt, obj):
        self.vt, self.obj = vt, obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, ObjKey) and other.obj is self.obj


def identity_of(vt):
    """What `vt is other` and `id(vt)` compare: the real object a VT mirrors, else (a list, dict
    or object made while tracing) the VT itself, which stands for one object."""
    if isinstance(vt, V.TensorVT):
        return _not_generic(vt).real if vt.real is not None else vt.node
    if isinstance(vt, V.ConstVT):
        if vt.value is None or isinstance(vt.value, (bool, type(Ellipsis), type(NotImplemented))):
            return vt.value
        # Equal constants may or may not be one object at run time (guards compare values).
        raise Unsupported(f"identity of a {type(vt.value).__name__} constant")
    if isinstance(vt, (V.ModuleVT, V.ObjectVT, V.FunctionVT, V.ClassVT, V.BuiltinVT,
                       V.PyModuleVT)):  # fmt: skip
        return real_value(_not_generic(vt))
    if isinstance(vt, (V.ListVT, V.DictVT, V.SetVT, V.NewObjectVT, V.NestedFunctionVT)):
        return vt
    raise Unsupported(f"identity of a {type(vt).__name__}")


_KEYED_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                     torch.nn.ParameterList, torch.nn.ParameterDict)


def module_len(vt) -> int:
    """len() of a module: torch's containers count the entries their guarded keys list; another
    class's __len__ may read instance state no guard covers, so a generic frame falls back."""
    if getattr(vt, "generic", False) and type(vt.module).__len__ not in {
            c.__len__ for c in _KEYED_CONTAINERS}:  # fmt: skip
        raise GenericFallback(f"len() of a {type(vt.module).__name__}")
    return len(vt.module)


def _not_generic(vt):
    """`vt`, whose identity is about to be used: a module standing for any instance, or the
    parameter of one (tied in one instance, not in another), has none."""
    if getattr(vt, "generic", False):
        what = type(vt.module).__name__ if isinstance(vt, V.ModuleVT) else "parameter"
        raise GenericFallback(f"the identity of a {what} (is, id, dict key)")
    return vt


def const_key(vt):
    if isinstance(vt, V.IdVT):
        return ObjKey(vt, vt.identity)
    ok, value = try_const(vt, specialize=True)
    if not ok:
        if isinstance(vt, (V.ModuleVT, V.FunctionVT, V.ClassVT, V.ObjectVT, V.BuiltinVT,
                           V.PyModuleVT)):  # fmt: skip
            return ObjKey(vt, real_value(_not_generic(vt)))
        if isinstance(vt, V.TensorVT):
            return ObjKey(vt, _not_generic(vt).real if vt.real is not None else vt.node)
        raise Unsupported(f"dict/set key must be a constant, got {type(vt).__name__}")
    return value if not isinstance(value, list) else tuple(value)


def key_vt(k):
    """The VT of a dict/set key."""
    return k.vt if isinstance(k, ObjKey) else wrap_const(k)


def wrap_const(value) -> V.VT:
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return V.ListVT([wrap_const(v) for v in value], is_tuple=isinstance(value, tuple))
    if type(value) is set:
        return V.SetVT(value)
    if not is_const_value(value) and not isinstance(value, (types.FunctionType, type)):
        raise Unsupported(f"a {type(value).__name__} computed at trace time")
    if isinstance(value, type):
        return V.ClassVT(value)
    return V.ConstVT(value)


def _wrap_set(value):
    return V.SetVT(value)


def real_callable(vt):
    """The real function or bound method a symbolic callable stands for (for introspection)."""
    if isinstance(vt, V.BoundMethodVT):
        return types.MethodType(real_callable(vt.fn), real_value(vt.self_vt))
    if isinstance(vt, V.NestedFunctionVT):
        raise Unsupported("introspecting a function made while tracing")
    return real_value(vt)


def real_value(vt):
    """The real Python object behind a VT that mirrors one."""
    for attr in ("module", "obj", "fn", "cls"):
        if hasattr(vt, attr) and not isinstance(vt, (V.BoundMethodVT, V.SuperVT, V.NewObjectVT)):
            return getattr(vt, attr)
    ok, value = try_const(vt)
    if ok:
        return value
    raise Unsupported(f"{type(vt).__name__} has no real value")


# -- mutation of containers -----------------------------------------------------------------------
def mutate_list(tx, vt):
    if not isinstance(vt, V.ListVT) or vt.is_tuple:
        raise Unsupported(f"mutating a {type(vt).__name__}")
    if vt.source is not None:
        tx.output.mutated[id(vt)] = vt
    return vt


def mutate_dict(tx, vt):
    if vt.source is not None:
        tx.output.mutated[id(vt)] = vt
    return vt


# -- iteration ------------------------------------------------------------------------------------
def unpack(tx, vt) -> list:
    it = get_iter(tx, vt)
    if it is vt:  # consuming an iterator
        items = it.items[it.pos :]
        it.pos = len(it.items)
        return items
    return list(it.items)


def get_iter(tx, vt) -> V.IteratorVT:
    if isinstance(vt, V.IteratorVT):
        return vt
    if isinstance(vt, V.ListVT):
        return V.IteratorVT(vt.items)
    if isinstance(vt, V.DictVT):
        return V.IteratorVT([key_vt(k) for k in vt.items])
    if isinstance(vt, V.SetVT):
        return V.IteratorVT([key_vt(k) for k in vt.items])
    if isinstance(vt, V.DataclassVT) and issubclass(vt.cls, dict):
        return V.IteratorVT([V.ConstVT(k) for k, v in vt.attrs.items() if not _is_none(v)])
    if isinstance(vt, V.ConstVT) and isinstance(vt.value, (range, str, tuple, torch.Size, bytes,
                                                            frozenset)):  # fmt: skip
        return V.IteratorVT([wrap_const(v) for v in vt.value])
    if isinstance(vt, V.TensorVT):
        if vt.example.dim() == 0:
            raise Unsupported("iteration over a 0-d tensor")
        n = vt.example.shape[0]
        if T.sym_sizes(vt, "iteration") is not None:  # unrolled: the length is guarded
            vt_len = tx.output.shape_env.size_vt(vt.node, 0, vt.sym[0])
            n = const_of(vt_len)
        return V.IteratorVT([getitem(tx, vt, V.ConstVT(i)) for i in range(n)])
    if isinstance(vt, V.NdarrayVT):
        from .numpy_values import iterate

        return V.IteratorVT(iterate(tx, vt))
    if isinstance(vt, V.ModuleVT):
        return V.IteratorVT(module_children(tx, vt))
    if isinstance(vt, (V.ObjectVT, V.NewObjectVT)) and py_method(vt.python_type(), "__iter__"):
        return get_iter(tx, call_method(tx, vt, "__iter__", [], {}))
    raise Unsupported(f"iteration over {_type_name(vt)}")


def module_children(tx, vt: V.ModuleVT) -> list:
    m = vt.module
    if isinstance(m, torch.nn.ModuleDict):
        return [V.ConstVT(k) for k in m._modules]
    if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
        return [module_entry(tx, vt, "_modules", k) for k in m._modules]
    if isinstance(m, (torch.nn.ParameterList,)):
        return [module_entry(tx, vt, "_parameters", k) for k in m._parameters]
    raise Unsupported(f"iteration over module {type(m).__name__}")


def module_entry(tx, vt, kind: str, key) -> V.VT:
    """Entry `key` of a module's `_parameters`, `_buffers` or `_modules` table; a None entry is
    guarded as None where the module stands for any instance (another may hold one there)."""
    value = getattr(vt.module, kind)[key]
    source = module_param_source(vt.source, kind, key)
    if value is None:
        if vt.generic:
            tx.output.guards.add("ID", source, None)
        return V.ConstVT(None)
    return tx.builder.wrap(value, source)


def dict_items(tx, vt) -> dict:
    if isinstance(vt, V.DictVT):
        return dict(vt.items)
    if isinstance(vt, V.DataclassVT):
        return {k: v for k, v in vt.attrs.items() if not _is_none(v)}
    ok, value = try_const(vt)
    if ok and isinstance(value, dict):
        return {k: wrap_const(v) for k, v in value.items()}
    raise Unsupported(f"** of a {_type_name(vt)}")


def _is_none(vt):
    return isinstance(vt, V.ConstVT) and vt.value is None


def is_none(vt):
    return _is_none(vt)


# -- truth, identity, containment -----------------------------------------------------------------
def truth(tx, vt) -> bool:
    if isinstance(vt, V.ConstVT):
        return bool(vt.value)
    if isinstance(vt, SymIntVT):
        return vt.env.decide(vt.expr > 0) if vt.expr.is_nonnegative else vt.env.decide(
            sympy.Ne(vt.expr, 0))
    if isinstance(vt, (V.TensorVT, V.NdarrayVT)):
        raise Unsupported("data-dependent branch on a tensor or array value (if tensor: ...)")
    if isinstance(vt, (V.ListVT, V.DictVT, V.SetVT)):
        return len(vt.items) > 0
    if isinstance(vt, V.DataclassVT) and issubclass(vt.cls, dict):
        return any(not _is_none(v) for v in vt.attrs.values())
    if isinstance(vt, V.ModuleVT):
        if hasattr(type(vt.module), "__len__"):
            return module_len(vt) > 0
        return True
    if isinstance(vt, (V.ObjectVT, V.NewObjectVT)):
        cls = vt.python_type()
        if py_method(cls, "__bool__") or py_method(cls, "__len__"):
            return truth(tx, call_method(tx, vt, "__bool__" if py_method(cls, "__bool__")
                                         else "__len__", [], {}))  # fmt: skip
        if isinstance(vt, V.ObjectVT) and (hasattr(cls, "__bool__") or hasattr(cls, "__len__")):
            return bool(vt.obj)  # a C type's truth: cheap and guarded by the type guard
        return True
    if vt is V.NULL:
        raise Unsupported("truth of NULL")
    return True


def is_same(tx, a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, V.ConstVT) and isinstance(b, V.ConstVT):
        return a.value is b.value
    if isinstance(a, V.TensorVT) and isinstance(b, V.TensorVT):
        if a.node is b.node:
            return True
        _not_generic(a), _not_generic(b)  # two parameters apart here may be one elsewhere
        return False
    try:
        return real_value(_not_generic(a)) is real_value(_not_generic(b))
    except Unsupported:
        return False


def contains(tx, container, item) -> bool:
    if isinstance(container, (V.DictVT, V.SetVT)):
        return const_key(item) in container.items
    if isinstance(container, V.DataclassVT):
        return const_key(item) in container.attrs and not _is_none(container.attrs[const_key(item)])
    if isinstance(container, V.ListVT):
        ok, value = try_const(item)
        for x in container.items:
            if x is item or (ok and isinstance(x, V.ConstVT) and x.value == value):
                return True
            if isinstance(x, V.TensorVT) or isinstance(item, V.TensorVT):
                if isinstance(x, V.TensorVT) and isinstance(item, V.TensorVT):
                    raise Unsupported("`in` over tensors compares data")
        return False
    if isinstance(container, V.ConstVT):
        return const_of(item) in container.value
    if isinstance(container, V.ModuleVT) and isinstance(container.module, torch.nn.ModuleDict):
        return const_key(item) in container.module._modules
    if isinstance(container, (V.ObjectVT, V.NewObjectVT)) and py_method(
        container.python_type(), "__contains__"
    ):
        return truth(tx, call_method(tx, container, "__contains__", [item], {}))
    raise Unsupported(f"`in` on {_type_name(container)}")


# -- operators ------------------------------------------------------------------------------------
_REFLECTED = {operator.add: "__radd__", operator.mul: "__rmul__", operator.sub: "__rsub__"}
_DUNDER = {operator.add: "__add__", operator.sub: "__sub__", operator.mul: "__mul__",
           operator.truediv: "__truediv__", operator.matmul: "__matmul__",
           operator.eq: "__eq__", operator.ne: "__ne__", operator.lt: "__lt__",
           operator.le: "__le__", operator.gt: "__gt__", operator.ge: "__ge__",
           operator.getitem: "__getitem__", operator.neg: "__neg__"}  # fmt: skip
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
            operator.imod: operator.mod, operator.ipow: operator.pow,
            operator.imatmul: operator.matmul, operator.iand: operator.and_,
            operator.ior: operator.or_, operator.ixor: operator.xor,
            operator.ilshift: operator.lshift, operator.irshift: operator.rshift}  # fmt: skip


def binop(tx, op, a, b):
    """a <op> b for symbolic values."""
    if isinstance(a, V.TensorVT) or isinstance(b, V.TensorVT):
        for x in (a, b):
            if not isinstance(x, (V.TensorVT, V.ConstVT, V.ListVT, SymIntVT)):
                raise Unsupported(f"{op.__name__} of a tensor and a {_type_name(x)}")
        if not isinstance(a, V.TensorVT):  # `n += t` with n a number: Python computes n + t
            op = _INPLACE.get(op, op)
            if op is operator.pow:  # fx prints pow(-2, t) as `-2 ** t`, read as -(2 ** t)
                op = torch.pow
        return tx.output.call("call_function", op, (a, b), {})
    if _numpy_operand(a) or _numpy_operand(b):
        from .numpy_values import binop as numpy_binop

        return numpy_binop(tx, op, a, b)
    if isinstance(a, SymIntVT) or isinstance(b, SymIntVT):
        return sym_binop(tx, op, a, b)
    ok_a, va = try_const(a)
    ok_b, vb = try_const(b)
    if ok_a and ok_b and not (isinstance(a, V.ListVT) and not a.is_tuple and op in _INPLACE):
        try:
            return wrap_const(op(va, vb))
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"{op.__name__}({va!r}, {vb!r}) raised {type(e).__name__}") from e
    base = _INPLACE.get(op, op)
    if isinstance(a, V.ListVT) and isinstance(b, (V.ListVT, V.ConstVT)):
        if base is operator.add:
            other = unpack(tx, b)
            if op is operator.iadd and not a.is_tuple:
                mutate_list(tx, a).items.extend(other)
                return a
            return V.ListVT(a.items + other, is_tuple=a.is_tuple)
        if base is operator.mul and isinstance(b, V.ConstVT):
            return V.ListVT(a.items * b.value, is_tuple=a.is_tuple)
        if op in (operator.eq, operator.ne) and isinstance(b, V.ListVT):
            same = len(a.items) == len(b.items) and all(
                truth(tx, binop(tx, operator.eq, x, y)) for x, y in zip(a.items, b.items)
            )
            return V.ConstVT(same if op is operator.eq else not same)
    if (isinstance(a, V.ConstVT) and isinstance(b, V.ListVT) and base is operator.add
            and type(a.value) is (tuple if b.is_tuple else list)):  # fmt: skip
        return V.ListVT(unpack(tx, a) + b.items, is_tuple=b.is_tuple)  # (-1,) + x.shape[1:]
    if isinstance(a, V.ConstVT) and isinstance(b, V.ListVT) and base is operator.mul:
        return V.ListVT(b.items * a.value, is_tuple=b.is_tuple)
    if isinstance(a, V.DictVT) and isinstance(b, V.DictVT) and base is operator.or_:
        return V.DictVT({**a.items, **b.items})
    if isinstance(a, V.IdVT) or isinstance(b, V.IdVT):
        if op in (operator.eq, operator.ne) and isinstance(a, V.IdVT) and isinstance(b, V.IdVT):
            same = a.identity is b.identity
            return V.ConstVT(same if op is operator.eq else not same)
        raise Unsupported(f"{getattr(op, '__name__', op)} of an id() (its value is not known)")
    if op in (operator.eq, operator.ne):
        same = is_same(tx, a, b)
        if not isinstance(a, (V.ObjectVT, V.NewObjectVT)) or not py_method(
            a.python_type(), "__eq__"
        ):
            return V.ConstVT(same if op is operator.eq else not same)
    name = _DUNDER.get(base)
    if name and isinstance(a, (V.ObjectVT, V.NewObjectVT)) and py_method(a.python_type(), name):
        return call_method(tx, a, name, [b], {})
    raise Unsupported(f"{getattr(op, '__name__', op)} of {_type_name(a)} and {_type_name(b)}")


def _numpy_operand(x) -> bool:
    """An ndarray, or a NumPy scalar or dtype constant: operators follow NumPy (numpy_values)."""
    if isinstance(x, V.NdarrayVT):
        return True
    module = (getattr(type(x.value), "__module__", "") or "") if isinstance(x, V.ConstVT) else ""
    return module == "numpy" or module.startswith("numpy.")


def sym_binop(tx, op, a, b):
    """a <op> b where one side is a symbolic int: a symbolic int for + - * // % **, a guarded
    decision for comparisons, and for anything else (true division, a float operand, list
    repetition) the answer at the current value, guarded."""
    env = a.env if isinstance(a, SymIntVT) else b.env
    base = _INPLACE.get(op, op)
    if is_int_vt(a) and is_int_vt(b):
        if base in INT_OPS:
            return env.arith(base, a, b)
        if base in COMPARE:
            return env.decide_compare(base, a, b)
    a, b = (V.ConstVT(const_of(x)) if isinstance(x, SymIntVT) else x for x in (a, b))
    return binop(tx, op, a, b)


def unop(tx, op, a):
    if isinstance(a, V.TensorVT):
        return tx.output.call("call_function", op, (a,), {})
    if isinstance(a, V.NdarrayVT):
        from .numpy_values import unop as numpy_unop

        return numpy_unop(tx, op, a)
    if isinstance(a, SymIntVT) and op in (operator.neg, operator.pos):
        return a.env.neg(a) if op is operator.neg else a
    ok, value = try_const(a)
    if ok:
        return wrap_const(op(value))
    raise Unsupported(f"{op.__name__} of {_type_name(a)}")


def make_slice(parts):
    if any(isinstance(p, SymIntVT) for p in parts):
        return SymSliceVT(parts)
    values = [const_of(p, "slice bound") for p in parts]
    return V.ConstVT(slice(*values))


# -- items ----------------------------------------------------------------------------------------
def getitem(tx, obj, key):
    if isinstance(obj, V.TensorVT):
        if isinstance(key, V.TensorVT) and key.example.dtype == torch.bool:
            raise Unsupported("indexing with a boolean mask (output shape depends on data)")
        return tx.output.call("call_function", operator.getitem, (obj, key), {})
    if isinstance(obj, V.NdarrayVT):
        from .numpy_values import getitem as numpy_getitem

        return numpy_getitem(tx, obj, key)
    if isinstance(obj, V.ListVT):
        k = const_of(key, "list index")
        if isinstance(k, slice):
            return V.ListVT(obj.items[k], is_tuple=obj.is_tuple)
        try:
            return obj.items[k]
        except IndexError:
            raise PyExc(V.ExcVT(IndexError, [V.ConstVT("list index out of range")])) from None
        except TypeError as e:
            raise Unsupported(f"list index: {e}") from None
    if isinstance(obj, V.DictVT):
        k = const_key(key)
        if k not in obj.items:
            raise PyExc(V.ExcVT(KeyError, [key]), f"KeyError: {k!r}")
        return obj.items[k]
    if isinstance(obj, V.DataclassVT):
        k = const_of(key, "key")
        if isinstance(k, str):
            return obj.attrs[k]
        values = [v for v in obj.attrs.values() if not _is_none(v)]
        return V.ListVT(values[k], is_tuple=True) if isinstance(k, slice) else values[k]
    if isinstance(obj, V.ConstVT):
        try:
            return wrap_const(obj.value[const_of(key, "index")])
        except (IndexError, KeyError) as e:
            raise PyExc(V.ExcVT(type(e), [key]), f"indexing a constant: {e!r}") from None
        except TypeError as e:
            raise Unsupported(f"indexing a constant: {e}") from None
    if isinstance(obj, V.ModuleVT):
        return module_getitem(tx, obj, key)
    if isinstance(obj, V.ObjectVT) and is_typing_form(obj.obj):
        return typing_subscript(tx, obj, key)
    if isinstance(obj, V.ObjectVT) and is_triton_kernel(obj.obj):
        return TritonLaunchVT(obj, key)  # kernel[grid]: see user_kernels.py
    if isinstance(obj, (V.ObjectVT, V.NewObjectVT)) and py_method(obj.python_type(),
                                                                   "__getitem__"):  # fmt: skip
        return call_method(tx, obj, "__getitem__", [key], {})
    raise Unsupported(f"indexing a {_type_name(obj)}")


def module_getitem(tx, vt, key):
    m = vt.module
    k = const_of(key, "module index")
    if isinstance(m, torch.nn.ModuleDict):
        return module_entry(tx, vt, "_modules", k)
    if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
        keys = list(m._modules)
        if isinstance(k, slice):
            if isinstance(m, torch.nn.ModuleList):
                return V.ListVT([module_entry(tx, vt, "_modules", kk) for kk in keys[k]])
            raise Unsupported("slicing an nn.Sequential")
        return module_entry(tx, vt, "_modules", keys[k])
    if isinstance(m, torch.nn.ParameterList):
        return module_entry(tx, vt, "_parameters", str(k if k >= 0 else len(m) + k))
    if py_method(type(m), "__getitem__"):
        return call_method(tx, vt, "__getitem__", [key], {})
    raise Unsupported(f"indexing module {type(m).__name__}")


def setitem(tx, obj, key, value):
    if isinstance(obj, V.TensorVT):
        tx.output.call("call_function", operator.setitem, (obj, key, value), {})
        return
    if isinstance(obj, V.NdarrayVT):
        from .numpy_values import setitem as numpy_setitem

        numpy_setitem(tx, obj, key, value)
        return
    if isinstance(obj, V.ListVT):
        k = const_of(key, "list index")
        items = mutate_list(tx, obj).items
        if isinstance(k, slice):
            items[k] = unpack(tx, value)
        else:
            items[k] = value
        return
    if isinstance(obj, V.DictVT):
        mutate_dict(tx, obj).items[const_key(key)] = value
        return
    if isinstance(obj, V.DataclassVT):
        obj.attrs[const_of(key, "key")] = value
        return
    if isinstance(obj, (V.ObjectVT, V.NewObjectVT)) and py_method(obj.python_type(),
                                                                   "__setitem__"):  # fmt: skip
        call_method(tx, obj, "__setitem__", [key, value], {})
        return
    raise Unsupported(f"item assignment on a {_type_name(obj)}")


def delitem(tx, obj, key):
    if isinstance(obj, V.DictVT):
        mutate_dict(tx, obj).items.pop(const_key(key), None)
    elif isinstance(obj, V.ListVT):
        del mutate_list(tx, obj).items[const_of(key, "index")]
    else:
        raise Unsupported(f"del on a {_type_name(obj)}")


# -- attributes -----------------------------------------------------------------------------------
def getattr_vt(tx, obj, name: str):
    from .attrs import getattr_impl

    return getattr_impl(tx, obj, name)


def setattr_vt(tx, obj, name: str, value):
    from .attrs import setattr_impl

    setattr_impl(tx, obj, name, value)


def call_method(tx, obj, name, args, kwargs):
    return call(tx, getattr_vt(tx, obj, name), args, kwargs)


# -- custom autograd.Functions and checkpoint (autograd_function.py) ---------------------------
_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


# -- calls ----------------------------------------------------------------------------------------
def call(tx, fn, args: list, kwargs: dict):
    """fn(*args, **kwargs) for symbolic values."""
    if isinstance(fn, V.FunctionVT):
        if fn.fn is _FUNCTION_APPLY and args and isinstance(args[0], V.ClassVT):
            return call_autograd_function(tx, args[0], args[1:], kwargs)
        if fn.fn is CHECKPOINT:
            return call_checkpoint(tx, args, kwargs)
        control_flow = handler_for(fn.fn)  # torch.cond, torch.while_loop, map
        if control_flow is not None:
            return control_flow(tx, args, kwargs)
        answer = T.compiling_query(fn.fn)
        if answer is not None:
            return V.ConstVT(answer)
        if fn.fn is inspect.signature and len(args) == 1 and not kwargs:
            return V.ConstVT(inspect.signature(real_callable(args[0])))
        if T.is_graph_fn(fn.fn):
            return T.torch_call(tx, fn.fn, args, kwargs)
        if getattr(fn.fn, "_dynamo_marked_constant", False):
            return constant_result(fn.fn, args, kwargs)
        if fn.fn is copy.deepcopy or fn.fn is copy.copy:
            from .copying import copy_call

            return copy_call(tx, fn.fn, args, kwargs)
        if getattr(fn.fn, "_ember_disabled", False):
            raise Unsupported(f"call to ember.disable'd function {fn.fn.__qualname__}")
        return inline_call(tx, fn, args, kwargs)
    if isinstance(fn, V.NestedFunctionVT):
        return inline_call(tx, fn, args, kwargs)
    if isinstance(fn, V.BoundMethodVT):
        return call(tx, fn.fn, [fn.self_vt, *args], kwargs)
    if isinstance(fn, V.MethodVT):
        from .methods import call_method_vt

        return call_method_vt(tx, fn, args, kwargs)
    if isinstance(fn, V.NumpyFunctionVT):
        from .numpy_map import call_function as call_numpy

        return call_numpy(tx, fn, args, kwargs)
    if isinstance(fn, V.BuiltinVT):
        from .pybuiltins import call_builtin

        scripted = _scripted_python(tx, fn)
        if scripted is not None:
            return call(tx, scripted, args, kwargs)
        return call_builtin(tx, fn.fn, args, kwargs)
    if isinstance(fn, V.ModuleVT):
        return call_module(tx, fn, args, kwargs)
    if isinstance(fn, V.ClassVT) and getattr(fn.cls, "__module__", None) == "numpy":
        from .numpy_map import call_function as call_numpy

        return call_numpy(tx, fn.cls, args, kwargs)
    if isinstance(fn, V.ClassVT):
        from .pybuiltins import construct

        return construct(tx, fn, args, kwargs)
    if isinstance(fn, V.ContextExitVT) and fn.user:
        return call_method(tx, fn.ctx, "__exit__", args, kwargs)
    if isinstance(fn, V.ContextExitVT):
        from .pybuiltins import exit_grad_mode

        return exit_grad_mode(tx, fn.ctx)
    if isinstance(fn, V.ObjectVT):
        if isinstance(fn.obj, functools.partial):
            p = fn.obj
            func = tx.builder.wrap(p.func, AttrSource(fn.source, "func"))
            # the bound arguments are guarded where they are read (objects are type guarded)
            src = (lambda a, k: None) if fn.source is None else (  # noqa: E731
                lambda a, k: ItemSource(AttrSource(fn.source, a), k))
            pargs = [tx.builder.wrap(a, src("args", i)) if is_const_value(a) else _no_src(a)
                     for i, a in enumerate(p.args)]  # fmt: skip
            pkw = {k: tx.builder.wrap(v, src("keywords", k)) if is_const_value(v) else _no_src(v)
                   for k, v in p.keywords.items()}  # fmt: skip
            return call(tx, func, [*pargs, *args], {**pkw, **kwargs})
        if isinstance(fn.obj, functools._lru_cache_wrapper) and isinstance(
            getattr(fn.obj, "__wrapped__", None), types.FunctionType
        ):
            if getattr(fn.obj.__wrapped__, "_dynamo_marked_constant", False):
                return constant_result(fn.obj, args, kwargs)
            # A cache in front of a function that is assumed pure (else caching it would be
            # wrong): tracing the function computes what the cache holds or would hold.
            wrapped = AttrSource(fn.source, "__wrapped__") if fn.source is not None else None
            return call(tx, tx.builder.wrap(fn.obj.__wrapped__, wrapped), args, kwargs)
        if py_method(type(fn.obj), "__call__"):
            return call_method(tx, fn, "__call__", args, kwargs)
    if isinstance(fn, V.NewObjectVT) and py_method(fn.cls, "__call__"):
        return call_method(tx, fn, "__call__", args, kwargs)
    if isinstance(fn, V.GradModeVT):
        raise Unsupported("grad-mode object used as a decorator inside compiled code")
    if isinstance(fn, TritonLaunchVT):
        return launch_triton_kernel(tx, fn, args, kwargs)
    raise Unsupported(f"call to a {_type_name(fn)}")


def _scripted_python(tx, fn):
    """The Python function a `torch.jit.script`ed function was compiled from, as a VT to trace
    (torch.jit keeps it as `_torchdynamo_inline`, for compilers that trace Python): the
    TorchScript interpreter runs the same ops, out of the tracer's sight. None for other
    callables."""
    if not isinstance(fn.fn, torch.jit.ScriptFunction):
        return None
    original = getattr(fn.fn, "_torchdynamo_inline", None)
    if not isinstance(original, types.FunctionType):
        return None
    source = AttrSource(fn.source, "_torchdynamo_inline") if fn.source is not None else None
    return tx.builder.wrap(original, source)


def constant_result(fn, args, kwargs):
    """A call of a function marked as having a constant result (`_dynamo_marked_constant`, the
    marker torch's `assume_constant_result` sets and transformers sets on its install probes):
    run now with constant arguments, its result baked into the graph."""
    ok, cargs = try_const(V.TupleVT(list(args)))
    ckw = {k: try_const(v) for k, v in kwargs.items()}
    if not ok or not all(o for o, _ in ckw.values()):
        raise Unsupported(f"{fn.__qualname__} (constant result) called with non-constants")
    value = fn(*cargs, **{k: v for k, (_, v) in ckw.items()})
    if not is_const_value(value):
        raise Unsupported(f"{fn.__qualname__} (constant result) returned a {type(value).__name__}")
    return V.ConstVT(value)


def _no_src(a):
    raise Unsupported("functools.partial with non-constant bound arguments")


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def call_module(tx, vt: V.ModuleVT, args, kwargs):
    """Inline `module(*args)`: forward pre-hooks, forward, forward hooks (guarded either way)."""
    m = vt.module
    from torch.nn.modules import module as module_mod

    style = parallel_style(m)  # parallelize_module's colwise/rowwise hooks: captured
    if style is not None:
        return call_parallel_module(tx, vt, style, args, kwargs)
    eager_reason = eager_call_reason(m)
    if eager_reason is not None:
        raise Unsupported(eager_reason)

    global_hooks = (module_mod._global_forward_hooks, module_mod._global_forward_pre_hooks,
                    module_mod._global_backward_hooks,
                    getattr(module_mod, "_global_backward_pre_hooks", {}))  # fmt: skip
    if any(global_hooks) or m._backward_hooks or getattr(m, "_backward_pre_hooks", None):
        raise Unsupported(f"module {type(m).__name__} has backward or global hooks")
    if vt.source is None:
        raise Unsupported("calling a module reached without a source")
    if not m._forward_hooks and not m._forward_pre_hooks:
        tx.output.guards.add("NO_HOOKS", vt.source, _HOOK_DICTS)
        return call_forward(tx, vt, args, kwargs)
    return call_with_hooks(tx, vt, args, kwargs)


def call_with_hooks(tx, vt, args, kwargs):
    m = vt.module
    if m._forward_hooks_with_kwargs or getattr(m, "_forward_pre_hooks_with_kwargs", None):
        raise Unsupported("module hooks taking kwargs")
    if getattr(m, "_forward_hooks_always_called", None):
        raise Unsupported("module hooks with always_call=True")
    tx.output.guards.add("NO_HOOKS", vt.source, ("_backward_hooks", "_backward_pre_hooks"))
    hook_vts = {}
    for kind in ("_forward_pre_hooks", "_forward_hooks"):
        table = getattr(m, kind)
        src = AttrSource(vt.source, kind)
        tx.output.guards.add("DICT_KEYS", src, tuple(table))
        hook_vts[kind] = [tx.builder.wrap(h, ItemSource(src, k)) for k, h in table.items()]
    for hook in hook_vts["_forward_pre_hooks"]:
        result = call(tx, hook, [vt, V.TupleVT(list(args))], {})
        if not (isinstance(result, V.ConstVT) and result.value is None):
            args = result.items if isinstance(result, V.ListVT) and result.is_tuple else [result]
    out = call_forward(tx, vt, list(args), kwargs)
    for hook in hook_vts["_forward_hooks"]:
        result = call(tx, hook, [vt, V.TupleVT(list(args)), out], {})
        if not (isinstance(result, V.ConstVT) and result.value is None):
            out = result
    return out


def call_forward(tx, vt, args, kwargs):
    m = vt.module
    if "forward" in m.__dict__:
        fwd = tx.builder.wrap(m.__dict__["forward"], AttrSource(vt.source, "forward"))
        return call(tx, fwd, args, kwargs)
    forward = type(m).forward
    if not isinstance(forward, types.FunctionType):
        raise Unsupported(f"module {type(m).__name__} has no Python forward")
    return inline_call(tx, V.FunctionVT(forward, None), [vt, *args], kwargs)


def py_method(cls, name):
    """The Python function `name` on `cls`'s MRO, if it is one (not a C slot)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            return attr if isinstance(attr, types.FunctionType) else None
    return None


def _type_name(vt) -> str:
    try:
        t = vt.python_type()
        return f"{t.__name__} ({type(vt).__name__})"
    except Exception:
        return type(vt).__name__


def is_dataclass_type(cls) -> bool:
    return dataclasses.is_dataclass(cls) and isinstance(cls, type)


def signature_of(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
