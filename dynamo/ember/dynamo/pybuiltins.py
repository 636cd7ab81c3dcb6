"""Python builtins, `math`, `operator`, class construction and grad-mode contexts, symbolically."""

from __future__ import annotations

import builtins
import dataclasses
import math
import operator
import types

import torch

from . import tensor_ops as T
from . import variables as V
from .attrs import python_class
from .builder import is_namedtuple_type
from .calls import (AttrMissing, binop, call, const_key, const_of, contains, get_iter,
                    getattr_vt, getitem, is_same, module_len, real_value, setattr_vt, truth,
                    try_const, unop, unpack, wrap_const)  # fmt: skip
from .exc import PyExc, Unsupported
from .frame import inline_call
from .opaque_ops import call_user_op, user_op_target
from .symbolic import SizeVT, SymIntVT, as_sym, is_int_vt

_OPERATOR_BINOPS = {getattr(operator, n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor",
    "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge", "iadd", "isub", "imul", "itruediv",
    "ifloordiv", "imod", "ipow", "imatmul", "iand", "ior", "ixor")}  # fmt: skip
_OPERATOR_UNOPS = {operator.neg, operator.pos, operator.invert, operator.abs}


def call_builtin(tx, fn, args, kwargs):
    """A call to a C function: a builtin, math/operator, a torch op or a Tensor method."""
    handler = _HANDLERS.get(fn)
    if handler is not None:
        return handler(tx, *args, **kwargs)
    if fn in _OPERATOR_BINOPS and len(args) == 2:
        return binop(tx, fn, *args)
    if fn in _OPERATOR_UNOPS and len(args) == 1:
        return unop(tx, operator.neg if fn is operator.neg else fn, args[0])
    if fn is operator.getitem:
        return getitem(tx, *args)
    if fn is operator.not_:
        return V.ConstVT(not truth(tx, args[0]))
    if fn is operator.truth:
        return V.ConstVT(truth(tx, args[0]))
    if fn is operator.contains:
        return V.ConstVT(contains(tx, args[0], args[1]))
    if fn is operator.is_ or fn is operator.is_not:
        same = is_same(tx, *args)
        return V.ConstVT(same if fn is operator.is_ else not same)
    if fn is operator.index:
        if isinstance(args[0], SymIntVT):
            return args[0]
        return V.ConstVT(operator.index(const_of(args[0])))
    mod = getattr(fn, "__module__", None)
    if mod == "math" or getattr(fn, "__self__", None) is math:
        if any(isinstance(a, V.TensorVT) for a in args):
            raise Unsupported(f"math.{fn.__name__} of a tensor (reads tensor data)")
        return wrap_const(fn(*[const_of(a) for a in args]))
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        objclass = getattr(fn, "__objclass__", None)
        if objclass in (torch._C.TensorBase, torch.Tensor) and args and isinstance(
            args[0], V.TensorVT
        ):
            return T.tensor_method(tx, args[0], fn.__name__, list(args[1:]), kwargs)
        if args and objclass in (list, dict, tuple, str, set):
            return call(tx, getattr_vt(tx, args[0], fn.__name__), list(args[1:]), kwargs)
    user_op = user_op_target(fn)
    if user_op is not None:
        return call_user_op(tx, user_op, args, kwargs)
    if T.is_graph_fn(fn) or T.is_const_fn(fn) or T.is_break_fn(fn) or (
        fn is torch._C._set_grad_enabled
    ):
        return T.torch_call(tx, fn, args, kwargs)
    if getattr(fn, "_ember_disabled", False):
        raise Unsupported("call to an ember.disable'd function")
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    raise Unsupported(f"call to C function {mod + '.' if mod else ''}{name}")


# -- builtins -------------------------------------------------------------------------------------
def _len(tx, x):
    if isinstance(x, V.TensorVT):
        if x.example.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        if T.sym_sizes(x, "len()") is not None:
            return T.size_read(tx, x, "size", [V.ConstVT(0)])
        return V.ConstVT(x.example.shape[0])
    if isinstance(x, V.NdarrayVT):
        from .numpy_values import length

        return length(tx, x)
    if isinstance(x, (V.ListVT, V.DictVT, V.SetVT)):
        return V.ConstVT(len(x.items))
    if isinstance(x, V.ConstVT):
        return V.ConstVT(len(x.value))
    if isinstance(x, V.ModuleVT) and hasattr(type(x.module), "__len__"):
        return V.ConstVT(module_len(x))
    if isinstance(x, V.DataclassVT):
        return V.ConstVT(sum(1 for v in x.attrs.values() if not _none(v)))
    if isinstance(x, (V.ObjectVT, V.NewObjectVT)):
        return call(tx, getattr_vt(tx, x, "__len__"), [], {})
    raise Unsupported(f"len() of a {type(x).__name__}")


def _none(v):
    return isinstance(v, V.ConstVT) and v.value is None


def _isinstance(tx, obj, classes):
    cls = const_classes(classes)
    return V.ConstVT(_issubclass_of(obj.python_type(), cls, obj))


def _issubclass_of(t, cls, obj=None):
    if isinstance(obj, V.TensorVT) and cls is torch.nn.Parameter:
        return issubclass(t, torch.nn.Parameter)
    return issubclass(t, cls)


def const_classes(vt):
    if isinstance(vt, V.ClassVT):
        return vt.cls
    if isinstance(vt, V.ListVT):
        return tuple(const_classes(i) for i in vt.items)
    ok, value = try_const(vt)
    if ok:
        return value
    raise Unsupported("isinstance() with a non-constant class")


def _issubclass(tx, a, b):
    return V.ConstVT(issubclass(const_classes(a), const_classes(b)))


def _getattr(tx, obj, name, *default):
    try:
        return getattr_vt(tx, obj, const_of(name, "attribute name"))
    except AttrMissing:
        if default:
            return default[0]
        raise


def _hasattr(tx, obj, name):
    try:
        getattr_vt(tx, obj, const_of(name, "attribute name"))
        return V.ConstVT(True)
    except AttrMissing:
        return V.ConstVT(False)


def _setattr(tx, obj, name, value):
    setattr_vt(tx, obj, const_of(name, "attribute name"), value)
    return V.ConstVT(None)


def _delattr(tx, obj, name):
    from .attrs import delattr_impl

    delattr_impl(tx, obj, const_of(name, "attribute name"))
    return V.ConstVT(None)


def _new_object_only(fn):
    """object's own attribute slots (reached by `super().__setattr__(...)` or
    `object.__setattr__(self, ...)` in a class's hooks), for objects made while tracing (and
    reads of pre-existing ones)."""

    arity = {object.__init__: 0, object.__getattribute__: 1, object.__delattr__: 1,
             object.__setattr__: 2}[fn]  # fmt: skip

    def handler(tx, obj, *args, **kwargs):
        from . import attrs

        if kwargs or (len(args) != arity and fn is not object.__init__):
            raise Unsupported(f"object.{fn.__name__} with {len(args)} arguments")

        if fn is object.__getattribute__ and isinstance(obj, V.ObjectVT) and (
            obj.source is not None
        ):
            return attrs.object_generic_getattr(tx, obj, const_of(args[0], "attribute name"))
        if not attrs.follows_object_protocol(obj):
            raise Unsupported(f"object.{fn.__name__} of a {type(obj).__name__}")
        if fn is object.__init__:
            if args:
                raise Unsupported("object.__init__() with arguments")
            return V.ConstVT(None)
        name = const_of(args[0], "attribute name")
        if fn is object.__getattribute__:
            return attrs.generic_getattr(tx, obj, name)
        if fn is object.__setattr__:
            attrs.generic_setattr(tx, obj, name, args[1])
        else:
            attrs.generic_delattr(tx, obj, name)
        return V.ConstVT(None)

    return handler


def _object_new(tx, cls_vt, *args, **kwargs):
    """`object.__new__(cls)` (copyreg, `cls.__new__(cls)` in factories): a bare new object."""
    cls = const_classes(cls_vt)
    if not isinstance(cls, type) or not plain_instances(cls):
        raise Unsupported(f"object.__new__ of {getattr(cls, '__qualname__', cls)}")
    if (args or kwargs) and (cls.__init__ is object.__init__ or cls.__new__ is not object.__new__):
        raise Unsupported("object.__new__() with arguments")
    return V.NewObjectVT(cls)


def plain_instances(cls: type) -> bool:
    """Instances are a bare object plus a __dict__: no __slots__, no C base with its own layout,
    made by object.__new__ (what NewObjectVT models, and how codegen rebuilds it)."""
    if cls.__new__ is not object.__new__ or cls.__dictoffset__ == 0:
        return False
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException, type)):
        return False
    return all(k is object or ("__slots__" not in k.__dict__ and python_class(k))
               for k in cls.__mro__)  # fmt: skip


def _reduce_minmax(fn):
    def handler(tx, *args, **kwargs):
        items = unpack(tx, args[0]) if len(args) == 1 else list(args)
        if kwargs:
            raise Unsupported(f"{fn.__name__}() with keyword arguments")
        if all(isinstance(i, V.ConstVT) for i in items):
            return wrap_const(fn(i.value for i in items))
        if items and all(is_int_vt(i) for i in items):  # sizes: the winner at the hints, guarded
            env = next(i.env for i in items if isinstance(i, SymIntVT))
            best = items[0]
            for i in items[1:]:
                better = as_sym(i) > as_sym(best) if fn is max else as_sym(i) < as_sym(best)
                best = i if env.decide(better) else best
            return best
        if any(isinstance(i, V.TensorVT) for i in items):
            if all(isinstance(i, V.TensorVT) and i.example.dim() == 0 for i in items) is False:
                raise Unsupported(f"{fn.__name__}() over tensors compares data")
        raise Unsupported(f"{fn.__name__}() over non-constants")

    return handler


def _sum(tx, iterable, start=None):
    items = unpack(tx, iterable)
    acc = start if start is not None else V.ConstVT(0)
    for item in items:
        acc = binop(tx, operator.add, acc, item)
    return acc


def _any_all(fn):
    def handler(tx, iterable):
        values = [truth(tx, i) for i in unpack(tx, iterable)]
        return V.ConstVT(fn(values))

    return handler


def _abs(tx, x):
    if isinstance(x, V.TensorVT):
        return tx.output.call("call_function", torch.abs, (x,), {})
    if isinstance(x, V.NdarrayVT):
        return unop(tx, operator.abs, x)
    return wrap_const(abs(const_of(x)))


def _iter(tx, x):
    return get_iter(tx, x)


def _next(tx, it, *default):
    it = get_iter(tx, it)
    if it.pos < len(it.items):
        it.pos += 1
        return it.items[it.pos - 1]
    if default:
        return default[0]
    raise PyExc(V.ExcVT(StopIteration, []))


def _sorted(tx, iterable, key=None, reverse=None):
    if key is not None:
        raise Unsupported("sorted() with a key")
    values = [const_of(i) for i in unpack(tx, iterable)]
    rev = bool(const_of(reverse)) if reverse is not None else False
    return V.ListVT([wrap_const(v) for v in sorted(values, reverse=rev)])


def _callable(tx, x):
    if isinstance(x, (V.FunctionVT, V.NestedFunctionVT, V.BoundMethodVT, V.BuiltinVT, V.ClassVT,
                      V.ModuleVT, V.MethodVT)):  # fmt: skip
        return V.ConstVT(True)
    if isinstance(x, (V.TensorVT, V.ListVT, V.DictVT, V.ConstVT, V.SetVT)):
        return V.ConstVT(False)
    return V.ConstVT(callable(real_value(x)))


def _const_fn(fn):
    def handler(tx, *args, **kwargs):
        if any(isinstance(a, V.TensorVT) for a in args):
            raise Unsupported(f"{fn.__name__}() of a tensor reads its data")
        return wrap_const(fn(*[const_of(a) for a in args],
                             **{k: const_of(v) for k, v in kwargs.items()}))  # fmt: skip

    return handler


def _print(tx, *args, **kwargs):
    raise Unsupported("print() (output outside the graph)")


def _id(tx, x):
    from .calls import identity_of

    return V.IdVT(x, identity_of(x))


_HANDLERS = {
    builtins.len: _len, builtins.isinstance: _isinstance, builtins.issubclass: _issubclass,
    builtins.getattr: _getattr, builtins.hasattr: _hasattr, builtins.setattr: _setattr,
    builtins.min: _reduce_minmax(min), builtins.max: _reduce_minmax(max), builtins.sum: _sum,
    builtins.any: _any_all(any), builtins.all: _any_all(all), builtins.abs: _abs,
    builtins.iter: _iter, builtins.next: _next, builtins.sorted: _sorted,
    builtins.callable: _callable, builtins.print: _print, builtins.id: _id,
    builtins.divmod: _const_fn(divmod), builtins.pow: _const_fn(pow),
    builtins.round: _const_fn(round), builtins.repr: _const_fn(repr),
    builtins.format: _const_fn(format), builtins.chr: _const_fn(chr), builtins.ord: _const_fn(ord),
    builtins.hash: _const_fn(hash), builtins.delattr: _delattr,
    builtins.vars: lambda tx, obj: getattr_vt(tx, obj, "__dict__"),
    object.__getattribute__: _new_object_only(object.__getattribute__),
    object.__setattr__: _new_object_only(object.__setattr__),
    object.__delattr__: _new_object_only(object.__delattr__),
    object.__init__: _new_object_only(object.__init__), object.__new__: _object_new,
}  # fmt: skip


# -- construction ---------------------------------------------------------------------------------
def _range(tx, *args):
    return V.ConstVT(range(*[const_of(a, "range bound") for a in args]))


def _enumerate(tx, iterable, start=None):
    s = const_of(start) if start is not None else 0
    return V.IteratorVT([V.TupleVT([V.ConstVT(i + s), v]) for i, v in
                         enumerate(unpack(tx, iterable))])  # fmt: skip


def _zip(tx, *iterables, strict=None):
    lists = [unpack(tx, i) for i in iterables]
    return V.IteratorVT([V.TupleVT(list(t)) for t in zip(*lists)])


def _reversed(tx, seq):
    return V.IteratorVT(list(reversed(unpack(tx, seq))))


def _map(tx, fn, *iterables):
    lists = [unpack(tx, i) for i in iterables]
    return V.IteratorVT([call(tx, fn, list(t), {}) for t in zip(*lists)])


def _filter(tx, fn, iterable):
    items = unpack(tx, iterable)
    keep = [i for i in items if truth(tx, call(tx, fn, [i], {}) if not _none(fn) else i)]
    return V.IteratorVT(keep)


def _list(tx, iterable=None):
    return V.ListVT(unpack(tx, iterable) if iterable is not None else [])


def _tuple(tx, iterable=None):
    return V.TupleVT(unpack(tx, iterable) if iterable is not None else [])


def _dict(tx, *args, **kwargs):
    from .calls import dict_items

    items = {}
    if args:
        if isinstance(args[0], (V.DictVT, V.DataclassVT)):
            items.update(dict_items(tx, args[0]))
        else:
            for pair in unpack(tx, args[0]):
                k, v = unpack(tx, pair)
                items[const_key(k)] = v
    items.update(kwargs)
    return V.DictVT(items)


def _set(tx, iterable=None):
    return V.SetVT([const_key(i) for i in unpack(tx, iterable)] if iterable is not None else [])


def _scalar(cls):
    def handler(tx, *args):
        if args and isinstance(args[0], V.TensorVT):
            raise Unsupported(f"{cls.__name__}() of a tensor reads its data")
        if cls is int and len(args) == 1 and isinstance(args[0], SymIntVT):
            return args[0]
        if cls is str and len(args) == 1 and isinstance(args[0], (V.ClassVT, V.FunctionVT,
                                                                  V.PyModuleVT)):  # fmt: skip
            return V.ConstVT(str(real_value(args[0])))
        return wrap_const(cls(*[const_of(a) for a in args]))

    return handler


def _type(tx, obj):
    return V.ClassVT(obj.python_type())


def _super(tx, *args):
    if args:
        return V.SuperVT(const_classes(args[0]), args[1])
    # Zero-argument super(): the __class__ cell and the first argument of the calling frame.
    cell = tx.cells.get("__class__")
    if cell is None or not tx.code.co_varnames:
        raise Unsupported("super() outside a method")
    cls_vt = cell.value if isinstance(cell, V.CellVT) else cell.load(tx)
    return V.SuperVT(const_classes(cls_vt), tx.locals[tx.code.co_varnames[0]])


_CONSTRUCTORS = {
    range: _range, enumerate: _enumerate, zip: _zip, reversed: _reversed, map: _map,
    filter: _filter, list: _list, tuple: _tuple, dict: _dict, set: _set, frozenset: _set,
    int: _scalar(int), float: _scalar(float), bool: _scalar(bool), str: _scalar(str),
    complex: _scalar(complex), type: _type, super: _super, slice: _scalar(slice),
    torch.Size: lambda tx, *a: _size(tx, *a),
    object: lambda tx: V.NewObjectVT(object),
}  # fmt: skip


def _size(tx, items=None):
    if items is not None and any(isinstance(i, SymIntVT) for i in unpack(tx, items)):
        return SizeVT(unpack(tx, items))
    return V.ConstVT(torch.Size(const_of(items) if items is not None else ()))


def construct(tx, cls_vt: V.ClassVT, args, kwargs):
    """cls(*args, **kwargs) for a class known at trace time."""
    cls = cls_vt.cls
    if cls in _CONSTRUCTORS:
        return _CONSTRUCTORS[cls](tx, *args, **kwargs)
    if cls in (torch.finfo, torch.iinfo):
        return V.ConstVT(cls(*[const_of(a) for a in args]))
    if cls in (torch.no_grad, torch.enable_grad):
        return V.GradModeVT(cls is torch.enable_grad)
    if cls is torch.set_grad_enabled:
        ctx = V.GradModeVT(bool(const_of(args[0], "grad mode")))
        enter_grad_mode(tx, ctx)  # set_grad_enabled(b) takes effect when called
        return ctx
    if is_namedtuple_type(cls):
        from .frame import bind_args

        bound = bind_args(cls, args, kwargs)
        items = [b if isinstance(b, V.VT) else wrap_const(b) for b in bound.values()]
        return V.NamedTupleVT(cls, items, cls._fields)
    if T.is_graph_fn(cls) or (cls.__module__ or "").startswith("torch.return_types"):
        raise Unsupported(f"constructing {cls.__name__}")
    if issubclass(cls, torch.nn.Module) or issubclass(cls, torch.Tensor):
        raise Unsupported(f"constructing a {cls.__name__} inside compiled code")
    if issubclass(cls, BaseException):
        return V.ExcVT(cls, list(args))
    if dataclasses.is_dataclass(cls):
        return construct_dataclass(tx, cls, args, kwargs)
    init = cls.__init__
    if cls.__new__ is object.__new__ and init is object.__init__ and not args and not kwargs:
        return V.NewObjectVT(cls)
    if cls.__new__ is object.__new__ and isinstance(init, types.FunctionType):
        obj = V.NewObjectVT(cls)
        inline_call(tx, V.FunctionVT(init, None), [obj, *args], kwargs)
        return obj
    raise Unsupported(f"constructing {cls.__module__}.{cls.__qualname__}")


def construct_dataclass(tx, cls, args, kwargs):
    fields = [f for f in dataclasses.fields(cls) if f.init]
    values = {}
    for f, a in zip(fields, args):
        values[f.name] = a
    values.update(kwargs)
    for f in fields:
        if f.name in values:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = wrap_const(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = wrap_const(f.default_factory())
        else:
            raise Unsupported(f"{cls.__name__}() missing field {f.name}")
    obj = V.DataclassVT(cls, values)
    post = getattr(cls, "__post_init__", None)
    if post is not None and not issubclass(cls, dict):
        inline_call(tx, V.FunctionVT(post, None), [obj], {})
    return obj


# -- grad mode ------------------------------------------------------------------------------------
def set_grad_mode(tx, enabled: bool):
    """Record a grad-mode switch in the graph and apply it to the tracing itself."""
    tx.output.call("call_function", torch._C._set_grad_enabled, (V.ConstVT(enabled),), {})


def enter_grad_mode(tx, ctx: V.GradModeVT):
    if ctx.prev is None:
        ctx.prev = torch.is_grad_enabled()
        set_grad_mode(tx, ctx.enabled)


def exit_grad_mode(tx, ctx: V.GradModeVT):
    if ctx.prev is not None:
        set_grad_mode(tx, ctx.prev)
        ctx.prev = None
    return V.ConstVT(None)
