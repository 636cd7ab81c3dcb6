"""Attribute reads and writes on symbolic values (modules, objects, classes, tensors...)."""

from __future__ import annotations

import logging
import types

import torch

from . import tensor_ops as T
from . import variables as V
from .calls import AttrMissing, module_entry, py_method, wrap_const
from .exc import GenericFallback, PyExc, Unsupported
from .frame import inline_call
from .source import AttrSource, ConstantSource, ItemSource


# Logger methods whose calls are replayed after the graph instead of breaking it.
LOGGER_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception",
                  "warning_once", "info_once", "warning_advice"}  # fmt: skip


def _mro_lookup(cls, name):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return True, klass.__dict__[name]
    return False, None


def _class_attr(tx, self_vt, cls, name, attr, cls_vt=None):
    """A class attribute read through an instance: bind functions, run properties."""
    if isinstance(attr, types.FunctionType):
        return V.BoundMethodVT(V.FunctionVT(attr, ConstantSource(attr, attr.__qualname__)), self_vt)
    if isinstance(attr, property):
        if attr.fget is None:
            raise Unsupported(f"property {name} has no getter")
        return inline_call(tx, V.FunctionVT(attr.fget, None), [self_vt], {})
    if isinstance(attr, staticmethod):
        return tx.builder.wrap(attr.__func__, ConstantSource(attr.__func__, name))
    if isinstance(attr, classmethod):
        fn = V.FunctionVT(attr.__func__, ConstantSource(attr.__func__, name))
        return V.BoundMethodVT(fn, cls_vt or V.ClassVT(cls))
    if isinstance(attr, types.BuiltinFunctionType) or callable(attr) and not isinstance(attr, type):
        if getattr(self_vt, "generic", False):  # bound to this instance, read as a constant
            raise GenericFallback(f"{cls.__name__}.{name}, a {type(attr).__name__}")
        real = getattr(self_vt_real(self_vt), name)
        return tx.builder.wrap(real, None) if not _is_const(real) else V.ConstVT(real)
    return None


def self_vt_real(vt):
    for a in ("module", "obj"):
        if hasattr(vt, a):
            return getattr(vt, a)
    raise Unsupported(f"method of a {type(vt).__name__}")


def _is_const(v):
    from .builder import is_const_value

    return is_const_value(v)


def getattr_impl(tx, obj, name: str) -> V.VT:
    pending = tx.output.pending_attrs.get((id(_identity(obj)), name))
    if pending is not None:
        return pending
    if isinstance(obj, V.TensorVT):
        return T.tensor_getattr(tx, obj, name)
    if isinstance(obj, V.NdarrayVT):
        from .numpy_values import getattr_ndarray

        return getattr_ndarray(tx, obj, name)
    if isinstance(obj, V.ModuleVT):
        return module_getattr(tx, obj, name)
    if isinstance(obj, V.PyModuleVT):
        if not hasattr(obj.module, name):
            raise AttrMissing(f"module {obj.module.__name__} has no attribute {name}")
        src = AttrSource(obj.source, name) if obj.source is not None else None
        return tx.builder.wrap(getattr(obj.module, name), src)
    if isinstance(obj, V.ConstVT):
        if not hasattr(obj.value, name):
            raise AttrMissing(f"{type(obj.value).__name__} has no attribute {name}")
        value = getattr(obj.value, name)
        if callable(value) and not isinstance(value, type):
            return V.MethodVT(obj, name)
        return wrap_const(value)
    if isinstance(obj, (V.ListVT, V.DictVT, V.SetVT)):
        if isinstance(obj, V.NamedTupleVT) and name in obj.fields:
            return obj.items[obj.fields.index(name)]
        cls = obj.python_type()
        if cls not in (list, tuple, dict, set):  # a subclass: its Python methods run as written
            found, attr = _mro_lookup(cls, name)
            if found and isinstance(attr, (types.FunctionType, property, staticmethod,
                                           classmethod)):  # fmt: skip
                return _class_attr(tx, obj, cls, name, attr)
        if not hasattr(obj.python_type(), name):
            raise AttrMissing(f"{obj.python_type().__name__} has no attribute {name}")
        return V.MethodVT(obj, name)
    if isinstance(obj, V.NewObjectVT):
        return new_object_getattr(tx, obj, name)
    if isinstance(obj, V.ObjectVT):
        return object_getattr(tx, obj, name)
    if isinstance(obj, V.ClassVT):
        return class_getattr(tx, obj, name)
    if isinstance(obj, V.SuperVT):
        return super_getattr(tx, obj, name)
    if isinstance(obj, (V.FunctionVT, V.BuiltinVT)):
        fn = obj.fn
        if not hasattr(fn, name):
            raise AttrMissing(f"function has no attribute {name}")
        src = AttrSource(obj.source, name) if obj.source is not None else None
        return tx.builder.wrap(getattr(fn, name), src)
    if isinstance(obj, V.NestedFunctionVT) and name in ("__name__", "__qualname__"):
        return V.ConstVT(obj.name)
    if isinstance(obj, V.BoundMethodVT) and name in ("__self__", "__func__"):
        return obj.self_vt if name == "__self__" else obj.fn
    if isinstance(obj, V.ExcVT) and name == "args":
        return V.TupleVT(obj.args)
    if isinstance(obj, V.GradModeVT) and name in ("__enter__", "__exit__"):
        return V.MethodVT(obj, name)
    raise Unsupported(f"attribute {name!r} of a {type(obj).__name__}")


def _identity(obj):
    for a in ("module", "obj"):
        if hasattr(obj, a) and not isinstance(obj, V.NewObjectVT):
            return getattr(obj, a)
    return obj


def module_getattr(tx, vt: V.ModuleVT, name: str) -> V.VT:
    m = vt.module
    d = m.__dict__
    for kind in ("_parameters", "_buffers", "_modules"):
        table = d.get(kind)
        if table is not None and name in table:
            return module_entry(tx, vt, kind, name)
    if name in d:
        return tx.builder.wrap(d[name], AttrSource(vt.source, name))
    if name == "__class__" and vt.generic:  # the guarded type
        return V.ClassVT(type(m))
    found, attr = _mro_lookup(type(m), name)
    if found:
        out = _class_attr(tx, vt, type(m), name, attr)
        if out is not None:
            return out
        if _is_const(attr):
            return _class_const(tx, vt, name, attr)
        if vt.generic and hasattr(type(attr), "__get__"):
            # a descriptor's value (__dict__, cached_property) is this instance's; another
            # class attribute is the class's (the type is guarded, shadowing by __dict__ keys)
            raise GenericFallback(f"{type(m).__name__}.{name}, a {type(attr).__name__}")
        return tx.builder.wrap(getattr(m, name), None)
    raise AttrMissing(f"{type(m).__name__} has no attribute {name!r}")


def object_getattr(tx, vt: V.ObjectVT, name: str) -> V.VT:
    obj = vt.obj
    cls = type(obj)
    if isinstance(obj, logging.Logger) and name in LOGGER_METHODS:
        return V.MethodVT(vt, name)  # the call is replayed after the graph
    if _dict_changed_while_tracing(tx, vt):  # the real object is stale: read the traced dict
        return _protocol_getattr(tx, vt, name, object_generic_getattr)
    if _custom_getattribute(cls):
        # Run the class's own __getattribute__ now; the guard VM repeats the same read.
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise AttrMissing(f"{cls.__name__} has no attribute {name!r}") from None
        if isinstance(value, types.MethodType) and value.__self__ is obj:
            return V.BoundMethodVT(tx.builder.wrap(value.__func__, None), vt)
        return tx.builder.wrap(value, AttrSource(vt.source, name))
    found, attr = _mro_lookup(cls, name)
    if found and isinstance(attr, property):
        return _class_attr(tx, vt, cls, name, attr)
    inst = getattr(obj, "__dict__", None)
    if isinstance(inst, dict) and name in inst:
        return tx.builder.wrap(inst[name], AttrSource(vt.source, name))
    if found and isinstance(inst, dict) and vt.source is not None and tx.output.generic_modules:
        # the class's value holds while no instance sets its own: objects are guarded by type,
        # and one generic entry serves every layer's (a per-layer config, say)
        tx.output.guards.add("DICT_KEYS", AttrSource(vt.source, "__dict__"), tuple(inst))
    if found:
        if isinstance(attr, (types.FunctionType, staticmethod, classmethod)):
            return _class_attr(tx, vt, cls, name, attr)
        if _is_const(attr):
            return _class_const(tx, vt, name, attr)
    if not hasattr(obj, name):
        raise AttrMissing(f"{cls.__name__} has no attribute {name!r}")
    value = getattr(obj, name)
    if isinstance(value, types.MethodType) and value.__self__ is obj:
        return V.BoundMethodVT(tx.builder.wrap(value.__func__, None), vt)
    return tx.builder.wrap(value, AttrSource(vt.source, name))


def _class_const(tx, vt, name: str, value) -> V.VT:
    """A constant read from the class: guarded as `obj.name` reads it, so that an instance
    setting its own value, or the class changing its, retraces (a trace that read the class's
    value kept returning it)."""
    if vt.source is None:
        return V.ConstVT(value)
    return tx.builder.wrap(value, AttrSource(vt.source, name))


def _custom_getattribute(cls) -> bool:
    for klass in cls.__mro__:
        if "__getattribute__" in klass.__dict__:
            return isinstance(klass.__dict__["__getattribute__"], types.FunctionType)
    return False


def follows_object_protocol(vt) -> bool:
    """A new object whose attributes behave as Python's own protocol says (its class's
    __getattribute__/__setattr__/__delattr__, descriptors, then its __dict__). HuggingFace's
    ModelOutput (a dict-subclass dataclass) keeps fields and items in step itself: DataclassVT."""
    return isinstance(vt, V.NewObjectVT) and not (
        isinstance(vt, V.DataclassVT) and issubclass(vt.cls, dict)
    )


def instance_dict(vt: V.NewObjectVT) -> V.DictVT:
    """`obj.__dict__` of a new object: a dict VT sharing `vt.attrs`, so writes through either
    are seen by both (copy.py's `y.__dict__.update(state)`, configs' `self.__dict__[k] = v`)."""
    d = getattr(vt, "dict_vt", None)
    if d is None:
        d = vt.dict_vt = V.DictVT({})
        d.items = vt.attrs
    return d


def _is_attribute_error(e) -> bool:
    return isinstance(e, PyExc) and isinstance(e.exc_vt, V.ExcVT) and issubclass(
        e.exc_vt.cls, AttributeError
    )


def new_object_getattr(tx, vt: V.NewObjectVT, name: str) -> V.VT:
    if not follows_object_protocol(vt):
        return _model_output_getattr(tx, vt, name)
    return _protocol_getattr(tx, vt, name, generic_getattr)


def _protocol_getattr(tx, vt, name, generic):
    """`vt.name` as Python does it: the class's own __getattribute__ (inlined) or the generic
    lookup, then __getattr__ if that raised AttributeError."""
    cls = vt.python_type()
    hook = py_method(cls, "__getattribute__")
    try:
        if hook is not None:
            return _attribute_error_as_missing(tx, hook, vt, name)
        return generic(tx, vt, name)
    except PyExc as e:
        fallback = py_method(cls, "__getattr__")
        if fallback is None or not _is_attribute_error(e):
            raise
        return _attribute_error_as_missing(tx, fallback, vt, name)


def _dict_changed_while_tracing(tx, vt: V.ObjectVT) -> bool:
    """Whether traced code wrote into this pre-existing object's `__dict__` (`obj.__dict__[k] =
    v`, replayed after the graph): reads of the real object would miss the writes."""
    if vt.source is None or not type(vt.obj).__dictoffset__:
        return False
    d = tx.builder.cache.get(AttrSource(vt.source, "__dict__"))
    return isinstance(d, V.DictVT) and id(d) in tx.output.mutated


def _attribute_error_as_missing(tx, hook, vt, name):
    """Inline a class's __getattribute__ or __getattr__; an AttributeError it raises is an
    absent attribute (hasattr answers False, getattr returns its default)."""
    try:
        return inline_call(tx, V.FunctionVT(hook, None), [vt, V.ConstVT(name)], {})
    except AttrMissing:
        raise
    except PyExc as e:
        if _is_attribute_error(e):
            raise AttrMissing(str(e), e.exc_vt) from None
        raise


_SIMPLE_CLASS_ATTRS = (types.FunctionType, property, staticmethod, classmethod)


def generic_getattr(tx, vt: V.NewObjectVT, name: str) -> V.VT:
    """`object.__getattribute__(vt, name)`: data descriptors of the class, the instance
    dict, then other class attributes."""
    if name == "__dict__" and vt.cls.__dictoffset__:
        return instance_dict(vt)
    if name == "__class__":
        return V.ClassVT(vt.cls)
    found, attr = _mro_lookup(vt.cls, name)
    if found and isinstance(attr, property):
        return _class_attr(tx, vt, vt.cls, name, attr)
    if found and _is_data_descriptor(attr) and not is_slot(attr):
        raise Unsupported(f"descriptor {vt.cls.__name__}.{name} ({type(attr).__name__})")
    if name in vt.attrs:
        return vt.attrs[name]
    if not found or is_slot(attr):
        raise AttrMissing(f"{vt.cls.__name__} object has no attribute {name!r}")
    out = _class_level(tx, vt, vt.cls, name, attr)
    if out is not None:
        return out
    if isinstance(attr, types.WrapperDescriptorType) and attr.__objclass__ is object:
        return V.BoundMethodVT(V.BuiltinVT(attr), vt)  # object.__setattr__ & co. (pybuiltins)
    raise Unsupported(f"class attribute {vt.cls.__name__}.{name} ({type(attr).__name__})")


def _class_level(tx, vt, cls, name: str, attr):
    """An attribute found on the class (no instance value shadows it), read through the
    instance `vt`: a function, property or static/class method binds; a constant, a class or a
    plain value is read from its owner. None for anything else (other descriptors)."""
    if isinstance(attr, _SIMPLE_CLASS_ATTRS):
        return _class_attr(tx, vt, cls, name, attr)
    if _is_const(attr):
        return V.ConstVT(attr)
    if isinstance(attr, type) or not hasattr(type(attr), "__get__"):
        owner = next(k for k in cls.__mro__ if name in k.__dict__)
        return tx.builder.wrap(attr, AttrSource(ConstantSource(owner, owner.__qualname__), name))
    return None


def object_generic_getattr(tx, vt: V.ObjectVT, name: str) -> V.VT:
    """`object.__getattribute__(obj, name)` of a pre-existing object (a class's own
    __getattribute__ calling its base): read past the class's hook, so instance attributes come
    from `obj.__dict__[name]`, which is also what the guards read."""
    pending = tx.output.pending_attrs.get((id(vt.obj), name))
    if pending is not None:
        return pending
    obj, cls = vt.obj, type(vt.obj)
    if name == "__class__":
        return V.ClassVT(cls)
    inst = object.__getattribute__(obj, "__dict__") if cls.__dictoffset__ else {}
    if name == "__dict__" and cls.__dictoffset__:
        return tx.builder.wrap(inst, AttrSource(vt.source, "__dict__"))
    found, attr = _mro_lookup(cls, name)
    if found and isinstance(attr, property):
        return _class_attr(tx, vt, cls, name, attr)
    if found and _is_data_descriptor(attr):
        raise Unsupported(f"descriptor {cls.__name__}.{name} ({type(attr).__name__})")
    traced = tx.builder.cache.get(AttrSource(vt.source, "__dict__"))
    if isinstance(traced, V.DictVT):  # obj.__dict__ was read (and maybe changed) while tracing
        if name in traced.items:
            return traced.items[name]
    elif name in inst:
        return tx.builder.wrap(inst[name], ItemSource(AttrSource(vt.source, "__dict__"), name))
    if not found:
        raise AttrMissing(f"{cls.__name__} object has no attribute {name!r}")
    out = _class_level(tx, vt, cls, name, attr)  # (a property was read above)
    if out is not None:
        return out
    raise Unsupported(f"class attribute {cls.__name__}.{name} ({type(attr).__name__})")


def is_slot(attr) -> bool:
    """A `__slots__` entry of a Python class: instance storage, kept in NewObjectVT.attrs."""
    return isinstance(attr, types.MemberDescriptorType) and python_class(attr.__objclass__)


def python_class(cls: type) -> bool:
    """Made by a class statement (a heap type), not written in C."""
    return bool(cls.__flags__ & _HEAPTYPE)


_HEAPTYPE = 1 << 9


def _is_data_descriptor(attr) -> bool:
    t = type(attr)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


def _model_output_getattr(tx, vt: V.NewObjectVT, name: str) -> V.VT:
    if name in vt.attrs:
        return vt.attrs[name]
    found, attr = _mro_lookup(vt.cls, name)
    if found:
        if isinstance(attr, (types.FunctionType, property, staticmethod, classmethod)):
            return _class_attr(tx, vt, vt.cls, name, attr)
        if _is_const(attr):
            return V.ConstVT(attr)
        if callable(attr) and isinstance(vt, V.DataclassVT) and issubclass(vt.cls, dict):
            return V.MethodVT(vt, name)
    if name == "__class__":
        return V.ClassVT(vt.cls)
    raise AttrMissing(f"{vt.cls.__name__} object has no attribute {name!r}")


def class_getattr(tx, vt: V.ClassVT, name: str) -> V.VT:
    cls = vt.cls
    found, attr = _mro_lookup(cls, name)
    if not found and not hasattr(cls, name):
        raise AttrMissing(f"class {cls.__name__} has no attribute {name!r}")
    if found and isinstance(attr, classmethod):
        return V.BoundMethodVT(V.FunctionVT(attr.__func__, ConstantSource(attr.__func__)), vt)
    if found and isinstance(attr, staticmethod):
        attr = attr.__func__
    value = getattr(cls, name) if not found or not isinstance(attr, types.FunctionType) else attr
    src = AttrSource(vt.source, name) if vt.source is not None else None
    if src is None and not _is_const(value):
        src = ConstantSource(value, name)
    return tx.builder.wrap(value, src)


_OBJECT_SLOTS = ("__getattribute__", "__setattr__", "__delattr__", "__init__")


def super_getattr(tx, vt: V.SuperVT, name: str) -> V.VT:
    obj = vt.obj
    cls = obj.python_type()
    if isinstance(obj, (V.ListVT, V.DictVT, V.SetVT)):
        base = next(b for b in cls.__mro__ if b in (list, tuple, dict, set))
        if hasattr(base, name):  # super() of a container subclass: the built-in method
            return V.MethodVT(obj, name)
    mro = cls.__mro__
    start = mro.index(vt.cls) + 1 if vt.cls in mro else len(mro)
    for klass in mro[start:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if klass is object and name in _OBJECT_SLOTS and (
                follows_object_protocol(obj)
                or isinstance(obj, V.ObjectVT) and obj.source is not None
            ):
                return V.BoundMethodVT(V.BuiltinVT(attr), obj)  # handled in pybuiltins
            out = _class_attr(tx, obj, klass, name, attr)
            if out is not None:
                return out
            if _is_const(attr):
                return V.ConstVT(attr)
            break
    raise Unsupported(f"super().{name}")


def setattr_impl(tx, obj, name: str, value) -> None:
    if follows_object_protocol(obj):
        hook = py_method(obj.cls, "__setattr__")
        if hook is not None:
            inline_call(tx, V.FunctionVT(hook, None), [obj, V.ConstVT(name), value], {})
        else:
            generic_setattr(tx, obj, name, value)
        return
    if isinstance(obj, V.NewObjectVT):
        obj.attrs[name] = value
        return
    if isinstance(obj, (V.ModuleVT, V.ObjectVT)) and obj.source is not None:
        cls = obj.python_type()
        found, attr = _mro_lookup(cls, name)
        if found and isinstance(attr, property):
            if attr.fset is None:
                raise Unsupported(f"property {name} has no setter")
            inline_call(tx, V.FunctionVT(attr.fset, None), [obj, value], {})
            return
        if isinstance(obj, V.ModuleVT) and isinstance(value, V.TensorVT):
            if isinstance(obj.module.__dict__.get("_parameters", {}).get(name), torch.nn.Parameter):
                raise Unsupported("assigning a tensor to a module parameter")
        if isinstance(obj, V.ObjectVT) and "__setattr__" in _custom_setattr(cls):
            raise Unsupported(f"{cls.__name__} has a custom __setattr__")
        tx.output.record_side_effect("setattr", obj, name, value)
        tx.output.pending_attrs[(id(_identity(obj)), name)] = value
        return
    if isinstance(obj, V.TensorVT):
        raise Unsupported(f"setting tensor.{name}")
    raise Unsupported(f"setting attribute {name!r} on a {type(obj).__name__}")


def _custom_setattr(cls):
    for klass in cls.__mro__:
        if "__setattr__" in klass.__dict__ and klass is not object:
            return {"__setattr__"}
    return set()


def generic_setattr(tx, vt: V.NewObjectVT, name: str, value) -> None:
    """`object.__setattr__(vt, name, value)`: a property's setter, else the instance dict."""
    found, attr = _mro_lookup(vt.cls, name)
    if found and isinstance(attr, property):
        if attr.fset is None:
            raise PyExc(V.ExcVT(AttributeError, [V.ConstVT(f"can't set attribute {name!r}")]))
        inline_call(tx, V.FunctionVT(attr.fset, None), [vt, value], {})
        return
    if found and _is_data_descriptor(attr) and not is_slot(attr) or name in ("__dict__",
                                                                               "__class__"):
        raise Unsupported(f"setting {vt.cls.__name__}.{name} ({type(attr).__name__})")
    if not vt.cls.__dictoffset__ and not (found and is_slot(attr)):  # object(), slots only
        msg = f"{vt.cls.__name__!r} object has no attribute {name!r}"
        raise PyExc(V.ExcVT(AttributeError, [V.ConstVT(msg)]))
    vt.attrs[name] = value


def delattr_impl(tx, obj, name: str) -> None:
    """`del obj.name` / `delattr(obj, name)`: for objects made while tracing."""
    if not follows_object_protocol(obj):
        raise Unsupported(f"deleting attribute {name!r} of a {type(obj).__name__}")
    hook = py_method(obj.cls, "__delattr__")
    if hook is not None:
        inline_call(tx, V.FunctionVT(hook, None), [obj, V.ConstVT(name)], {})
    else:
        generic_delattr(tx, obj, name)


def generic_delattr(tx, vt: V.NewObjectVT, name: str) -> None:
    """`object.__delattr__(vt, name)`: a property's deleter, else the instance dict."""
    found, attr = _mro_lookup(vt.cls, name)
    if found and isinstance(attr, property):
        if attr.fdel is None:
            raise PyExc(V.ExcVT(AttributeError, [V.ConstVT(f"can't delete attribute {name!r}")]))
        inline_call(tx, V.FunctionVT(attr.fdel, None), [vt], {})
        return
    if found and _is_data_descriptor(attr) and not is_slot(attr):
        raise Unsupported(f"deleting {vt.cls.__name__}.{name} ({type(attr).__name__})")
    if name not in vt.attrs:
        raise AttrMissing(f"{vt.cls.__name__} object has no attribute {name!r}")
    del vt.attrs[name]
