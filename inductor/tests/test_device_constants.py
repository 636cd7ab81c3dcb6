"""fold_device_constants: scalars computed on the CPU from constants and moved to a GPU become
constants made there, so the program has no host step (which would keep it off CUDA graphs)."""

import math

import torch
from torch import fx

from ember.inductor.device_constants import fold_device_constants
from ember.ir import NODE_META_KEY, TensorMeta, target_name
from ember.primtorch import prims

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def _call(graph, prim, *args):
    """A node of `prim` with its TensorMeta, as a traced prim graph has."""
    node = graph.call_function(prim, args)
    metas = [a.meta[NODE_META_KEY] if isinstance(a, fx.Node) else a for a in args]
    node.meta[NODE_META_KEY] = prim.meta(*metas)
    return node


def _attention_scale_graph(head_dim=64, factor=3):
    """x / sqrt(tensor(head_dim) * factor), the scalar built on the CPU (DeBERTa's scale)."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (4, 8), (8, 1), 0, "cuda")
    size = _call(g, prims.full, (), head_dim, torch.float32, CPU)
    scaled = _call(g, prims.mul, size, float(factor))
    scale = _call(g, prims.sqrt, scaled)
    on_gpu = _call(g, prims.device_put, scale, GPU)
    out = _call(g, prims.div, x, _call(g, prims.broadcast_in_dim, on_gpu, (4, 8), ()))
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def _targets(gm):
    return [target_name(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_constant_scalar_is_made_on_the_device():
    gm = _attention_scale_graph()
    before = _targets(gm)
    folded = fold_device_constants(gm)
    assert "prims.device_put" in before and _targets(gm) == before  # the caller's graph is kept
    assert _targets(folded) == ["prims.full", "prims.broadcast_in_dim", "prims.div"]
    full = next(n for n in folded.graph.nodes if n.target is prims.full)
    shape, value, dtype, device = full.args
    assert shape == () and dtype == torch.float32 and device == GPU
    assert value == torch.sqrt(torch.tensor(64.0) * 3).item()
    assert math.isclose(value, math.sqrt(192), rel_tol=1e-7)
    assert str(full.meta[NODE_META_KEY].device) == "cuda"


def test_values_that_depend_on_inputs_stay_host_steps():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (4,), (1,), 0, "cuda")
    s = g.placeholder("s")  # a CPU scalar tensor argument
    s.meta[NODE_META_KEY] = TensorMeta(torch.float32, (), (), 0, "cpu")
    doubled = _call(g, prims.mul, s, 2.0)
    moved = _call(g, prims.device_put, doubled, GPU)
    g.output((_call(g, prims.mul, x, _call(g, prims.broadcast_in_dim, moved, (4,), ())),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert fold_device_constants(gm) is gm


def test_random_and_multi_element_values_stay():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (3,), (1,), 0, "cuda")
    ramp = _call(g, prims.iota, 3, 0, 1, torch.float32, CPU)  # three elements: not a scalar
    moved = _call(g, prims.device_put, ramp, GPU)
    g.output((_call(g, prims.add, x, moved),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert fold_device_constants(gm) is gm
