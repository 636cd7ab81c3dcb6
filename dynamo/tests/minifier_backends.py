"""Backends with injected bugs, registered by name for test_minifier.py (a repro file imports
this module, by file, to find them again in a fresh process)."""

import torch
import torch.fx as fx

from ember.dynamo import register_backend


def _calls(gm, name: str) -> list:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")
            and getattr(n.target, "__name__", n.target) == name]  # fmt: skip


@register_backend("fails_on_sin")
def fails_on_sin(gm, example_inputs):
    """Raises while compiling any graph that calls sin (the message changes with the graph)."""
    if _calls(gm, "sin"):
        raise RuntimeError(f"sin is not supported (graph of {len(gm.graph.nodes)} nodes)")
    return gm.forward


@register_backend("fails_running_sin_and_cos")
def fails_running_sin_and_cos(gm, example_inputs):
    """Compiles anything; the result raises when called, if the graph calls both sin and cos."""
    if _calls(gm, "sin") and _calls(gm, "cos"):

        def broken(*args):
            raise ValueError("sin next to cos is miscompiled")

        return broken
    return gm.forward


@register_backend("perturbs_cos")
def perturbs_cos(gm, example_inputs):
    """A wrong compiler: every cos result comes out 0.5 too large."""
    graph = fx.Graph()
    env, cos = {}, set(_calls(gm, "cos"))
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda a: env[a])
        if node in cos:
            env[node] = graph.call_function(torch.add, (env[node], 0.5))
    return fx.GraphModule(gm, graph).forward


@register_backend("fails_on_nan_inputs")
def fails_on_nan_inputs(gm, example_inputs):
    """The result raises when called with a NaN in an input (a failure random inputs miss)."""

    def run(*args):
        if any(a.isnan().any() for a in args if isinstance(a, torch.Tensor)):
            raise FloatingPointError("NaN in an input")
        return gm.forward(*args)

    return run
