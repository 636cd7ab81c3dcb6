"""GraphIR of graphs with control flow: subgraphs (nested too) survive the JSON round trip and
still run; documents written before graphs carried subgraphs still load."""

import json
import operator

import pytest
import torch
import torch.fx as fx

import ember.ir as ir
from ember.ir import control_flow
from ember.ir.golden_examples import example_graph_ir
from ember.ir.schema import GOLDEN_DIR

META = ir.TensorMeta(torch.float32, (4,), (1,))

# The graph of golden/example_v1.json as written before GraphIR had `subgraphs`.
PRE_SUBGRAPHS_DOC = (
    '{"ir_version":1,"nodes":[{"args":{"tuple":[]},"kwargs":{"tuple":[]},"metas":[{"device":"cpu",'
    '"dtype":"float32","requires_grad":false,"sizes":[4],"storage_offset":0,"strides":[1]}],'
    '"name":"x","op":"placeholder","target":"x"},{"args":{"tuple":[{"node":"x"},0]},"kwargs":'
    '{"tuple":[]},"metas":[],"name":"y","op":"call_function","target":"getitem"},{"args":'
    '{"tuple":[{"node":"y"}]},"kwargs":{"tuple":[]},"metas":[],"name":"output","op":"output",'
    '"target":"output"}],"opset_version":1,"symbols":[]}'
)


def _graph(n_inputs, body):
    """A GraphModule of `n_inputs` placeholders whose output is `body(graph, placeholders)`;
    `body` may add subgraph attributes to the dict it is given."""
    g, attrs = fx.Graph(), {}
    ps = [g.placeholder(f"a{i}") for i in range(n_inputs)]
    for p in ps:
        p.meta[ir.NODE_META_KEY] = META
    g.output(body(g, ps, attrs))
    return fx.GraphModule(attrs, g)


def _pick(i):
    return _graph(2, lambda g, ps, attrs: (ps[i],))


def _swap_loop():
    """A while_loop carrying (flag, other) that swaps them while flag holds: one iteration from
    (True, False). Its bodies use getitem only, so ir alone runs it."""
    cond = _graph(2, lambda g, ps, attrs: (ps[0],))
    body = _graph(2, lambda g, ps, attrs: (ps[1], ps[0]))
    return cond, body


def _program():
    """x, y, p -> cond(p, true: while_loop(swap) over (p, ~p) then its x, false: y), and a map
    over x's rows: nested subgraphs three levels deep (graph > branch > loop bodies)."""
    loop_cond, loop_body = _swap_loop()

    def true_branch(g, ps, attrs):
        attrs.update(loop_cond=loop_cond, loop_body=loop_body)
        loop = g.call_function(control_flow.while_loop, (
            g.get_attr("loop_cond"), g.get_attr("loop_body"), [ps[2], ps[3]], []))  # fmt: skip
        flag = g.call_function(operator.getitem, (loop, 0))
        return (ps[0], flag)

    def main(g, ps, attrs):
        attrs.update(t=_graph(4, true_branch), f=_graph(4, lambda g, q, a: (q[1], q[3])),
                     row=_graph(1, lambda g, q, a: (q[0],)))  # fmt: skip
        c = g.call_function(control_flow.cond, (ps[2], g.get_attr("t"), g.get_attr("f"),
                                                [ps[0], ps[1], ps[2], ps[3]]))  # fmt: skip
        m = g.call_function(control_flow.map, (g.get_attr("row"), [ps[0]], []))
        return tuple(g.call_function(operator.getitem, (v, i)) for v, i in ((c, 0), (c, 1), (m, 0)))

    return _graph(4, main)


def _run(gm, pred):
    x, y = torch.arange(4.0), -torch.arange(4.0)
    return gm(x, y, torch.tensor(pred), torch.tensor(not pred))


def test_subgraphs_round_trip_through_json_and_run():
    gm = _program()
    doc = ir.graph_to_ir(gm)
    assert [s.name for s in doc.subgraphs] == ["t", "f", "row"]
    nested = dict((s.name, s.graph) for s in doc.subgraphs)["t"]
    assert [s.name for s in nested.subgraphs] == ["loop_cond", "loop_body"]
    back = ir.graph_from_ir(ir.loads(ir.GraphIR, ir.dumps(doc)))
    assert ir.graph_to_ir(back) == doc  # lossless, nested subgraphs included
    assert isinstance(back.t.loop_body, fx.GraphModule)
    for pred in (True, False):
        want, got = _run(gm, pred), _run(back, pred)
        assert len(got) == 3
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    x = torch.arange(4.0)
    torch.testing.assert_close(_run(back, True)[0], x)  # the true branch: x, and the loop's
    assert not bool(_run(back, True)[1])  # flag after one swap (True -> False)
    torch.testing.assert_close(_run(back, False)[0], -x)  # the false branch: y


def test_a_subgraph_named_twice_is_stored_once():
    doc = example_graph_ir()
    gm = ir.graph_from_ir(doc)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["branch"]
    assert ir.graph_to_ir(gm) == doc
    x = torch.randn(4)
    torch.testing.assert_close(gm(x, torch.tensor(True))[0], x)


def test_documents_without_subgraphs_still_load():
    doc = ir.from_json(ir.GraphIR, json.loads(PRE_SUBGRAPHS_DOC))
    assert doc.subgraphs == () and [n.name for n in doc.nodes] == ["x", "y", "output"]
    gm = ir.graph_from_ir(doc)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_function", "output"]
    # every released example's graph loads, and a graph without subgraphs writes none
    for path in sorted(GOLDEN_DIR.glob("example_v*.json")):
        graph = ir.from_json(ir.GraphIR, json.loads(path.read_text())["graph"])
        assert graph.ir_version in ir.READABLE_VERSIONS
        ir.graph_from_ir(graph)
    # and a graph without subgraphs is written as before (readers older than them read it)
    assert ir.graph_to_ir(gm) == doc
    assert ir.to_json(doc) == json.loads(PRE_SUBGRAPHS_DOC)
    assert "subgraphs" in ir.to_json(example_graph_ir())


def test_get_attr_of_a_tensor_is_refused():
    g = fx.Graph()
    g.output((g.get_attr("weight"),))
    gm = fx.GraphModule({"weight": torch.nn.Parameter(torch.ones(2))}, g)
    with pytest.raises(TypeError, match="get_attr weight names a Parameter, not a subgraph"):
        ir.graph_to_ir(gm)


def test_get_attr_of_a_missing_subgraph_is_refused():
    data = ir.to_json(example_graph_ir())
    data["subgraphs"] = []
    with pytest.raises(ValueError, match="get_attr branch names no subgraph"):
        ir.graph_from_ir(ir.from_json(ir.GraphIR, data))


def test_a_subgraph_named_twice_in_the_document_is_refused():
    data = ir.to_json(example_graph_ir())
    data["subgraphs"] = data["subgraphs"] * 2
    with pytest.raises(ValueError, match="subgraph branch appears twice"):
        ir.graph_from_ir(ir.from_json(ir.GraphIR, data))
