"""Custom autograd.Functions and checkpoint in one graph: gradients against eager, the user's own
backward kept, class identity guarded, what cannot be traced breaking the graph at its line."""

import copy
import re

import pytest
import torch
import torch.utils.checkpoint as checkpoint

import corpus.autograd_functions as cases
import ember
from corpus import CASES
from ember.dynamo import CompileCounter, GraphBreakError, convert
from ember.dynamo.functional_apply import AutogradFunctionCall
from ember.ir import RECOMPUTE_META_KEY, WRITTEN_AFTER_CALL_META_KEY

CORPUS = [c for c in CASES if c.name.startswith("autograd_functions.")]


def _grads(fn, inputs):
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs) if o.requires_grad)
    loss.backward()
    return outs, [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def _fresh(case):
    torch.manual_seed(0)
    return case.inputs()


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_gradients_match_eager_in_one_graph(case):
    ember.reset()
    cnt = CompileCounter()
    breaks0 = len(convert.stats.breaks)
    expected_out, expected = _grads(case.fn, _fresh(case))
    got_out, got = _grads(ember.compile(case.fn, backend=cnt), _fresh(case))
    for g, e in zip(got_out, expected_out):
        torch.testing.assert_close(g, e)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert cnt.frame_count == 1 and len(convert.stats.breaks) == breaks0


def test_the_function_is_one_node_and_its_backward_is_the_users():
    cnt = CompileCounter()
    x = torch.randn(6, requires_grad=True)
    ember.compile(cases.wrong_by_design_backward, backend=cnt, fullgraph=True)(x).backward()
    # DoubledGrad's backward returns twice d(x*x)/dx: the graph must not derive its own
    torch.testing.assert_close(x.grad, 4 * x.detach())
    (gm,) = cnt.graphs
    calls = [n for n in gm.graph.nodes if isinstance(n.target, AutogradFunctionCall)]
    assert len(calls) == 1 and calls[0].target.cls is cases.DoubledGrad
    assert not any(n.target is torch.mul or n.target == "mul" for n in gm.graph.nodes)


class _Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


class _TripleWrongGrad(_Triple):
    @staticmethod
    def backward(ctx, g):
        return g * 30


FN = _Triple


def _uses_global_class(x):
    return FN.apply(x).sum()


def test_the_class_is_guarded_by_identity():
    global FN
    cnt = CompileCounter()
    f = ember.compile(_uses_global_class, backend=cnt)
    x = torch.randn(3, requires_grad=True)
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))
    FN = _TripleWrongGrad
    try:
        x.grad = None
        f(x).backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 30.0))
    finally:
        FN = _Triple
    assert cnt.frame_count == 2


class _BackwardReadsData(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if g.sum() > 0:  # a branch on tensor data: cannot be one graph
            return g
        return -g


class _ForwardReadsGlobalTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * _TABLE

    @staticmethod
    def backward(ctx, g):
        return g * _TABLE


_MarksDirty = cases.DoubleInPlace  # x.mul_(2), marked dirty; backward g * 2


class _CallsAnotherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return cases.StraightThrough.apply(x) * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


_TABLE = torch.arange(4.0)


@pytest.mark.parametrize("cls, reason", [
    (_BackwardReadsData, "data-dependent branch"),
    (_ForwardReadsGlobalTensor, "reads a tensor that is not one of its arguments"),
    (_CallsAnotherFunction, "called inside a custom autograd.Function's forward"),
])  # fmt: skip
def test_what_cannot_be_traced_breaks_the_graph_and_runs_eagerly(cls, reason):
    def f(x):
        return cls.apply(x * 1.0) + 1

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(GraphBreakError, match=reason):
        ember.compile(f, backend="eager", fullgraph=True)(x)
    explained = ember.explain(f)(x)
    assert explained.graph_break_count >= 1
    assert any(reason in b.reason for b in explained.break_reasons)
    assert any(__file__ in b.where for b in explained.break_reasons)
    expected, = torch.autograd.grad(f(x).sum(), x)
    got, = torch.autograd.grad(ember.compile(f, backend="eager")(x).sum(), x)
    torch.testing.assert_close(got, expected)


def _written_in_the_frame(w):
    y = w * 3  # needs grad, not a leaf
    out = _MarksDirty.apply(y)
    return out is y, out, (y * w).sum()


def test_mark_dirty_is_one_graph_that_writes_the_tensor_and_returns_it():
    cnt = CompileCounter()
    w = torch.randn(4, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    same, out, loss = ember.compile(_written_in_the_frame, backend=cnt, fullgraph=True)(w)
    e_same, e_out, e_loss = _written_in_the_frame(we)
    assert same and e_same  # eager's apply returns the input itself
    torch.testing.assert_close(out, e_out)
    torch.testing.assert_close(loss, e_loss)
    (loss + out.sum()).backward()
    (e_loss + e_out.sum()).backward()
    torch.testing.assert_close(w.grad, we.grad)  # through _MarksDirty's backward (g * 2)
    (gm,) = cnt.graphs
    calls = [n for n in gm.graph.nodes if isinstance(n.target, AutogradFunctionCall)]
    assert len(calls) == 1 and calls[0].target.dirty == (0,)
    # the node never writes its argument: the frame's tensor takes the node's result
    assert not any(n.target in ("copy_", "mul_") for n in gm.graph.nodes)


def _written_without_gradients(x):
    out = _MarksDirty.apply(x)
    return out is x, out


def test_mark_dirty_without_gradients_writes_the_callers_tensor_as_eager():
    cnt = CompileCounter()
    f = ember.compile(_written_without_gradients, backend=cnt, fullgraph=True)
    x = torch.randn(4)
    xe = x.clone()
    (same, out), (e_same, e_out) = f(x), _written_without_gradients(xe)
    assert same and e_same  # no input needs grad: the input itself comes back
    torch.testing.assert_close(x, xe)  # the caller's tensor was written
    w = torch.randn(4, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    with torch.no_grad():
        (same, out), (e_same, e_out) = f(w), _written_without_gradients(we)
    # grad mode off, the input requires grad: eager gives back a detached alias of it
    assert not same and not e_same and not out.requires_grad and not e_out.requires_grad
    assert out.data_ptr() == w.data_ptr()
    torch.testing.assert_close(w, we)
    assert cnt.frame_count == 2
    for gm in cnt.graphs:
        assert not any(isinstance(n.target, AutogradFunctionCall) for n in gm.graph.nodes)


def _written_frame_input(y, w):
    out = _MarksDirty.apply(y)  # y: the caller's tensor, needing grad, not a leaf
    return out is y, out * w, y


def test_mark_dirty_of_a_frame_input_writes_the_callers_tensor_after_the_graph():
    cnt = CompileCounter()
    f = ember.compile(_written_frame_input, backend=cnt, fullgraph=True)
    w = torch.randn(4, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    y, ye = w * 3, we * 3
    same, out, back = f(y, w)
    e_same, e_out, e_back = _written_frame_input(ye, we)
    assert same and e_same and back is y and e_back is ye  # the caller's own tensor comes back
    torch.testing.assert_close(y, ye)  # written, as eager writes it
    torch.testing.assert_close(out, e_out)
    (out.sum() + (y * y).sum()).backward()  # y's new history reaches w through the user's backward
    (e_out.sum() + (ye * ye).sum()).backward()
    torch.testing.assert_close(w.grad, we.grad)
    (gm,) = cnt.graphs
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name == "l_y"]
    assert placeholder.meta[WRITTEN_AFTER_CALL_META_KEY]
    # leafness is not guarded: a leaf that requires grad gets eager's error, naming apply's line
    with pytest.raises(RuntimeError, match=r"requires grad .*autograd_functions\.py:\d+"):
        f(torch.randn(4, requires_grad=True), w)
    assert cnt.frame_count == 1


def _frame_input_written_twice(y, w):
    _MarksDirty.apply(y)
    z = y + w
    return _MarksDirty.apply(y) * z


def test_a_frame_input_written_twice_ends_with_the_second_value():
    examples = []

    def backend(gm, example_inputs):
        examples.extend(t.detach().clone() for t in example_inputs)
        return gm.forward

    w = torch.randn(4, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    y, ye = w * 3, we * 3
    given = y.detach().clone()
    out = ember.compile(_frame_input_written_twice, backend=backend, fullgraph=True)(y, w)
    e_out = _frame_input_written_twice(ye, we)
    torch.testing.assert_close(examples[0], given)  # the backend saw the input, not its new value
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(out, e_out)
    (out.sum() + y.sum()).backward()
    (e_out.sum() + ye.sum()).backward()
    torch.testing.assert_close(w.grad, we.grad)


class _DirtyNotReturned(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x * 1

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _DirtyNonDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        ctx.mark_non_differentiable(x)
        return x * 2, x

    @staticmethod
    def backward(ctx, g, g_x):
        return g * 2


def _mark(ctx, x):
    ctx.mark_dirty(x)


class _MarksDirtyInAHelper(_MarksDirty):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        _mark(ctx, x)
        return x


def _leaf_made_in_the_frame(w):
    t = torch.ones(4, requires_grad=True)
    return _MarksDirty.apply(t) * w


def _view_of_a_frame_tensor(w):
    y = w * 3
    _MarksDirty.apply(y[1:3])
    return (y * w).sum()


def _in_place_result_still_held(w):
    y = w * 3
    z = y.mul_(2)  # z is y: the write must reach it too
    _MarksDirty.apply(y)
    return z * 1


def _frame_input_viewed(y):
    v = y[0:2]
    _MarksDirty.apply(y)  # v must see the write
    return v * 1


def _detached_alias_of_a_tensor_needing_grad(w):
    y = w * 3
    _, running = cases.ScaleAndTrackMax.apply(w, y.detach())  # writes y's memory
    return running, y


def _non_differentiable_needing_grad(w):
    y = w * 3
    a, b = _DirtyNonDifferentiable.apply(y)
    return a.sum() + (y * y).sum(), b


@pytest.mark.parametrize("fn, make_input, reason", [
    (_MarksDirty.apply, lambda: torch.randn(4, requires_grad=True), "leaf Variable that requires"),
    (_leaf_made_in_the_frame, lambda: torch.randn(4, requires_grad=True), "leaf Variable"),
    (lambda t: _MarksDirty.apply(t[1:]), lambda: torch.randn(4, requires_grad=True) * 2,
     "a view of an input of the compiled frame"),
    (_DirtyNotReturned.apply, lambda: torch.randn(4, requires_grad=True) * 2, "not returned"),
    (_view_of_a_frame_tensor, lambda: torch.randn(4, requires_grad=True), "a view"),
    (_non_differentiable_needing_grad, lambda: torch.randn(4, requires_grad=True),
     "non-differentiable while it requires grad"),
    (lambda t: cases.ScaleAndTrackMax.apply(t, t), lambda: torch.randn(4, requires_grad=True) * 2,
     "another argument shares its memory"),
    (lambda t: _MarksDirtyInAHelper.apply(t * 1), lambda: torch.randn(4, requires_grad=True),
     "from a function its forward calls"),
    (_in_place_result_still_held, lambda: torch.randn(4, requires_grad=True), "other tensors view"),
    (_frame_input_viewed, lambda: torch.randn(4, requires_grad=True) * 2, "other tensors view"),
    (_detached_alias_of_a_tensor_needing_grad, lambda: torch.randn(4, requires_grad=True),
     "sharing memory with one that requires grad"),
])  # fmt: skip
def test_mark_dirty_that_cannot_be_one_graph_runs_eagerly_at_the_users_line(fn, make_input,
                                                                           reason):
    ember.reset()  # f's code is the same for every case: each must compile afresh

    def f(t):
        return fn(t)

    def fresh():
        torch.manual_seed(0)
        return make_input()

    with pytest.raises(GraphBreakError, match=reason):
        ember.compile(f, backend="eager", fullgraph=True)(fresh())
    breaks0 = len(convert.stats.breaks)
    try:
        expected = f(fresh())
    except RuntimeError as e:  # eager refuses it: the compiled call raises the same error
        with pytest.raises(RuntimeError, match=re.escape(str(e))):
            ember.compile(f, backend="eager")(fresh())
    else:
        got = ember.compile(f, backend="eager")(fresh())
        assert str(got) == str(expected)  # values, `is` answers and grad_fn names
    breaks = convert.stats.breaks[breaks0:]
    assert any(reason in b.reason and __file__ in b.where for b in breaks)


def test_checkpointed_nodes_are_tagged_for_recomputation():
    cnt = CompileCounter()

    def f(x, w):
        h = x.sin()
        return checkpoint.checkpoint(lambda t: (t @ w).tanh(), h, use_reentrant=False).sum()

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    ember.compile(f, backend=cnt, fullgraph=True)(x, w)
    tagged = {str(n.target) for n in cnt.graphs[0].graph.nodes if n.meta.get(RECOMPUTE_META_KEY)}
    untagged = {str(n.target) for n in cnt.graphs[0].graph.nodes
                if n.op.startswith("call") and not n.meta.get(RECOMPUTE_META_KEY)}  # fmt: skip
    assert any("matmul" in t for t in tagged) and any("tanh" in t for t in tagged)
    assert not any("matmul" in t or "tanh" in t for t in untagged)
    assert any("sin" in t for t in untagged)


def test_checkpoint_options_that_cannot_hold_break_the_graph():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(GraphBreakError, match="without use_reentrant"):
        ember.compile(lambda t: checkpoint.checkpoint(torch.sin, t), backend="eager",
                      fullgraph=True)(x)  # fmt: skip
    with pytest.raises(GraphBreakError, match="no input that requires grad"):
        ember.compile(lambda t: checkpoint.checkpoint(torch.sin, t, use_reentrant=True),
                      backend="eager", fullgraph=True)(x.detach())  # fmt: skip


def test_without_gradients_the_forward_is_inlined():
    cnt = CompileCounter()
    x = torch.randn(4, 5)
    with torch.no_grad():
        out = ember.compile(cases.old_form_ctx_attribute, backend=cnt, fullgraph=True)(x, 2.0)
    torch.testing.assert_close(out, cases.old_form_ctx_attribute(x, 2.0))
    assert not any(isinstance(n.target, AutogradFunctionCall) for n in cnt.graphs[0].graph.nodes)


def test_module_with_a_function_trains_like_eager():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 5)

        def forward(self, x):
            return cases.MulSetup.apply(self.lin(x), cases.StraightThrough.apply(x)).sum()

    torch.manual_seed(0)
    eager = M()
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(3, 5)
    eager(x).backward()
    cnt = CompileCounter()
    ember.compile(compiled_model, backend=cnt)(x).backward()
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert cnt.frame_count == 1


def test_dynamic_sizes_stay_one_graph():
    cnt = CompileCounter(dynamic=True)
    f = ember.compile(cases.size_saved_on_ctx, backend=cnt)
    breaks0 = len(convert.stats.breaks)
    for n in (3, 4, 5, 6):
        x = torch.randn(n, 2, requires_grad=True)
        f(x).backward()
        xe = x.detach().clone().requires_grad_()
        cases.size_saved_on_ctx(xe).backward()
        torch.testing.assert_close(x.grad, xe.grad)
    assert cnt.frame_count == 2 and len(convert.stats.breaks) == breaks0  # static, then dynamic


def test_a_backward_replaced_after_compiling_recompiles():
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * 2

    cnt = CompileCounter()
    f = ember.compile(lambda t: Scaled.apply(t).sum(), backend=cnt)
    x = torch.randn(3, requires_grad=True)
    f(x).backward()
    Scaled.backward = staticmethod(lambda ctx, g: g * 7)
    x.grad = None
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 7.0))
    assert cnt.frame_count == 2
