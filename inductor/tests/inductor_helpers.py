"""Building prim graphs by hand for inductor tests (no tracer needed)."""

from __future__ import annotations

import torch
from ember.ir import NODE_META_KEY, SymbolSpec, TensorMeta, contiguous_strides
from ember.ir.symbols import sym
from ember.primtorch import prims
from torch import fx


class PrimGraph:
    """`g = PrimGraph(); x = g.input(t); y = g(prims.exp, x); g.output(y); g.module()`."""

    def __init__(self):
        self.graph = fx.Graph()
        self.inputs: list[torch.Tensor] = []

    def input(self, t: torch.Tensor) -> fx.Node:
        node = self.graph.placeholder(f"in{len(self.inputs)}")
        node.meta[NODE_META_KEY] = TensorMeta.from_tensor(t)
        self.inputs.append(t)
        return node

    def __call__(self, prim, *args, **kwargs) -> fx.Node:
        def meta(a):
            if isinstance(a, fx.Node):
                return a.meta[NODE_META_KEY]
            if isinstance(a, (list, tuple)):
                return type(a)(meta(x) for x in a)
            return a

        out = prim.meta(*(meta(a) for a in args), **{k: meta(v) for k, v in kwargs.items()})
        node = self.graph.call_function(prim, tuple(args), kwargs)
        node.meta[NODE_META_KEY] = out
        return node

    def output(self, *nodes):
        self.graph.output(tuple(nodes))

    def module(self) -> fx.GraphModule:
        return fx.GraphModule({}, self.graph)


def softmax_graph(x: torch.Tensor, dim: int = -1):
    """Softmax over `dim` in prims, the way a decomposition spells it."""
    g = PrimGraph()
    a = g.input(x)
    dim = dim % x.ndim
    keep = [d for d in range(x.ndim) if d != dim]
    m = g(prims.amax, a, [dim])
    mb = g(prims.broadcast_in_dim, m, list(x.shape), keep)
    e = g(prims.exp, g(prims.sub, a, mb))
    s = g(prims.sum, e, [dim])
    sb = g(prims.broadcast_in_dim, s, list(x.shape), keep)
    g.output(g(prims.div, e, sb))
    return g


def layer_norm_graph(x, w, b, eps=1e-5):
    """Layer norm over the last dim in prims (var + sum + pointwise epilogue)."""
    g = PrimGraph()
    a, wn, bn = g.input(x), g.input(w), g.input(b)
    n, shape, keep = x.shape[-1], list(x.shape), list(range(x.ndim - 1))
    mean = g(prims.div, g(prims.sum, a, [x.ndim - 1]), float(n))
    var = g(prims.var, a, [x.ndim - 1], 0.0)
    rstd = g(prims.rsqrt, g(prims.add, var, eps))
    centered = g(prims.sub, a, g(prims.broadcast_in_dim, mean, shape, keep))
    normed = g(prims.mul, centered, g(prims.broadcast_in_dim, rstd, shape, keep))
    out = g(
        prims.add,
        g(prims.mul, normed, g(prims.broadcast_in_dim, wn, shape, [x.ndim - 1])),
        g(prims.broadcast_in_dim, bn, shape, [x.ndim - 1]),
    )
    g.output(out)
    return g


def check(fn, *args, kernels=None, atol=1e-5, rtol=1.3e-6, fallbacks=()):
    """Trace `fn` to prims, compile it, compare with eager; return the CompiledGraph."""
    from ember.inductor import compile_prims, metrics
    from ember.primtorch.trace import trace_to_prims
    from torch.utils import _pytree as pytree

    gm = trace_to_prims(fn, *args)
    metrics.reset()
    compiled = compile_prims(gm, list(args))
    compiled(*args)  # the first call may take another path (autotuning, launcher set-up)
    got = pytree.tree_leaves(compiled(*args))
    expected = pytree.tree_leaves(fn(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True)
        assert g.stride() == e.stride() or g.numel() <= 1, (g.stride(), e.stride())
    assert sorted(set(metrics.fallbacks)) == sorted(fallbacks), metrics.fallbacks
    if kernels is not None:
        assert metrics.generated_kernel_count == kernels, compiled.source
    return compiled


def dynamic_gm(module, example_inputs, dims, upper=None):
    """fx.symbolic_trace(module) with input `i`'s dims `dims[i]` ({dim: symbol name}) symbolic."""
    gm = fx.symbolic_trace(module)
    names = {}
    for p, t, d in zip(gm.graph.find_nodes(op="placeholder"), example_inputs, dims):
        sizes = [sym(d[k]) if k in d else s for k, s in enumerate(t.shape)]
        p.meta[NODE_META_KEY] = TensorMeta(t.dtype, sizes, contiguous_strides(sizes), device="cpu")
        names.update(dict.fromkeys(d.values()))
    gm.meta["ember_symbols"] = tuple(SymbolSpec(n, upper=upper) for n in names)
    return gm
