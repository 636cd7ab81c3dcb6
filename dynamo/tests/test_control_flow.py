"""torch.cond, torch.while_loop and map captured as one graph: subgraphs, lifted closures, guards,
side effects and mismatched branches (eager references are written as plain Python)."""

import operator

import functorch.experimental.control_flow as control_flow
import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import ember
from ember.dynamo import CompileCounter, GraphBreakError, convert
from ember.ir import NODE_META_KEY
from ember.ir import control_flow as cf_ops


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def _cf_nodes(gm, op):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def sin_or_cos(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


def test_issue_example_is_one_graph_without_breaks():
    out = ember.explain(sin_or_cos)(torch.randn(4))
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    assert "cond" in out.ops_per_graph[0]
    assert any("cond is <function cond>" in str(g) for g in out.out_guards)  # identity guarded


def test_cond_takes_both_branches_without_recompiling():
    cnt = CompileCounter()
    f = ember.compile(sin_or_cos, backend=cnt)
    for x in (torch.rand(5) + 0.1, -torch.rand(5) - 0.1, torch.rand(5) + 0.1):
        expected = x.sin() if x.sum() > 0 else x.cos()
        torch.testing.assert_close(f(x), expected)
    assert cnt.frame_count == 1
    gm = cnt.graphs[0]
    (node,) = _cf_nodes(gm, cf_ops.cond)
    t_gm, f_gm = (getattr(gm, a.target) for a in node.args[1:3])
    assert isinstance(t_gm, fx.GraphModule) and isinstance(f_gm, fx.GraphModule)
    assert [n.target for n in t_gm.graph.nodes if n.op == "call_method"] == ["sin"]
    assert [n.target for n in f_gm.graph.nodes if n.op == "call_method"] == ["cos"]


def test_closures_become_subgraph_inputs_and_structures_are_kept():
    bias = torch.randn(3)

    def f(x, y):
        def yes(a):
            return a * y + bias, [a.sum()]

        def no(a):
            return a - y, [a.mean()]

        return torch.cond(x[0] > 0, yes, no, (x,))

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    y = torch.randn(3)
    for s in (1.0, -1.0):
        x = s * (torch.rand(3) + 0.5)
        out, (red,) = g(x, y)
        exp = (x * y + bias, x.sum()) if s > 0 else (x - y, x.mean())
        torch.testing.assert_close(out, exp[0])
        torch.testing.assert_close(red, exp[1])
    assert cnt.frame_count == 1
    gm = cnt.graphs[0]
    (node,) = _cf_nodes(gm, cf_ops.cond)
    assert len(node.args[3]) == 3  # x, then the lifted y and bias
    for attr in node.args[1:3]:  # both branches take the same inputs (unused ones included)
        sub = getattr(gm, attr.target)
        assert len([n for n in sub.graph.nodes if n.op == "placeholder"]) == 3


def test_python_predicate_takes_the_branch_and_guards_it():
    cnt = CompileCounter()

    def f(x, flag):
        return torch.cond(flag, lambda x: x + 1, lambda x: x - 1, (x,))

    g = ember.compile(f, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(g(x, True), x + 1)
    torch.testing.assert_close(g(x, True), x + 1)
    assert cnt.frame_count == 1
    assert not _cf_nodes(cnt.graphs[0], cf_ops.cond)  # decided at trace time
    torch.testing.assert_close(g(x, False), x - 1)
    assert cnt.frame_count == 2  # the guard on flag failed: the other branch compiled


def test_size_predicate_is_decided_and_guarded():
    cnt = CompileCounter()
    g = ember.compile(lambda x: torch.cond(x.shape[0] > 4, lambda x: x * 2, lambda x: x / 2, (x,)),
                      backend=cnt)  # fmt: skip
    torch.testing.assert_close(g(torch.ones(8)), torch.full((8,), 2.0))
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 0.5))
    assert cnt.frame_count == 2


def test_module_branches_lift_parameters():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return torch.cond(x.mean() > 0, self.a, self.b, (x,)).relu()

    m, cnt = M(), CompileCounter()
    g = ember.compile(m, backend=cnt)
    for s in (1, -1):
        x = s * torch.ones(2, 4)
        torch.testing.assert_close(g(x), (m.a(x) if s > 0 else m.b(x)).relu())
    assert cnt.frame_count == 1


def test_nested_cond():
    def f(x, y):
        def outer_true(a, b):
            return torch.cond(b.sum() > 0, lambda p, q: p + q, lambda p, q: p - q, (a, b))

        return torch.cond(x.sum() > 0, outer_true, lambda a, b: a * b, (x, y))

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    for sx in (1, -1):
        for sy in (1, -1):
            x, y = sx * torch.ones(3), sy * 2 * torch.ones(3)
            exp = ((x + y) if sy > 0 else (x - y)) if sx > 0 else x * y
            torch.testing.assert_close(g(x, y), exp)
    assert cnt.frame_count == 1


def test_backward_through_cond_eager_backend():
    g = ember.compile(sin_or_cos, backend="eager")
    for s in (1, -1):
        x = (s * (torch.rand(4) + 0.1)).requires_grad_()
        g(x).sum().backward()
        expected = x.detach().cos() if s > 0 else -x.detach().sin()
        torch.testing.assert_close(x.grad, expected)


def test_side_effect_in_a_branch_names_its_line():
    seen = []

    def f(x):
        def yes(a):
            seen.append(1)  # the offending line
            return a + 1

        return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))

    line = f.__code__.co_firstlineno + 2
    with pytest.raises(GraphBreakError, match=rf"side effect.*true branch.*{__file__}:{line}"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    assert seen == []


def test_global_write_in_a_branch_is_refused():
    def f(x):
        def yes(a):
            global _WRITTEN
            _WRITTEN = 1
            return a + 1

        return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))

    with pytest.raises(GraphBreakError, match="side effect.*global"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))


def test_mismatched_branches_are_refused():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a[:2] + 1, (x,))

    with pytest.raises(GraphBreakError, match=r"output 0 differs.*float32\[4\].*float32\[2\]"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(4))


def test_while_loop_counts():
    def f(n, x):
        return torch.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a * 2 + 1),
                                (torch.zeros((), dtype=torch.int64), x))  # fmt: skip

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    x = torch.ones(3)
    for n in (0, 3, 5):
        i, a = g(torch.tensor(n), x)
        exp = x.clone()
        for _ in range(n):
            exp = exp * 2 + 1
        assert int(i) == n
        torch.testing.assert_close(a, exp)
    assert cnt.frame_count == 1
    (node,) = _cf_nodes(cnt.graphs[0], cf_ops.while_loop)
    assert len(node.args[3]) == 1  # n, read by cond_fn, lifted


def test_while_loop_body_must_keep_metadata():
    def f(x):
        return torch.while_loop(lambda a: a.sum() < 10, lambda a: (a.double(),), (x,))

    with pytest.raises(GraphBreakError, match="output 0 differs"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))


def test_map_over_leading_dimension():
    w = torch.randn(3)

    def f(xs, b):
        return control_flow.map(lambda x, b: (x * w + b).sum(), xs, b)

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    xs, b = torch.randn(5, 3), torch.randn(3)
    torch.testing.assert_close(g(xs, b), torch.stack([(x * w + b).sum() for x in xs]))
    assert cnt.frame_count == 1 and _cf_nodes(cnt.graphs[0], cf_ops.map)


def test_export_captures_one_graph_with_subgraphs(monkeypatch):
    from ember.dynamo import export_capture

    class Captured(Exception):
        pass

    def lowering(gm, tensors, constants, names):  # stands in for ember.aot_autograd's
        raise Captured(gm)

    monkeypatch.setattr(export_capture, "resolve_entry", lambda name: lowering)
    with pytest.raises(Captured) as info:
        ember.export(sin_or_cos, (torch.randn(4),))
    gm = info.value.args[0]
    (node,) = _cf_nodes(gm, cf_ops.cond)
    assert all(isinstance(getattr(gm, a.target), fx.GraphModule) for a in node.args[1:3])
    for s in (1, -1):
        x = s * torch.ones(4)
        torch.testing.assert_close(gm(x)[0], x.sin() if s > 0 else x.cos())


def test_dynamic_sizes_cross_into_the_subgraphs():
    cnt = CompileCounter(dynamic=True)
    g = ember.compile(sin_or_cos, backend=cnt, dynamic=True)
    for n in (5, 3, 7, 12):
        for s in (1, -1):
            x = s * (torch.rand(n) + 0.1)
            torch.testing.assert_close(g(x), x.sin() if s > 0 else x.cos())
    assert cnt.frame_count == 1  # one graph, both branches, every size
    gm = cnt.graphs[0]
    (s0,) = gm.meta["ember_symbols"]
    (node,) = _cf_nodes(gm, cf_ops.cond)
    for branch in node.args[1:3]:
        (ph,) = [n for n in getattr(gm, branch.target).graph.nodes if n.op == "placeholder"]
        assert [str(e) for e in ph.meta[NODE_META_KEY].sizes] == [s0.name]


def sizes_inside_and_outside(x, y):
    n = x.shape[0]  # a size of the enclosing code: lifted into the branch that reads it

    def true_fn(x, y):
        return (x.reshape(n, -1) + y[:n]).sum(0)

    def false_fn(x, y):
        return x.reshape(x.shape[0], -1).mean(0) * y.shape[0]  # sizes read in the body

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y))


def test_sizes_read_in_a_branch_or_lifted_into_it_stay_symbolic():
    cnt = CompileCounter(dynamic=True)
    g = ember.compile(sizes_inside_and_outside, backend=cnt)
    for n in (3, 4, 6, 9):  # static, then dynamic (automatic)
        for s in (1, -1):
            x, y = s * (torch.rand(n, 3) + 0.1), torch.randn(n + 2, 3)
            torch.testing.assert_close(g(x, y), sizes_inside_and_outside(x, y))
    assert cnt.frame_count == 2 and len(cnt.graphs[1].meta["ember_symbols"]) == 2
    (node,) = _cf_nodes(cnt.graphs[1], cf_ops.cond)
    lifted = node.args[3][2:]
    assert [(n.op, n.target) for n in lifted] == [("call_method", "size")]


def test_while_loop_and_map_take_dynamic_sizes():
    def loop(x):
        i = torch.zeros((), dtype=torch.int64)
        return torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2 + x.shape[0]),
                                (i, x))  # fmt: skip

    def rows(xs, b):
        return control_flow.map(lambda r, b: (r * b).sum() + r.shape[0], xs, b)

    for fn, make in ((loop, lambda n: (torch.randn(n, 2),)),
                     (rows, lambda n: (torch.randn(n, 3), torch.randn(3)))):  # fmt: skip
        ember.reset()
        cnt = CompileCounter(dynamic=True)
        g = ember.compile(fn, backend=cnt, dynamic=True)
        for n in (3, 5, 8):
            args = make(n)
            torch.testing.assert_close(g(*args), fn(*args))
        assert cnt.frame_count == 1 and cnt.graphs[0].meta["ember_symbols"]


def test_a_size_predicate_keeps_both_branches_under_dynamic_sizes():
    def f(x):
        return torch.cond(x.shape[0] > 4, lambda x: x.sin(), lambda x: x.cos() * 2, (x,))

    cnt = CompileCounter(dynamic=True)
    g = ember.compile(f, backend=cnt, dynamic=True)
    for n in (3, 4, 5, 6, 9, 2):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), x.sin() if n > 4 else x.cos() * 2)
    assert cnt.frame_count == 1  # the predicate is a graph value: one graph for every size
    gm = cnt.graphs[0]
    (node,) = _cf_nodes(gm, cf_ops.cond)
    assert node.args[0].target is operator.gt
    assert node.args[0].args[0].target == "size" and node.args[0].args[1] == 4


def test_a_size_predicate_read_again_is_guarded():
    def f(x):
        p = x.shape[0] > 4
        y = torch.cond(p, lambda x: x.sin(), lambda x: x.cos(), (x,))
        return y * 3 if p else y  # a Python decision on p: the graph holds for one side only

    cnt = CompileCounter(dynamic=True)
    g = ember.compile(f, backend=cnt, dynamic=True)
    for n in (3, 6, 2, 9, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2


def test_a_size_predicate_whose_branch_cannot_be_traced_at_this_size_is_decided():
    def f(x):
        # the true branch reads x[4]: at a size of 3 it cannot be traced, so that compile decides
        # the predicate (guarded); a compile at a size above 4 captures both branches
        return torch.cond(x.shape[0] > 4, lambda x: x * x[4], lambda x: x.cos(), (x,))

    cnt = CompileCounter(dynamic=True)
    g = ember.compile(f, backend=cnt, dynamic=True)
    g0 = len(convert.stats.graphs)
    for n in (3, 6, 2, 9, 4):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), x * x[4] if n > 4 else x.cos())
    assert cnt.frame_count == 2
    decided, both = convert.stats.graphs[g0:]
    assert "sizes: _slot0 <= 4" in decided.guards and not _cf_nodes(decided.gm, cf_ops.cond)
    assert len(_cf_nodes(both.gm, cf_ops.cond)) == 1


def test_changing_a_local_list_in_a_branch_is_refused():
    def f(x):
        found = []

        def yes(a):
            found.append(a)
            return a + 1

        out = torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))
        return out, len(found)

    line = f.__code__.co_firstlineno + 4
    with pytest.raises(GraphBreakError, match=rf"side effect.*list.*true branch.*:{line}"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))


def test_a_list_made_inside_a_branch_may_change():
    def f(x):
        def yes(a):
            parts = []
            for k in range(3):
                parts.append(a * k)
            return sum(parts)

        return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))
    torch.testing.assert_close(g(-torch.ones(2)), torch.full((2,), -2.0))
    assert cnt.frame_count == 1


def test_rebinding_an_enclosing_variable_is_refused():
    def f(x):
        count = 0

        def yes(a):
            nonlocal count
            count = 1
            return a + 1

        return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,)), count

    with pytest.raises(GraphBreakError, match="side effect.*rebinding"):
        ember.compile(f, backend="eager", fullgraph=True)(torch.ones(2))


def test_attribute_write_in_a_branch_names_its_line():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            def yes(a):
                self.calls = 1  # the offending line
                return a + 1

            return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))

    line = M.forward.__code__.co_firstlineno + 2
    with pytest.raises(GraphBreakError, match=rf"side effect.*{__file__}:{line}"):
        ember.compile(M(), backend="eager", fullgraph=True)(torch.ones(2))


def test_operands_may_be_pytrees():
    def f(x, y):
        def yes(a, d):
            return a + d["w"][0] * d["k"]

        def no(a, d):
            return a - d["w"][1]

        return torch.cond(x.sum() > 0, yes, no, (x, {"w": (y, y * 2), "k": 3}))

    cnt = CompileCounter()
    g = ember.compile(f, backend=cnt, fullgraph=True)
    y = torch.randn(3)
    for s in (1.0, -1.0):
        x = s * torch.ones(3)
        torch.testing.assert_close(g(x, y), x + y * 3 if s > 0 else x - y * 2)
    assert cnt.frame_count == 1
