"""torch.cond, torch.while_loop and map end to end on CPU through aot_eager and inductor: both
branches across calls of one compiled graph, loops, maps, and gradients of the branch taken."""

import functorch.experimental.control_flow as control_flow
import pytest
import torch
import torch.nn as nn

import ember
from ember.inductor import compile_fx, pipeline

BACKENDS = ("aot_eager", "inductor")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


class Counting:
    """A backend that counts the graphs dynamo hands to the named one."""

    def __init__(self, name):
        self.name, self.graphs = name, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.name == "inductor":
            return compile_fx(gm, example_inputs)
        from ember.aot_autograd import aot_eager

        return aot_eager(gm, example_inputs)


def branchy(x, y):
    z = x * 2 + 1
    a, b = torch.cond(z.sum() > 0, lambda p, q: (p.sin() * q, p + q),
                      lambda p, q: (p.cos() - q, p * q), (z, y))  # fmt: skip
    return a.relu() + b


def branchy_ref(x, y):
    z = x * 2 + 1
    a, b = (z.sin() * y, z + y) if z.sum() > 0 else (z.cos() - y, z * y)
    return a.relu() + b


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_both_branches_one_compile(backend):
    counting = Counting(backend)
    f = ember.compile(branchy, backend=counting, fullgraph=True)
    y = torch.randn(8)
    for s in (1.0, -1.0, 1.0, -1.0):
        x = s * (torch.rand(8) + 1)
        torch.testing.assert_close(f(x, y), branchy_ref(x, y))
    assert counting.graphs == 1


def test_inductor_compiles_each_branch_as_its_own_program(monkeypatch):
    compiled = []
    real = pipeline.compile_prims

    def spy(gm, inputs, *args, **kwargs):
        compiled.append(gm)
        return real(gm, inputs, *args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_prims", spy)
    f = ember.compile(branchy, backend="inductor", fullgraph=True)
    y = torch.randn(8)
    for s in (1.0, -1.0):
        x = s * (torch.rand(8) + 1)
        torch.testing.assert_close(f(x, y), branchy_ref(x, y))
    # before the cond, the true branch, the false branch, after the cond (compiled at first use)
    assert len(compiled) == 4
    targets = [{getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes}
               for gm in compiled]  # fmt: skip
    assert any("sin" in t for t in targets) and any("cos" in t for t in targets)
    assert not any("sin" in t and "cos" in t for t in targets)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_backward_of_the_taken_branch(backend):
    f = ember.compile(branchy, backend=backend, fullgraph=True)
    for s in (1.0, -1.0):
        x0, y0 = s * (torch.rand(8) + 1), torch.randn(8)
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        f(x, y).pow(2).sum().backward()
        xr, yr = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        branchy_ref(xr, yr).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(y.grad, yr.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_module_parameters_get_gradients(backend):
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return torch.cond(x.mean() > 0, self.a, self.b, (x,)).tanh()

    m = M()
    f = ember.compile(m, backend=backend)
    for s in (1.0, -1.0):
        m.zero_grad()
        x = s * torch.ones(2, 4)
        f(x).sum().backward()
        taken, other = (m.a, m.b) if s > 0 else (m.b, m.a)
        expected = torch.autograd.grad(taken(x).tanh().sum(), taken.weight)[0]
        torch.testing.assert_close(taken.weight.grad, expected)
        assert other.weight.grad is None or not other.weight.grad.any()


def counting_loop(n, x):
    return torch.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a * 2 + 1),
                            (torch.zeros((), dtype=torch.int64), x))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_counts(backend):
    counting = Counting(backend)
    f = ember.compile(counting_loop, backend=counting, fullgraph=True)
    x = torch.randn(5)
    for n in (0, 1, 4):
        i, a = f(torch.tensor(n), x)
        expected = x.clone()
        for _ in range(n):
            expected = expected * 2 + 1
        assert int(i) == n
        torch.testing.assert_close(a, expected)
    assert counting.graphs == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_backward(backend):
    def f(n, x):
        return torch.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a.sin() * 2),
                                (torch.zeros((), dtype=torch.int64), x))[1]  # fmt: skip

    g = ember.compile(f, backend=backend, fullgraph=True)
    x0 = torch.randn(5)
    x, xr = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    g(torch.tensor(3), x).sum().backward()
    expected = xr
    for _ in range(3):
        expected = expected.sin() * 2
    expected.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_rows(backend):
    w = torch.randn(6)

    def f(xs, b):
        return control_flow.map(lambda x, b: (x * w + b).softmax(0), xs, b)

    g = ember.compile(f, backend=backend, fullgraph=True)
    xs0, b0 = torch.randn(4, 6), torch.randn(6)
    xs, b = xs0.clone().requires_grad_(), b0.clone().requires_grad_()
    out = g(xs, b)
    xr, br = xs0.clone().requires_grad_(), b0.clone().requires_grad_()
    expected = torch.stack([(x * w + br).softmax(0) for x in xr])
    torch.testing.assert_close(out, expected)
    (out * expected.detach()).sum().backward()
    (expected * expected.detach()).sum().backward()
    torch.testing.assert_close(xs.grad, xr.grad)
    torch.testing.assert_close(b.grad, br.grad)


def test_export_lowers_branches_and_loops_to_prim_subgraphs():
    def f(x, y):
        a = torch.cond(x.sum() > 0, lambda p, q: p.sin() + q, lambda p, q: p.cos() * q, (x, y))
        _, b = torch.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2),
                                (torch.zeros((), dtype=torch.int64), a))  # fmt: skip
        return a + 1, b

    y = torch.randn(4)
    ep = ember.export(f, (torch.randn(4), y))
    gm = ep.graph_module
    subgraphs = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(subgraphs) == 4  # two branches, a loop's condition and body
    for sub in subgraphs:  # every subgraph is a prim graph too
        targets = [n.target for n in sub.graph.nodes if n.op == "call_function"]
        assert targets and all(ember.ir.target_name(t).startswith("prims.") for t in targets)
    for s in (1.0, -1.0):
        x = s * (torch.rand(4) + 0.5)
        a = x.sin() + y if s > 0 else x.cos() * y
        got = ep(x, y)
        torch.testing.assert_close(got[0], a + 1)
        torch.testing.assert_close(got[1], a * 8)
    # saving keeps the subgraphs (tests/test_control_flow_save.py loads and runs them)
    assert len(ep.graph_ir.subgraphs) == 4


def test_compile_prims_runs_an_exported_program_with_control_flow():
    def f(x):
        a = torch.cond(x.sum() > 0, lambda p: p.sin() * 2, lambda p: p.cos() - 1, (x,))
        return torch.while_loop(lambda v: v.abs().sum() < 100, lambda v: (v * 3 + 1,), (a,))

    ep = ember.export(f, (torch.randn(4),))
    compiled = pipeline.compile_prims(ep.graph_module, [torch.randn(4)])
    assert [step.kind for step in compiled.steps] == ["piece", "cond", "while_loop"]
    for s in (1.0, -1.0):
        x = s * (torch.rand(4) + 0.5)
        v = x.sin() * 2 if s > 0 else x.cos() - 1
        while v.abs().sum() < 100:
            v = v * 3 + 1
        torch.testing.assert_close(compiled(x)[0], v)


def test_packaging_a_program_with_control_flow_is_refused_clearly(tmp_path):
    from ember import cpp_wrapper

    ep = ember.export(lambda x: torch.cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (x,)),
                      (torch.randn(4),))  # fmt: skip
    with pytest.raises(NotImplementedError, match="control flow.*C\\+\\+ wrapper cannot"):
        cpp_wrapper.package(ep, tmp_path / "pkg")


def sized_branches(x, w):
    n = x.shape[0]  # lifted into the true branch as a size
    return torch.cond(x.sum() > 0, lambda x, w: (x * w).sin().reshape(n, 1),
                      lambda x, w: (x.cos() * w.sum()).reshape(x.shape[0], 1), (x, w))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_sizes_compile_one_symbolic_graph_with_gradients(backend):
    """A stream of sizes: static, then one symbolic graph (both branches) for every later size,
    forward and gradients as eager."""
    from ember.dynamo import convert

    g0 = len(convert.stats.graphs)
    f = ember.compile(sized_branches, backend=backend, fullgraph=True)
    for n in (3, 4, 6, 9):
        for s in (1.0, -1.0):
            x = (s * (torch.rand(n) + 0.1)).requires_grad_()
            _same_values_and_gradients(f, sized_branches, x, torch.randn(n, requires_grad=True))
    graphs = convert.stats.graphs[g0:]
    assert len(graphs) == 2 and graphs[1].gm.meta["ember_symbols"]


def size_predicate(x, w):
    return torch.cond(x.shape[0] > 4, lambda x, w: (x * w).sin(), lambda x, w: x.cos() * w,
                      (x, w))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_predicate_is_one_graph_for_every_size(backend):
    """x.shape[0] > 4 under dynamic sizes: the comparison is a node of the graph, both branches
    compiled, one graph for sizes on either side; gradients as eager."""
    from ember.dynamo import convert

    g0 = len(convert.stats.graphs)
    f = ember.compile(size_predicate, backend=backend, dynamic=True, fullgraph=True)
    for n in (3, 6, 2, 9, 4, 5):
        x, w = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
        _same_values_and_gradients(f, size_predicate, x, w)
    assert len(convert.stats.graphs) - g0 == 1


def _same_values_and_gradients(compiled, eager, x, w):
    """compiled(x, w) against eager on copies: the values, and the gradients of x and w."""
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    got, expected = compiled(x, w), eager(xe, we)
    torch.testing.assert_close(got, expected)
    got.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(w.grad, we.grad)
