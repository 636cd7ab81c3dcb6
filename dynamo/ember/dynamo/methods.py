"""Methods of built-in values: tensors, lists, tuples, dicts, sets and constants."""

from __future__ import annotations

from . import tensor_ops as T
from . import variables as V
from .calls import (const_key, key_vt, const_of, getitem, mutate_dict, mutate_list, try_const,
                    unpack, wrap_const)  # fmt: skip
from .exc import PyExc, Unsupported


def call_method_vt(tx, m: V.MethodVT, args, kwargs):
    obj, name = m.obj, m.name
    if isinstance(obj, V.TensorVT):
        return T.tensor_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.NdarrayVT):
        from .numpy_values import call_ndarray_method

        return call_ndarray_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.ListVT):
        return list_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.DictVT):
        return dict_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.DataclassVT):
        return model_output_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.SetVT):
        return set_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.ConstVT):
        cargs = [const_of(a, f"argument of {name}") for a in args]
        ckw = {k: const_of(v, f"argument of {name}") for k, v in kwargs.items()}
        try:
            return wrap_const(getattr(obj.value, name)(*cargs, **ckw))
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"{type(obj.value).__name__}.{name} raised {e!r}") from e
    if isinstance(obj, V.ObjectVT):  # a logger method (attrs.LOGGER_METHODS)
        tx.output.record_side_effect("call", m, list(args), dict(kwargs))
        return V.ConstVT(None)
    if isinstance(obj, V.GradModeVT):
        from .pybuiltins import enter_grad_mode, exit_grad_mode

        if name == "__enter__":
            enter_grad_mode(tx, obj)
            return V.ConstVT(None)
        return exit_grad_mode(tx, obj)
    raise Unsupported(f"method {name} of a {type(obj).__name__}")


def list_method(tx, obj: V.ListVT, name, args, kwargs):
    items = obj.items
    if name in ("append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort",
                "__setitem__", "__delitem__"):  # fmt: skip
        if obj.is_tuple:
            raise Unsupported(f"tuple.{name}")
        mutate_list(tx, obj)
    if name == "append":
        items.append(args[0])
    elif name == "extend":
        items.extend(unpack(tx, args[0]))
    elif name == "insert":
        items.insert(const_of(args[0], "index"), args[1])
    elif name == "pop":
        return items.pop(const_of(args[0], "index") if args else -1)
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "copy":
        return V.ListVT(list(items))
    elif name == "__getitem__":
        return getitem(tx, obj, args[0])
    elif name == "__len__":
        return V.ConstVT(len(items))
    elif name in ("index", "count", "sort", "remove", "__contains__"):
        ok, values = try_const(obj)
        if not ok:
            raise Unsupported(f"list.{name} over non-constant items")
        cargs = [const_of(a) for a in args]
        ckw = {k: const_of(v) for k, v in kwargs.items()}
        result = getattr(values, name)(*cargs, **ckw)
        if name in ("sort", "remove"):
            obj.items[:] = [wrap_const(v) for v in values]
            return V.ConstVT(None)
        return wrap_const(result)
    else:
        raise Unsupported(f"list.{name}")
    return V.ConstVT(None)


def dict_method(tx, obj: V.DictVT, name, args, kwargs):
    items = obj.items
    if name in ("update", "pop", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"):
        mutate_dict(tx, obj)
    if name == "keys":
        return V.ListVT([key_vt(k) for k in items], is_tuple=True)
    if name == "values":
        return V.ListVT(list(items.values()), is_tuple=True)
    if name == "items":
        return V.ListVT([V.TupleVT([key_vt(k), v]) for k, v in items.items()], is_tuple=True)
    if name == "get":
        key = const_key(args[0])
        return items.get(key, args[1] if len(args) > 1 else V.ConstVT(None))
    if name == "__getitem__":
        return getitem(tx, obj, args[0])
    if name == "__contains__":
        return V.ConstVT(const_key(args[0]) in items)
    if name == "__len__":
        return V.ConstVT(len(items))
    if name == "copy":
        return V.DictVT(dict(items), cls=obj.cls)
    if name == "update":
        from .calls import dict_items

        for a in args:
            items.update(dict_items(tx, a))
        items.update(kwargs)
        return V.ConstVT(None)
    if name == "pop":
        key = const_key(args[0])
        if key in items:
            return items.pop(key)
        if len(args) > 1:
            return args[1]
        raise PyExc(V.ExcVT(KeyError, [args[0]]), f"KeyError {key!r}")
    if name == "setdefault":
        key = const_key(args[0])
        return items.setdefault(key, args[1] if len(args) > 1 else V.ConstVT(None))
    if name == "clear":
        items.clear()
        return V.ConstVT(None)
    if name == "__setitem__":
        items[const_key(args[0])] = args[1]
        return V.ConstVT(None)
    raise Unsupported(f"dict.{name}")


def model_output_method(tx, obj: V.DataclassVT, name, args, kwargs):
    """Methods of a dict-subclass dataclass (HuggingFace ModelOutput)."""
    present = {k: v for k, v in obj.attrs.items() if not _none(v)}
    if name == "to_tuple":
        return V.TupleVT(list(present.values()))
    if name == "keys":
        return V.TupleVT([V.ConstVT(k) for k in present])
    if name == "values":
        return V.TupleVT(list(present.values()))
    if name == "items":
        return V.TupleVT([V.TupleVT([V.ConstVT(k), v]) for k, v in present.items()])
    if name == "get":
        return present.get(const_key(args[0]), args[1] if len(args) > 1 else V.ConstVT(None))
    if name == "__getitem__":
        return getitem(tx, obj, args[0])
    raise Unsupported(f"{obj.cls.__name__}.{name}")


def _none(v):
    return isinstance(v, V.ConstVT) and v.value is None


def set_method(tx, obj: V.SetVT, name, args, kwargs):
    if name == "add":
        if obj.source is not None:
            raise Unsupported("mutating a set from outside the compiled function")
        obj.items[const_key(args[0])] = None
        return V.ConstVT(None)
    if name == "__contains__":
        return V.ConstVT(const_key(args[0]) in obj.items)
    values = set(obj.items)
    cargs = [const_of(a) for a in args]
    result = getattr(values, name)(*cargs)
    if isinstance(result, (set, frozenset)):
        return V.SetVT(result)
    return wrap_const(result)
