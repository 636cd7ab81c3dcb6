"""Dynamic shapes: one traced and compiled program for every size a frontend declared symbolic.

A graph module whose `meta["ember_symbols"]` is non-empty (DYNAMIC.md) has placeholders whose
TensorMeta sizes are sympy expressions over those symbols. We trace it once, at the example
inputs' sizes (the hints), with SymbolicTensors, so the prim graphs' sizes are expressions; the
compilers get those graphs and real example inputs. Each call binds the symbols from the inputs'
sizes and checks what the trace assumed: every size and stride, the symbols' ranges, and the
guards the trace recorded (returned as `ember_guards` for the frontend to check first). A call
that fails a check raises: a wrong result is never an option.
"""

from __future__ import annotations

import copy
import operator
from typing import Callable

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, FloorDiv, TensorMeta
from ember.ir.locks import COMPILE_LOCK
from ember.primtorch.symbolic import ShapeEnv, bind_symbols, expr_function

from .module_call import _state_reader, module_state
from .signature import mode_state

# gm.meta key of the frontend's symbols (a tuple of ember.ir.SymbolSpec).
SYMBOLS_META = "ember_symbols"


class ShapeMismatch(RuntimeError):
    """A call whose input sizes the compiled dynamic program does not cover."""


class InputCheck:
    """Binds the symbols from a flat input tuple and checks sizes, strides, ranges and guards."""

    def __init__(self, metas: list, specs, guards=()):
        self.metas, self.specs = metas, tuple(specs)
        self.symbols = [s.symbol for s in self.specs]
        self.where = {}  # symbol -> (flat index, dim) it is read from
        for i, m in enumerate(metas):
            if isinstance(m, TensorMeta):
                for d, size in enumerate(m.sizes):
                    if size.is_Symbol:
                        self.where.setdefault(size, (i, d))
        missing = [s.name for s in self.symbols if s not in self.where]
        if missing:
            raise NotImplementedError(
                f"aot_autograd: symbols {missing} are not the size of any input dimension; "
                "dynamic shapes need each symbol to be some input's size"
            )
        self.checked = [(i, m) for i, m in enumerate(metas) if isinstance(m, TensorMeta)]
        exprs = []
        for _, m in self.checked:
            exprs += [*m.sizes, *m.strides]
        self.guards = tuple(guards)
        self._expected = expr_function(self.symbols, exprs + [sympy.And(*self.guards)])

    def bind(self, flat) -> dict:
        """symbol -> value for this call; raises ShapeMismatch when the program does not cover it."""
        values = [flat[i].shape[d] for i, d in (self.where[s] for s in self.symbols)]
        for spec, v in zip(self.specs, values):
            if not spec.contains(v):
                raise ShapeMismatch(
                    f"size {spec.name}={v} is outside the compiled range [{spec.lower}, "
                    f"{spec.upper if spec.upper is not None else 'inf'}]"
                )
        *expected, guards_hold = self._expected(*values)
        k = 0
        for i, m in self.checked:
            n = len(m.sizes)
            t = flat[i]
            if (t.dtype, str(t.device)) != (m.dtype, m.device):
                raise ShapeMismatch(f"input {i} is {t.dtype} on {t.device}; the compiled program "
                                    f"expects {m.describe()}")  # fmt: skip
            if tuple(t.shape) != tuple(expected[k : k + n]) or (
                t.dim() and _significant(t.shape, t.stride()) != _significant(
                    t.shape, expected[k + n : k + 2 * n])
            ):  # fmt: skip
                raise ShapeMismatch(
                    f"input {i} has sizes {tuple(t.shape)} and strides {t.stride()}; the compiled "
                    f"program expects sizes {m.sizes} and strides {m.strides}"
                )
            k += 2 * n
        if not guards_hold:
            raise ShapeMismatch(f"sizes {dict(zip(self.symbols, values))} fail the guards "
                                f"{self.guards} the program was traced under")  # fmt: skip
        return dict(zip(self.symbols, values))


_requires_grad = operator.attrgetter("requires_grad")


def _significant(sizes, strides):
    return tuple(st for s, st in zip(sizes, strides) if s > 1)


def symbolic_metas(gm: fx.GraphModule) -> list:
    """Per placeholder of `gm`: its TensorMeta where a size is symbolic, else None (traced as it
    is)."""
    metas = [n.meta.get(NODE_META_KEY) for n in gm.graph.find_nodes(op="placeholder")]
    return [m if isinstance(m, TensorMeta) and not m.is_static() else None for m in metas]


def dynamic_module_call(gm: fx.GraphModule, example_inputs: list, compiled) -> Callable:
    """`run(*args)` for a graph module with symbolic sizes: traced now, once per mode state."""
    specs = tuple(gm.meta[SYMBOLS_META])
    read_state = _state_reader(gm)
    state = read_state() if read_state is not None else ()
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise NotImplementedError("aot_autograd: dynamic shapes with non-tensor graph inputs")
    metas = [None] * len(state) + symbolic_metas(gm)
    params, buffers = module_state(gm)
    in_spec = pytree.tree_flatten(((params, buffers, *example_inputs), {}))[1]
    runtimes: dict = {}  # mode state -> (runtime, InputCheck)

    def compile_for(flat: tuple):
        hints = bind_symbols(metas, flat)
        env = ShapeEnv(specs, hints)
        # `compiled.symbolic` is read by the compile: under the process's compile lock, so that
        # another thread's compile of this program (another mode state) cannot swap it meanwhile.
        with COMPILE_LOCK:
            compiled.symbolic = (metas, env)
            try:
                runtime = compiled._compile(list(flat), in_spec)
            finally:
                compiled.symbolic = None
        return runtime, InputCheck(metas, specs, env.guards)

    def run(*args):
        flat = (read_state() if read_state is not None else ()) + args
        key = (mode_state(), *map(_requires_grad, flat))
        entry = runtimes.get(key)
        if entry is None:
            InputCheck(metas, specs).bind(flat)
            with COMPILE_LOCK:  # a thread that waited finds what another compiled meanwhile
                entry = runtimes.get(key)
                if entry is None:
                    entry = runtimes[key] = compile_for(flat)
        entry[1].bind(flat)
        return entry[0].call(flat)

    example = tuple(state) + tuple(example_inputs)
    first = runtimes[(mode_state(), *map(_requires_grad, example))] = compile_for(example)
    run.ember_guards = first[1].guards
    run.ember_supports_dynamic = True
    run.aot_function = compiled
    return run


def _symbol_sources(placeholders) -> dict:
    """symbol -> (placeholder name, dim, None or a function of that dim's size giving the symbol):
    a dim whose size is the symbol itself first; else one whose size is a*s + b in that symbol
    alone (a backward's tangent of a concatenation is 2*s long, and may be all it has of s)."""
    where, affine = {}, {}
    for p in placeholders:
        meta = p.meta.get(NODE_META_KEY)
        if not isinstance(meta, TensorMeta):
            continue
        for d, size in enumerate(meta.sizes):
            size = sympy.sympify(size)
            if size.is_Symbol:
                where.setdefault(size, (p.name, d, None))
            elif len(size.free_symbols) == 1:
                (s,) = size.free_symbols
                a, b = size.diff(s), size.subs(s, 0)
                if a.is_Integer and b.is_Integer and a > 0 and size == a * s + b:
                    affine.setdefault(s, (p.name, d, int(a), int(b)))
    for s, (name, d, a, b) in affine.items():
        if s not in where:
            y = sympy.Symbol("size", integer=True)
            where[s] = (name, d, expr_function([y], [FloorDiv(y - b, a)]))
    return where


def runnable_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` itself when its sizes are static; else a copy whose sympy size arguments are computed
    at run time from the inputs' sizes (what a prim graph with symbolic sizes needs to run as fx)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    where = _symbol_sources(placeholders)
    if not where:
        return gm
    new = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    graph = new.graph
    by_name = {p.name: p for p in graph.find_nodes(op="placeholder")}
    sizes = {}
    with graph.inserting_after(list(by_name.values())[-1]):
        for s, (name, d, inverse) in where.items():
            size = graph.call_function(torch.ops.aten.sym_size.int, (by_name[name], d))
            if inverse is not None:
                inverse.__module__, inverse.__name__ = __name__, "size_expr"
                size = graph.call_function(operator.getitem,
                                           (graph.call_function(inverse, (size,)), 0))
            sizes[s] = size

    def computed(arg):
        if not (isinstance(arg, sympy.Basic) and arg.free_symbols):
            return arg
        free = sorted(arg.free_symbols, key=lambda s: s.name)
        unknown = [s for s in free if s not in sizes]
        if unknown:
            raise NotImplementedError(f"aot_autograd: size {arg} uses symbols {unknown} that no "
                                      "input's size gives")  # fmt: skip
        fn = expr_function(free, [arg])
        fn.__module__, fn.__name__ = __name__, "size_expr"  # how fx's code generator names it
        return graph.call_function(operator.getitem, (graph.call_function(fn, tuple(sizes[s] for s in free)), 0))

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is not torch.ops.aten.sym_size.int:
            with graph.inserting_before(node):
                node.args = fx.node.map_aggregate(node.args, computed)
                node.kwargs = fx.node.map_aggregate(node.kwargs, computed)
    graph.lint()
    new.recompile()
    return new
