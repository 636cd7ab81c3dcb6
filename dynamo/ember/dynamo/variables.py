"""Symbolic values ("variable trackers") of the bytecode interpreter.

Each class only holds what a value is; the interpreter (interpreter.py, calls.py) gives them
behaviour. `source`, where set, says how the transformed code reaches the real object again.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch

from .source import Source


class VT:
    """A symbolic value."""

    source: Optional[Source] = None

    def python_type(self) -> type:
        raise NotImplementedError(type(self).__name__)

    def is_const(self) -> bool:
        return False

    def __repr__(self):
        return f"{type(self).__name__}()"


class NullVT(VT):
    """The NULL the 3.11+ call protocol pushes below a callable."""


NULL = NullVT()


class ConstVT(VT):
    """An immutable Python value known at trace time (ints, strs, dtypes, torch.Size, ranges...)."""

    def __init__(self, value, source: Optional[Source] = None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def is_const(self):
        return True

    def __repr__(self):
        return f"ConstVT({self.value!r})"


class TensorVT(VT):
    """A tensor: its fx node, a real example value, and the Python type it has (Parameter...)."""

    def __init__(self, node, example: torch.Tensor, source=None, ptype=None):
        self.node = node
        self.example = example
        self.source = source
        self.ptype = ptype or torch.Tensor
        self.real = None  # the user's tensor, for graph inputs
        self.generic = False  # a parameter of a module traced for any instance (output.py)
        # Sizes as sympy expressions when they depend on symbols (shapes.py); None: static.
        self.sym = None
        # A frame input the graph computes a new value for (`node`), written into the caller's
        # tensor after the graph (autograd_function.py): rebuilt from `source`, not the graph.
        self.written_back = False

    def python_type(self):
        return self.ptype

    def __repr__(self):
        return f"TensorVT({self.node.name}, {tuple(self.example.shape)})"


class NdarrayVT(VT):
    """A NumPy ndarray, or a NumPy scalar (`scalar`), computed in the graph as the tensor `tensor`
    (numpy_values.py gives it NumPy's behaviour); `source` is set for arrays the frame reads."""

    def __init__(self, tensor: TensorVT, scalar=False, source=None, readonly=False):
        self.tensor = tensor
        self.scalar = scalar  # a NumPy scalar (np.float32(...)), as NumPy returns from reductions
        self.source = source
        self.readonly = readonly

    def python_type(self):
        import numpy as np

        if self.scalar:
            return np.dtype(str(self.tensor.example.dtype).removeprefix("torch.")).type
        return np.ndarray

    def __repr__(self):
        return f"NdarrayVT({self.tensor!r}{', scalar' if self.scalar else ''})"


class ListVT(VT):
    """A list (mutable) or tuple; `source` is set when it mirrors a pre-existing list."""

    def __init__(self, items: list, source=None, is_tuple=False):
        self.items = list(items)
        self.source = source
        self.is_tuple = is_tuple

    def python_type(self):
        return tuple if self.is_tuple else list

    def __repr__(self):
        return f"{'Tuple' if self.is_tuple else 'List'}VT({self.items!r})"


def TupleVT(items, source=None):
    return ListVT(items, source, is_tuple=True)


class NamedTupleVT(ListVT):
    """A namedtuple or structseq (torch.return_types.*): a tuple whose fields have names."""

    def __init__(self, cls, items, fields, source=None):
        super().__init__(items, source, is_tuple=True)
        self.cls = cls
        self.fields = tuple(fields)

    def python_type(self):
        return self.cls


class DictVT(VT):
    """A dict (or dict subclass) whose keys are constants."""

    def __init__(self, items: dict, source=None, cls=dict):
        self.items = dict(items)
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls


class SetVT(VT):
    """A set of constants."""

    def __init__(self, items, source=None):
        self.items = dict.fromkeys(items)  # keys are ConstVT values: insertion ordered
        self.source = source

    def python_type(self):
        return set


class IteratorVT(VT):
    """An iterator over a list of symbolic items known at trace time (loops are unrolled)."""

    def __init__(self, items: list):
        self.items = list(items)
        self.pos = 0

    def python_type(self):
        return type(iter([]))


class FunctionVT(VT):
    """A real Python function (inlined when called)."""

    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return types.FunctionType


class CellVT(VT):
    """A closure cell created during tracing."""

    def __init__(self, value: Optional[VT] = None):
        self.value = value


class NestedFunctionVT(VT):
    """A function made by MAKE_FUNCTION while tracing (closures, lambdas, comprehensions)."""

    def __init__(self, code, globals_, name, defaults, kwdefaults, closure):
        self.code = code
        self.globals = globals_
        self.name = name
        self.defaults = defaults  # tuple of VT or None
        self.kwdefaults = kwdefaults  # dict str->VT or None
        self.closure = closure  # tuple of CellVT or None

    def python_type(self):
        return types.FunctionType


class BoundMethodVT(VT):
    """`obj.method` for a Python-level method: calls `fn` with `self_vt` first."""

    def __init__(self, fn: VT, self_vt: VT, source=None):
        self.fn = fn
        self.self_vt = self_vt
        self.source = source

    def python_type(self):
        return types.MethodType


class BuiltinVT(VT):
    """A C function, builtin, torch function or other callable handled by calls.py."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def __repr__(self):
        return f"BuiltinVT({getattr(self.fn, '__name__', self.fn)})"


class NumpyFunctionVT(BuiltinVT):
    """A NumPy function, ufunc or method (identity guarded); numpy_map.py traces its calls."""


class MethodVT(VT):
    """A method of a symbolic value (tensor, list, dict, str...): `obj.name`."""

    def __init__(self, obj: VT, name: str, source=None):
        self.obj = obj
        self.name = name
        self.source = source

    def python_type(self):
        return types.BuiltinMethodType


class ModuleVT(VT):
    """An nn.Module instance (identity guarded); calling it inlines its forward."""

    def __init__(self, module: torch.nn.Module, source=None):
        self.module = module
        self.source = source
        self.generic = False  # stands for any instance of its type (builder, generic frames)

    def python_type(self):
        return type(self.module)


class PyModuleVT(VT):
    """A Python module object (torch, math, torch.nn.functional...)."""

    def __init__(self, module: types.ModuleType, source=None):
        self.module = module
        self.source = source

    def python_type(self):
        return types.ModuleType


class ClassVT(VT):
    """A class (type) object."""

    def __init__(self, cls: type, source=None):
        self.cls = cls
        self.source = source

    def python_type(self):
        return type(self.cls)


class ObjectVT(VT):
    """A pre-existing Python object reached through `source` (type guarded, attributes lazy)."""

    def __init__(self, obj: Any, source=None):
        self.obj = obj
        self.source = source

    def python_type(self):
        return type(self.obj)


class ExcVT(VT):
    """An exception instance created while tracing."""

    def __init__(self, cls: type, args: list):
        self.cls = cls
        self.args = list(args)

    def python_type(self):
        return self.cls


class NewObjectVT(VT):
    """An instance of a user class created while tracing; `attrs` are its symbolic attributes."""

    def __init__(self, cls: type, attrs: Optional[dict] = None):
        self.cls = cls
        self.attrs = dict(attrs or {})

    def python_type(self):
        return self.cls


class IdVT(VT):
    """`id(x)` of a traced value: an int nobody can know at trace time, but one that compares
    and hashes by the identity of `x` (copy.deepcopy's memo, caches keyed by id)."""

    def __init__(self, target: VT, identity: Any):
        self.target = target
        self.identity = identity  # the real object, or the VT of one made while tracing

    def python_type(self):
        return int


class DataclassVT(NewObjectVT):
    """A dataclass instance built while tracing (HF ModelOutput too); rebuilt as cls(**fields)."""


class SuperVT(VT):
    """super(cls, obj)."""

    def __init__(self, cls: type, obj: VT):
        self.cls = cls
        self.obj = obj


class GradModeVT(VT):
    """torch.no_grad() / enable_grad() / set_grad_enabled(b) as a context manager or decorator."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.prev: Optional[bool] = None

    def python_type(self):
        return torch.no_grad if not self.enabled else torch.enable_grad


class ContextExitVT(VT):
    """The bound `__exit__` BEFORE_WITH leaves on the stack for a symbolic context manager."""

    def __init__(self, ctx: VT, user: bool = False):
        self.ctx = ctx
        self.user = user  # a Python-level context manager (else a grad-mode one)


def is_const(vt: VT) -> bool:
    return isinstance(vt, ConstVT)


def const_value(vt: VT):
    return vt.value
