"""`copy.copy` and `copy.deepcopy` of traced values, done on the symbolic values themselves.

Inlining copy.py would need the real identity of every value (its memo is keyed by `id()`), the
C `__reduce_ex__` protocol and dispatch tables keyed by type. What those produce is known for the
values the interpreter models: containers are copied item by item, and an instance of a plain
class whose class leaves copying to `object.__reduce_ex__` becomes `cls.__new__(cls)` with (a
copy of) its `__dict__` (no `__init__`, no `__setattr__`: copy.py's `_reconstruct`). That is a
NewObjectVT, which later code may change like any object made while tracing (transformers'
`config.get_text_config(decoder=True)` deep-copies the model's config and renames its fields).
Anything else (tensors, modules, classes with their own `__deepcopy__`, `__reduce__` or
`__setstate__`, slots) is unsupported: the graph breaks at the call and copy.py runs eagerly.
"""

from __future__ import annotations

import copy
import copyreg
import types

from . import variables as V
from .exc import Unsupported

# Values copy.py returns as they are (its `_deepcopy_atomic` and `_copy_immutable` types).
_ATOMIC = (type(None), int, float, bool, complex, bytes, str, types.CodeType, type, range,
           types.BuiltinFunctionType, type(Ellipsis), type(NotImplemented), types.FunctionType,
           property)  # fmt: skip


def copy_call(tx, fn, args, kwargs):
    """`copy.copy(x)` or `copy.deepcopy(x)` (no memo argument)."""
    if len(args) != 1 or kwargs:
        raise Unsupported(f"copy.{fn.__name__} with a memo or extra arguments")
    if fn is copy.deepcopy:
        return _deepcopy(tx, args[0], {})
    return _copy(tx, args[0])


def _copy(tx, vt):
    if _is_atomic(vt):
        return vt
    if isinstance(vt, V.ConstVT):
        return V.ConstVT(_real_copy(copy.copy, vt.value))
    if isinstance(vt, V.ListVT) and type(vt) is V.ListVT:
        return vt if vt.is_tuple else V.ListVT(list(vt.items))
    if isinstance(vt, V.DictVT) and vt.cls is dict:
        return V.DictVT(dict(vt.items))
    if isinstance(vt, V.SetVT):
        return V.SetVT(list(vt.items))
    cls, state = _instance_state(tx, vt)
    return V.NewObjectVT(cls, state)


def _deepcopy(tx, vt, memo: dict):
    if _is_atomic(vt):
        return vt
    if isinstance(vt, V.ConstVT):  # an immutable value: copied for real (equal, maybe not `is`)
        key = id(vt.value)
        if key not in memo:
            memo[key] = (vt.value, V.ConstVT(_real_copy(copy.deepcopy, vt.value)))
        return memo[key][1]
    from .calls import identity_of

    ident = identity_of(vt)
    if id(ident) in memo:
        return memo[id(ident)][1]
    if isinstance(vt, V.ListVT) and type(vt) is V.ListVT and vt.is_tuple:
        items = [_deepcopy(tx, i, memo) for i in vt.items]
        if id(ident) in memo:  # the tuple was reached again through its items
            return memo[id(ident)][1]
        return vt if all(a is b for a, b in zip(items, vt.items)) else V.TupleVT(items)
    if isinstance(vt, V.NamedTupleVT) and hasattr(vt.cls, "_make"):
        items = [_deepcopy(tx, i, memo) for i in vt.items]
        return V.NamedTupleVT(vt.cls, items, vt.fields)
    if isinstance(vt, V.ListVT) and type(vt) is V.ListVT:
        out = V.ListVT([])
        memo[id(ident)] = (ident, out)
        out.items = [_deepcopy(tx, i, memo) for i in vt.items]
        return out
    if isinstance(vt, V.DictVT) and vt.cls is dict:
        out = V.DictVT({})
        memo[id(ident)] = (ident, out)
        for k, v in list(vt.items.items()):
            out.items[_deepcopy_key(k)] = _deepcopy(tx, v, memo)
        return out
    if isinstance(vt, V.SetVT):
        return V.SetVT([_deepcopy_key(k) for k in vt.items])
    cls, state = _instance_state(tx, vt)
    out = V.NewObjectVT(cls)
    memo[id(ident)] = (ident, out)
    for k, v in state.items():
        out.attrs[k] = _deepcopy(tx, v, memo)
    return out


def _real_copy(fn, value):
    try:
        return fn(value)
    except Exception as e:
        raise Unsupported(f"copy.{fn.__name__} of a {type(value).__name__} raised {e!r}") from e


def _deepcopy_key(k):
    from .calls import ObjKey

    if isinstance(k, ObjKey):
        if isinstance(k.vt, (V.ClassVT, V.FunctionVT)):
            return k
        raise Unsupported("copy.deepcopy of a dict keyed by objects")
    if isinstance(k, _ATOMIC):
        return k
    return _real_copy(copy.deepcopy, k)


def _is_atomic(vt) -> bool:
    if isinstance(vt, V.ConstVT):
        return type(vt.value) in _ATOMIC or (
            type(vt.value) is tuple and all(type(v) in _ATOMIC for v in vt.value)
        )
    if isinstance(vt, V.BuiltinVT):
        return isinstance(vt.fn, types.BuiltinFunctionType)
    return isinstance(vt, (V.ClassVT, V.FunctionVT))


def _instance_state(tx, vt):
    """(class, {name: VT}) of an object that copy.py rebuilds as `cls.__new__(cls)` plus its
    `__dict__`; unsupported for everything else."""
    from .attrs import follows_object_protocol, instance_dict
    from .calls import _type_name, getattr_vt
    from .exc import AttrMissing
    from .source import AttrSource

    if not (isinstance(vt, V.ObjectVT) and vt.source is not None or follows_object_protocol(vt)):
        raise Unsupported(f"copying a {_type_name(vt)}")
    cls = vt.python_type()
    if not copies_by_dict(cls):
        raise Unsupported(f"copying a {cls.__qualname__} (its class customises copying)")
    try:  # copy.py asks the instance itself (its __getattribute__/__getattr__ answer)
        getattr_vt(tx, vt, "__deepcopy__")
        raise Unsupported(f"copying a {cls.__qualname__} with a __deepcopy__ attribute")
    except AttrMissing:
        pass
    if isinstance(vt, V.NewObjectVT):
        state = dict(instance_dict(vt).items)
    else:
        d = tx.builder.wrap(vt.obj.__dict__, AttrSource(vt.source, "__dict__"))
        if not isinstance(d, V.DictVT):
            raise Unsupported(f"copying a {cls.__qualname__} (its __dict__ is not a plain dict)")
        state = dict(d.items)
        for (oid, name), value in tx.output.pending_attrs.items():  # set while tracing
            if oid == id(vt.obj):
                state[name] = value
    if not all(isinstance(k, str) for k in state) or "__reduce_ex__" in state:
        raise Unsupported(f"copying a {cls.__qualname__} (unusual instance attributes)")
    return cls, state


def copies_by_dict(cls: type) -> bool:
    """copy.py copies a `cls` instance as `cls.__new__(cls)` plus its `__dict__`: object's own
    `__reduce_ex__` with no hook of the class changing what it returns or how it is applied."""
    from .pybuiltins import plain_instances

    if cls in copyreg.dispatch_table or not plain_instances(cls):
        return False
    if cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__:
        return False
    if getattr(cls, "__getstate__", None) is not getattr(object, "__getstate__", None):
        return False
    hooks = ("__copy__", "__deepcopy__", "__setstate__", "__getnewargs_ex__", "__getnewargs__")
    return not any(hasattr(cls, h) for h in hooks)
