"""The front door: ember.compile, disable, reset, explain, export, and the module wrapper."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import inspect
import linecache
from typing import Callable

import torch

from . import convert, distributed
from ._native import _C
from .backends import CompileCounter, lookup_backend
from .dynamic import reset_automatic
from .minifier import hook as minifier_hook
from .export_capture import export  # noqa: F401  (re-exported: the front door's ember.export)


def _with_options(backend, name, mode, options) -> Callable:
    """The compiler function, given `mode`/`options` when it accepts them."""
    fn = lookup_backend(backend)
    extra = {k: v for k, v in (("mode", mode), ("options", options)) if v is not None}
    if not extra:
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in extra if k not in params and not accepts_kwargs]
    if unknown:
        raise TypeError(f"backend {name!r} does not take {', '.join(unknown)}")
    return functools.partial(fn, **extra)


def compile(model_or_fn=None, *, backend="inductor", mode=None, dynamic=None, fullgraph=False,
            options=None):  # fmt: skip
    """Capture `model_or_fn` into graphs compiled by `backend` (a call or a decorator).

    dynamic=True: every input size is a symbol; None (default): sizes marked with
    `ember.dynamo.mark_dynamic`, and sizes that change between calls (at the first recompile);
    False: every size is specialised. Symbols are used with backends that support them (see
    symbolic.py for the rules); sizes 0 and 1 are always specialised.

    mode, with the inductor backend (the names torch's compiler uses): None or "default"
    replays static inference graphs on CUDA from CUDA graphs, as torch's "reduce-overhead"
    does, and autotunes Triton block sizes; "reduce-overhead" is the same; "max-autotune" also
    makes CUDA matmuls generated Triton templates with their pointwise readers fused, where
    timing them against the library call says so (convolutions stay library calls);
    "max-autotune-no-cudagraphs" never replays from CUDA graphs. ember.inductor's README says
    more."""
    if model_or_fn is None:
        return functools.partial(compile, backend=backend, mode=mode, dynamic=dynamic,
                                 fullgraph=fullgraph, options=options)  # fmt: skip
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
    compiler = _with_options(backend, name, mode, options)
    callback = convert.make_callback(compiler, fullgraph, name, dynamic)
    if isinstance(model_or_fn, torch.nn.Module):
        # DDP's forward talks to its reducer and runs eagerly; the module it wraps is captured.
        forward = getattr(type(distributed.captured_module(model_or_fn)), "forward", None)
        if hasattr(forward, "__code__"):
            convert.force_codes[forward.__code__] = None
        return OptimizedModule(model_or_fn, callback)
    code = getattr(getattr(model_or_fn, "__func__", model_or_fn), "__code__", None)
    if code is not None:
        convert.force_codes[code] = None
    if not callable(model_or_fn):
        raise TypeError(f"ember.compile expects a function or nn.Module, got {type(model_or_fn)}")
    wrapper = _C.CompiledFunction(model_or_fn, callback)
    functools.update_wrapper(wrapper, model_or_fn)
    return wrapper


class OptimizedModule(torch.nn.Module):
    """A compiled module. Calls run the original module under the frame hook; every attribute
    read, write and nn.Module method (parameters, state_dict, train, to...) goes to the original,
    so its state_dict keys are the original's and optimizers see the same parameters. Pickling
    (torch.save) saves the original module."""

    def __init__(self, mod: torch.nn.Module, callback):
        super().__init__()
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_ember_call", _C.CompiledFunction(mod, callback))

    def __call__(self, *args, **kwargs):
        return self._ember_call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._ember_call(*args, **kwargs)

    def __getattr__(self, name):
        if name in ("_orig_mod", "_ember_call"):
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    @property
    def training(self):
        return self._orig_mod.training

    @training.setter
    def training(self, value):
        if "_orig_mod" in self.__dict__:  # nn.Module.__init__ sets it before _orig_mod exists
            self._orig_mod.training = value

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"

    def __dir__(self):
        return dir(self._orig_mod)

    def __reduce_ex__(self, protocol):
        return (_saved_module, (self._orig_mod,))


def _saved_module(mod):
    """Unpickling a saved OptimizedModule gives back the original module."""
    return mod


def _delegate(name):
    def method(self, *args, **kwargs):
        result = getattr(self._orig_mod, name)(*args, **kwargs)
        return self if result is self._orig_mod else result

    method.__name__ = name
    method.__doc__ = f"nn.Module.{name} of the original module."
    return method


for _name in dir(torch.nn.Module):
    if _name.startswith("_") or _name in ("forward", "training", "T_destination", "dump_patches",
                                          "call_super_init"):  # fmt: skip
        continue
    if callable(getattr(torch.nn.Module, _name)):
        setattr(OptimizedModule, _name, _delegate(_name))


def disable(fn=None, recursive=True):
    """Run `fn` eagerly: frames it starts are never captured (a graph break where it is called)."""
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    if isinstance(fn, torch.nn.Module):
        inner = _C.CompiledFunction(fn.forward, None)
        inner._ember_disabled = True
        fn.forward = inner
        return fn
    wrapper = _C.CompiledFunction(fn, None)
    functools.update_wrapper(wrapper, fn)
    wrapper._ember_disabled = True
    return wrapper


def reset() -> None:
    """Forget every compiled frame, cache entry, warning and statistic."""
    for code in list(convert._touched_codes):
        _C.clear_code(code)
    _forget_graph_sources(convert.stats.graphs)
    convert._touched_codes.clear()
    convert._warned.clear()
    convert.static_codes.clear()
    convert.stats.__init__()
    reset_automatic()
    minifier_hook.forget()


def _forget_graph_sources(records) -> None:
    """torch.fx keeps the generated source of every GraphModule (for tracebacks) in a
    process-wide cache and in linecache, forever: about 1 KiB per compiled graph that reset()
    would otherwise never give back (200 compile/reset cycles kept 200 sources)."""
    loader = getattr(torch.fx.graph_module, "_loader", None)
    for record in records:
        forward = getattr(type(record.gm), "forward", None)
        key = getattr(getattr(forward, "__code__", None), "co_filename", None)
        if not key or not key.startswith("<eval_with_key>"):
            continue
        linecache.cache.pop(key, None)
        if loader is not None and isinstance(getattr(loader, "eval_cache", None), dict):
            loader.eval_cache.pop(key, None)


@atexit.register
def _release_compiled_code() -> None:
    # The compiled entries hang off code objects, which live until the interpreter's last
    # teardown step: by then the extension modules that own native objects in those entries
    # (the C++ wrapper's models, CUDA graphs) are gone, and nanobind reports them as leaked.
    # Dropping the entries at exit frees them while their modules are still alive.
    reset()
    gc.collect()


@dataclasses.dataclass
class ExplainOutput:
    """What capturing one call produced: graphs, breaks (reason, file:line), ops and guards."""

    graphs: list
    graph_count: int
    graph_break_count: int
    break_reasons: list
    ops_per_graph: list
    out_guards: list

    def __str__(self):
        lines = [f"Graph count: {self.graph_count}", f"Graph break count: "
                 f"{self.graph_break_count}", "Break reasons:"]  # fmt: skip
        for i, b in enumerate(self.break_reasons):
            lines.append(f"  {i + 1}. {b.reason}\n     at {b.where}")
        lines.append("Ops per graph:")
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"  graph {i}: {', '.join(ops)}")
        lines.append(f"Guards ({len(self.out_guards)}):")
        lines += [f"  {g}" for g in self.out_guards]
        return "\n".join(lines)


def explain(fn, *extra_args, **extra_kwargs):
    """`explain(fn)(*args)`: compile `fn` afresh, run it once, and report graphs and breaks."""

    def inner(*args, **kwargs):
        stats = convert.stats
        g0, b0, f0 = len(stats.graphs), len(stats.breaks), len(stats.failures)
        compiled = compile(fn, backend=CompileCounter())
        compiled(*args, **kwargs)
        graphs = stats.graphs[g0:]
        breaks = stats.breaks[b0:] + stats.failures[f0:]
        ops = [[_op_name(n) for n in g.gm.graph.nodes
                if n.op in ("call_function", "call_method")] for g in graphs]  # fmt: skip
        guards = [g for rec in graphs for g in rec.guards]
        return ExplainOutput([g.gm for g in graphs], len(graphs), len(breaks), breaks, ops, guards)

    if extra_args or extra_kwargs:
        return inner(*extra_args, **extra_kwargs)
    return inner


def _op_name(node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


__all__ = ["compile", "disable", "reset", "export", "explain", "OptimizedModule", "ExplainOutput"]
