"""The backends registry: names -> compiler functions `(gm, example_inputs) -> callable`.

Backends provided by other components are resolved lazily from "module:attribute" strings, so
ember.dynamo never imports them (the component arrows stay ir <- dynamo only).
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

_REGISTRY: dict[str, Callable] = {}
_LAZY: dict[str, str] = {
    "aot_eager": "ember.aot_autograd:aot_eager",
    "inductor": "ember.inductor:compile_fx",
}

# What ember.export needs from other components, found the same way ("module" alone: importing
# the module is the point; ember.primtorch defines the op vocabulary that saved graphs name).
_ENTRIES: dict[str, str] = {
    "export_lowering": "ember.aot_autograd:export_inference_graph",
    # a prim graph with symbolic sizes as runnable fx (its sizes computed from the inputs')
    "runnable_graph": "ember.aot_autograd.dynamic:runnable_graph",
    "op_vocabulary": "ember.primtorch",
}
_RESOLVED: dict[str, object] = {}


class BackendNotFound(RuntimeError):
    """No backend of that name is registered or importable."""


def register_backend(name: Optional[str] = None, compiler_fn: Optional[Callable] = None):
    """Register `compiler_fn` under `name`; usable as a decorator (`@register_backend("x")`)."""
    if callable(name) and compiler_fn is None:  # @register_backend without arguments
        fn = name
        _REGISTRY[fn.__name__] = fn
        return fn
    if compiler_fn is None:

        def decorator(fn):
            _REGISTRY[name or fn.__name__] = fn
            return fn

        return decorator
    _REGISTRY[name or compiler_fn.__name__] = compiler_fn
    return compiler_fn


def list_backends() -> list[str]:
    """Every backend name: registered ones and those other components provide."""
    return sorted(set(_REGISTRY) | set(_LAZY))


def lookup_backend(backend) -> Callable:
    """A compiler function for a name or a callable."""
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, got {type(backend).__name__}")
    if backend in _REGISTRY:
        return _REGISTRY[backend]
    if backend in _LAZY:
        module_name, attr = _LAZY[backend].split(":")
        try:
            module = importlib.import_module(module_name)
            fn = getattr(module, attr)
        except (ImportError, AttributeError) as e:
            raise BackendNotFound(
                f"backend {backend!r} is provided by {module_name}, which is not available "
                f"({e}); install that component or use backend='eager'"
            ) from None
        _REGISTRY[backend] = fn
        return fn
    raise BackendNotFound(f"unknown backend {backend!r}; known: {', '.join(list_backends())}")


def resolve_entry(name: str):
    """The object a registry entry names, imported at first use (a module for "module" alone)."""
    if name in _RESOLVED:
        return _RESOLVED[name]
    module_name, _, attr = _ENTRIES[name].partition(":")
    try:
        obj = importlib.import_module(module_name)
        obj = getattr(obj, attr) if attr else obj
    except (ImportError, AttributeError) as e:
        raise BackendNotFound(f"{name} is provided by {module_name}, which is not available ({e})")
    _RESOLVED[name] = obj
    return obj


@register_backend("eager")
def eager(gm, example_inputs):
    """Runs the captured graph as it is (its generated forward, skipping nn.Module.__call__)."""
    return gm.forward


# Graphs with symbolic sizes (gm.meta["ember_symbols"]) go only to compiler functions carrying
# this flag (DYNAMIC.md); the others get graphs specialised to the current sizes.
eager.ember_supports_dynamic = True


class CompileCounter:
    """A backend that counts graphs and ops, then runs them eagerly (for tests); with
    `dynamic=True` it takes graphs with symbolic sizes."""

    def __init__(self, dynamic: bool = False):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []
        self.ember_supports_dynamic = dynamic

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.graphs.append(gm)
        self.op_count += sum(
            1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
        )
        return gm.forward
