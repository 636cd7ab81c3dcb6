"""Wrapping real Python values read by the frame into symbolic values, installing guards."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
from typing import Optional

import torch

from . import variables as V
from .exc import Unsupported
from .source import AttrSource, ItemSource, Source

# Values guarded by equality and treated as constants.
CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
               type(NotImplemented), torch.dtype, torch.device, torch.layout,
               torch.memory_format, slice, range, torch.Size, torch.finfo,
               torch.iinfo, inspect.Signature, inspect.Parameter,
               types.MappingProxyType)  # fmt: skip

# Callables whose calls calls.py handles itself (torch ops, builtins, C functions).
BUILTIN_TYPES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                 types.WrapperDescriptorType, types.MethodDescriptorType,
                 types.ClassMethodDescriptorType, types.GetSetDescriptorType,
                 type(torch.add), type(torch.Tensor.add))  # fmt: skip


def is_const_value(value) -> bool:
    if isinstance(value, CONST_TYPES) and not isinstance(value, enum.Enum):
        return True
    if isinstance(value, enum.Enum):
        return True
    if type(value) in (tuple, frozenset) and all(is_const_value(v) for v in value):
        return True
    return False


def is_namedtuple_type(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


class Builder:
    """`wrap(value, source)`: the VT for a real value, with the guards that make tracing it safe."""

    def __init__(self, output):
        self.output = output
        self.guards = output.guards
        self.cache: dict = {}
        self.containers: dict[int, tuple] = {}  # id -> (list/dict/set, its first source)

    def guard(self, kind, source, value=None):
        if source is not None:
            self.guards.add(kind, source, value)

    def wrap(self, value, source: Optional[Source]) -> V.VT:
        """The one VT of `source` (reads of the same source share it, so mutations are seen)."""
        if source is None:
            return self._wrap(value, None)
        vt = self.cache.get(source)
        if vt is None:
            vt = self._shared_container(value, source) or self._wrap(value, source)
            self.cache[source] = vt
        return vt

    def _shared_container(self, value, source) -> Optional[V.VT]:
        """The VT already made for this very list, dict or set reached through another source
        (`c.names` where `c` is a copy of `config`, and `config.names`): one VT per object, so
        `is` holds and a mutation through one name is seen through the other; the aliasing is
        guarded."""
        if type(value) not in (list, dict, set):
            return None
        first = self.containers.get(id(value))
        if first is None:
            self.containers[id(value)] = (value, source)
            return None
        vt = self.cache.get(first[1])  # None while the first is still being wrapped (a cycle)
        if vt is not None:
            self.guards.add("SAME", source, first[1])
        return vt

    def _key(self, key):
        """The key of a DictVT for a real dict key."""
        if is_const_value(key):
            return key
        from .calls import ObjKey

        return ObjKey(_key_vt(self, key), key)

    def _wrap(self, value, source: Optional[Source]) -> V.VT:
        g = self.guard
        if isinstance(value, torch.Tensor):
            if source is None:
                raise Unsupported("a tensor reached without a source (a closure or default value?)")
            return self.output.add_input(value, source)
        if maybe_numpy(value):  # ndarrays, NumPy scalars and dtypes, NumPy functions
            from .numpy_values import wrap_numpy_value

            vt = wrap_numpy_value(self, value, source)
            if vt is not None:
                return vt
        if is_const_value(value):
            if isinstance(value, (bool, type(None))) or isinstance(value, enum.Enum):
                g("ID", source, value)
            elif isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                g("ID", source, value)
            else:
                g("EQ", source, value)
            return V.ConstVT(value, source)
        if isinstance(value, torch.nn.Module):
            if self.output.generic_modules and source is not None:
                # any instance of this class: what is read from it is guarded where it is read,
                # and which parameters, buffers and submodules it has, here
                # (the instance dict's keys: an attribute one instance sets over its class's)
                g("TYPE", source, type(value))
                for table in ("_parameters", "_buffers", "_modules", "__dict__"):
                    g("DICT_KEYS", AttrSource(source, table), tuple(getattr(value, table)))
                vt = V.ModuleVT(value, source)
                vt.generic = True
                return vt
            g("ID", source, value)
            return V.ModuleVT(value, source)
        if isinstance(value, types.ModuleType):
            g("ID", source, value)
            return V.PyModuleVT(value, source)
        if isinstance(value, types.FunctionType):
            if "<locals>" in value.__qualname__ and source is not None:
                # A nested function is made anew on each call of its parent: guard what it runs
                # (code, constant defaults); its closure cells are guarded when read.
                g("ID", AttrSource(source, "__code__"), value.__code__)
                if value.__defaults__ is not None and is_const_value(value.__defaults__):
                    g("EQ", AttrSource(source, "__defaults__"), value.__defaults__)
                else:
                    g("ID", source, value)
            else:
                g("ID", source, value)
            return V.FunctionVT(value, source)
        if isinstance(value, types.MethodType):
            self_vt = self.wrap(value.__self__, _attr(source, "__self__"))
            fn_vt = self.wrap(value.__func__, _attr(source, "__func__"))
            return V.BoundMethodVT(fn_vt, self_vt, source)
        if isinstance(value, type):
            g("ID", source, value)
            return V.ClassVT(value, source)
        if isinstance(value, BUILTIN_TYPES) or _is_torch_callable(value):
            g("ID", source, value)
            return V.BuiltinVT(value, source)
        if type(value) in (list, tuple) or is_namedtuple_type(type(value)):
            g("TYPE", source, type(value))
            g("LEN", source, len(value))
            items = [self.wrap(v, _item(source, i)) for i, v in enumerate(value)]
            if type(value) is list:
                return V.ListVT(items, source)
            if type(value) is tuple:
                return V.TupleVT(items, source)
            return V.NamedTupleVT(type(value), items, type(value)._fields, source)
        if isinstance(value, dict) and not dataclasses.is_dataclass(value):
            keys = list(value.keys())
            if not all(is_const_value(k) or _identity_key(k) for k in keys):
                raise Unsupported("dict with non-constant keys")
            g("TYPE", source, type(value))
            g("DICT_KEYS", source, tuple(keys))
            items = {self._key(k): self.wrap(v, _item(source, k)) for k, v in value.items()}
            return V.DictVT(items, source, type(value))
        if isinstance(value, (set, frozenset)) and all(is_const_value(v) for v in value):
            g("TYPE", source, type(value))
            g("EQ", source, value)
            return V.SetVT(value, source)
        if isinstance(value, torch.autograd.grad_mode._NoParamDecoratorContextManager):
            g("ID", source, value)
            return V.GradModeVT(isinstance(value, torch.enable_grad))
        if callable(value) and getattr(value, "_ember_disabled", False):
            g("ID", source, value)
            return V.BuiltinVT(value, source)
        if source is None:
            raise Unsupported(f"a {type(value).__name__} object reached without a source")
        g("TYPE", source, type(value))
        return V.ObjectVT(value, source)


def maybe_numpy(value) -> bool:
    """A cheap test (NumPy not imported) for a value numpy_values.wrap_numpy_value may take."""
    t = type(value)
    if _in_numpy(t):
        return True
    if t is types.BuiltinFunctionType or t is types.FunctionType or t.__name__ == (
        "cython_function_or_method"  # np.random.* functions
    ):
        owner = getattr(value, "__self__", None)  # a method: np.add.reduce, np.random.rand
        return _in_numpy(value) or (owner is not None and _in_numpy(type(owner)))
    return False


def _in_numpy(obj) -> bool:
    mod = getattr(obj, "__module__", None)
    return isinstance(mod, str) and (mod == "numpy" or mod.startswith("numpy."))


def _identity_key(key) -> bool:
    """A dict key that compares and hashes by identity (a class, a function, a plain object):
    a dispatch table keyed by such keys is looked up by identity while tracing (calls.ObjKey)."""
    t = type(key)
    return t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__


def _is_torch_callable(value) -> bool:
    """torch functions written in Python that belong in the graph (torch.nn.functional.*)."""
    mod = getattr(value, "__module__", None) or ""
    return callable(value) and mod.startswith("torch") and not isinstance(value, type) and (
        isinstance(value, types.FunctionType) is False
    )


def _key_vt(builder, key):
    from .source import ConstantSource

    return builder.wrap(key, ConstantSource(key, getattr(key, "__qualname__", type(key).__name__)))


def _attr(source, name):
    from .source import AttrSource

    return AttrSource(source, name) if source is not None else None


def _item(source, key):
    return ItemSource(source, key) if source is not None else None
