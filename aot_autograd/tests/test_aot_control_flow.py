"""Graphs with control.* nodes: split into pieces and subgraphs, each compiled, run in order;
gradients of the branch taken; export lowering keeps prim subgraphs."""

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from ember.aot_autograd import aot_eager, export_inference_graph, run_as_fx
from ember.aot_autograd.control_flow import has_control_flow, plan
from ember.ir import control_flow as cf


def _tuple_module(fn):
    return fx.symbolic_trace(fn)


def cond_graph() -> fx.GraphModule:
    """x, w -> cond(sum(x) > 0, (sin(x) * w,), (cos(x) - w,)) [0] * 2"""
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    pred = g.call_function(operator.gt, (g.call_function(torch.sum, (x,)), 0))
    node = g.call_function(cf.cond, (pred, g.get_attr("yes"), g.get_attr("no"), (x, w)))
    out = g.call_function(torch.mul, (g.call_function(operator.getitem, (node, 0)), 2))
    g.output((out,))
    root = nn.Module()
    root.yes = _tuple_module(lambda a, b: (a.sin() * b,))
    root.no = _tuple_module(lambda a, b: (a.cos() - b,))
    return fx.GraphModule(root, g)


def reference(x, w):
    return ((x.sin() * w) if x.sum() > 0 else (x.cos() - w)) * 2


def test_plan_splits_at_the_control_flow_node():
    gm = cond_graph()
    assert has_control_flow(gm)
    assert [kind for kind, _ in plan(gm)] == ["piece", "control", "piece"]


def test_a_training_graphs_pieces_are_training_graphs_and_name_no_input_updates():
    """A piece is compiled as the whole is (a training graph's layouts), but the whole's record
    of which outputs update which inputs names the whole's outputs, not the piece's."""
    from ember.ir import INPUT_UPDATES_META_KEY

    gm = cond_graph()
    gm.meta.update({"ember_training": True, INPUT_UPDATES_META_KEY: {0: 0}})
    from ember.aot_autograd.control_flow import _piece_module

    pieces = [_piece_module(gm, nodes)[2] for kind, nodes in plan(gm) if kind == "piece"]
    assert len(pieces) == 2
    for piece in pieces:
        assert piece.meta.get("ember_training") is True
        assert INPUT_UPDATES_META_KEY not in piece.meta


def test_both_branches_run_compiled():
    compiled = []

    def counting(gm, inputs):
        compiled.append(gm)
        return run_as_fx(gm, inputs)

    gm = cond_graph()
    run = aot_eager(gm, [torch.randn(4), torch.randn(4)], fw_compiler=counting)
    assert [step.kind for step in run.steps] == ["piece", "cond", "piece"]
    w = torch.randn(4)
    for s in (1.0, -1.0):
        x = s * (torch.rand(4) + 0.5)
        torch.testing.assert_close(run(x, w)[0], reference(x, w))
    assert len(compiled) == 4  # before, true branch, false branch, after


def test_gradients_of_the_branch_taken():
    run = aot_eager(cond_graph(), [torch.randn(4), torch.randn(4)])
    for s in (1.0, -1.0):
        x0, w0 = s * (torch.rand(4) + 0.5), torch.randn(4)
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        run(x, w)[0].sum().backward()
        xr, wr = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        reference(xr, wr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(w.grad, wr.grad)


def test_the_op_refuses_to_be_traced_whole():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    gm = cond_graph()
    with Mode(), pytest.raises(NotImplementedError, match="dispatch tracer"):
        gm(torch.randn(4), torch.randn(4))


def test_export_keeps_prim_subgraphs():
    gm = cond_graph()
    x, w = torch.rand(4) + 0.5, torch.randn(4)
    prim, consts = export_inference_graph(gm, [x, w], {}, ["x", "w"])
    assert consts == {}
    assert [n.name for n in prim.graph.nodes if n.op == "placeholder"] == ["x", "w"]
    (node,) = [n for n in prim.graph.nodes if n.op == "call_function" and n.target is cf.cond]
    for s in (1.0, -1.0):
        torch.testing.assert_close(prim(s * x, w)[0], reference(s * x, w))
