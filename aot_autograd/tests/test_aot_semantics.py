"""aot_function against eager: mutation, aliasing, grad modes, autocast, detach, mixed inputs."""

import pytest
import torch
import torch.nn.functional as F

from ember.aot_autograd import aot_function, default_partition, min_cut_partition, run_as_fx

PARTITIONERS = [min_cut_partition, default_partition]


def _compile(fn, partition_fn=min_cut_partition):
    return aot_function(fn, run_as_fx, partition_fn=partition_fn)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def _check_grads(fn, inputs, partition_fn=min_cut_partition, atol=1e-5, rtol=1e-5):
    """Run fn eagerly and compiled on copies of inputs; compare outputs and input gradients."""
    eager_in, aot_in = _leaves(*inputs), _leaves(*inputs)
    compiled = _compile(fn, partition_fn)
    expected, actual = fn(*eager_in), compiled(*aot_in)
    exp_list = expected if isinstance(expected, (tuple, list)) else [expected]
    act_list = actual if isinstance(actual, (tuple, list)) else [actual]
    torch.testing.assert_close(act_list, exp_list, atol=atol, rtol=rtol)
    loss_e = sum((o.float() * (i + 1)).sum() for i, o in enumerate(exp_list) if o.requires_grad)
    loss_a = sum((o.float() * (i + 1)).sum() for i, o in enumerate(act_list) if o.requires_grad)
    if isinstance(loss_e, torch.Tensor):
        loss_e.backward()
        loss_a.backward()
    for e, a in zip(eager_in, aot_in):
        if e.requires_grad:
            torch.testing.assert_close(a.grad, e.grad, atol=atol, rtol=rtol)
    return compiled


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_mlp_gradients(partition_fn):
    def fn(x, w1, b1, w2):
        return torch.tanh(F.gelu(x @ w1 + b1) @ w2).sum(-1)

    torch.manual_seed(0)
    inputs = [
        torch.randn(4, 8),
        torch.randn(8, 16, requires_grad=True),
        torch.randn(16, requires_grad=True),
        torch.randn(16, 8, requires_grad=True),
    ]
    _check_grads(fn, inputs, partition_fn)


def test_mixed_requires_grad():
    def fn(a, b, c):
        return (a * b).exp() + c.sin(), (b - c).relu()

    torch.manual_seed(0)
    a, b, c = torch.randn(5, requires_grad=True), torch.randn(5), torch.randn(5, requires_grad=True)
    compiled = _check_grads(fn, [a, b, c])
    plan = next(iter(compiled.cache.values())).plan
    assert plan.grad_inputs == [True, False, True]


def test_input_mutation_is_copied_back():
    def fn(x, stats):
        stats.mul_(0.9).add_(x.detach().mean(0) * 0.1)
        return x.relu() * 2

    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    s_eager, s_aot = torch.ones(3), torch.ones(3)
    compiled = _compile(fn)
    out_e, out_a = fn(x, s_eager), compiled(x, s_aot)
    torch.testing.assert_close(out_a, out_e)
    torch.testing.assert_close(s_aot, s_eager)
    compiled(x, s_aot)  # the second call reuses the trace and mutates again
    fn(x, s_eager)
    torch.testing.assert_close(s_aot, s_eager)
    assert compiled.trace_count == 1


def test_add_inplace_on_argument_without_grad():
    def fn(x, y):
        x.add_(y)
        return x * y

    x_e, x_a, y = torch.zeros(3), torch.zeros(3), torch.arange(3.0)
    compiled = _compile(fn)
    torch.testing.assert_close(compiled(x_a, y), fn(x_e, y))
    torch.testing.assert_close(x_a, x_e)


def test_mutating_an_input_that_requires_grad_raises():
    def fn(x):
        return x.mul_(2)

    with pytest.raises(NotImplementedError, match="requires grad"):
        _compile(fn)(torch.randn(3, requires_grad=True) * 1)


def test_outputs_alias_inputs_and_each_other():
    def fn(x, y):
        z = y * 2
        return x.t(), z, z.view(-1), x[1]

    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    compiled = _check_grads(fn, [x, y])
    xt, z, zv, x1 = compiled(x, y)
    assert xt.data_ptr() == x.data_ptr() and xt.stride() == (1, 4)
    assert x1.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert zv.data_ptr() == z.data_ptr()
    with torch.no_grad():
        zv[0] = 100.0  # a write through one alias shows in the other, as in eager
    assert z[0, 0].item() == 100.0


def test_returned_mutated_input_aliases_it():
    def fn(x):
        x.add_(1)
        return x, x.view(-1)

    x = torch.zeros(2, 2)
    a, b = _compile(fn)(x)
    assert a.data_ptr() == x.data_ptr() == b.data_ptr()
    assert x.sum().item() == 4.0


def test_no_grad_traces_an_inference_graph():
    def fn(x, w):
        return (x @ w).relu()

    x, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
    compiled = _compile(fn)
    with torch.no_grad():
        out = compiled(x, w)
    assert not out.requires_grad
    assert set(compiled.last_graphs) == {"inference"}
    torch.testing.assert_close(out, fn(x, w).detach())
    out = compiled(x, w)  # grad mode is part of the key: a joint trace now
    assert out.requires_grad and compiled.trace_count == 2
    assert set(compiled.last_graphs) == {"joint", "forward", "backward"}


def test_inference_mode():
    def fn(x, buf):
        buf.add_(1)
        return x.softmax(-1)

    x, buf = torch.randn(2, 5), torch.zeros(2)
    compiled = _compile(fn)
    with torch.inference_mode():
        out = compiled(x, buf)
    assert out.is_inference()
    torch.testing.assert_close(out, x.softmax(-1))
    assert buf.tolist() == [1.0, 1.0]


def test_detach_and_set_grad_enabled_inside():
    def fn(x, w):
        h = x @ w
        with torch.no_grad():
            scale = h.abs().amax()
        g = h.detach() * h
        with torch.set_grad_enabled(False):
            frozen = h.sum()
        return g / scale, frozen

    torch.manual_seed(0)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    compiled = _check_grads(fn, [x, w])
    g, frozen = compiled(x, w)
    assert g.requires_grad and not frozen.requires_grad


def test_output_not_requiring_grad_is_non_differentiable():
    def fn(x):
        return x.sin(), x.argmax(), x.detach()

    x = torch.randn(4, requires_grad=True)
    s, idx, d = _compile(fn)(x)
    assert s.requires_grad and not idx.requires_grad and not d.requires_grad
    assert d.data_ptr() == x.data_ptr()


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_autocast_bfloat16(partition_fn):
    def fn(x, w, b):
        return F.layer_norm(x @ w + b, (8,)).relu()

    torch.manual_seed(0)
    x, w, b = (
        torch.randn(4, 6),
        torch.randn(6, 8, requires_grad=True),
        torch.randn(8, requires_grad=True),
    )
    compiled = _compile(fn, partition_fn)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_a = compiled(x, w, b)
        out_e = fn(x, w.detach().requires_grad_(), b.detach().requires_grad_())
    assert out_a.dtype == out_e.dtype
    torch.testing.assert_close(out_a, out_e, atol=2e-2, rtol=2e-2)
    out = compiled(x, w, b)  # autocast state is part of the key
    assert out.dtype == torch.float32 and compiled.trace_count == 2


def test_autocast_gradients_match_eager():
    def fn(x, w):
        return (x @ w).float().pow(2).mean()

    torch.manual_seed(0)
    x, w = torch.randn(4, 6), torch.randn(6, 8, requires_grad=True)
    w_e = w.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_a = _compile(fn)(x, w)
        loss_e = fn(x, w_e)
    loss_a.backward()
    loss_e.backward()
    assert w.grad.dtype == torch.float32
    torch.testing.assert_close(w.grad, w_e.grad, atol=1e-2, rtol=1e-2)


def test_cache_hits_and_misses():
    calls = []

    def fn(x, k):
        calls.append(1)
        return x * k

    compiled = _compile(fn)
    x = torch.randn(3, requires_grad=True)
    compiled(x, 2.0)
    compiled(torch.randn(3, requires_grad=True), 2.0)
    assert compiled.trace_count == 1 and len(calls) == 1
    compiled(x, 3.0)  # a different constant
    compiled(torch.randn(4, requires_grad=True), 2.0)  # a different shape
    compiled(torch.randn(3), 2.0)  # a different requires_grad
    compiled(torch.randn(3, dtype=torch.float64), 2.0)  # a different dtype
    assert compiled.trace_count == 5


def test_unused_input_and_non_tensor_outputs():
    def fn(x, unused, n):
        return {"y": x * n, "n": n, "none": None}

    x = torch.randn(3, requires_grad=True)
    out = _compile(fn)(x, torch.randn(2, requires_grad=True), 3)
    assert out["n"] == 3 and out["none"] is None
    out["y"].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_outputs_viewing_an_unreturned_intermediate():
    def fn(x):
        base = x * 2
        return base[0], base[1:]

    x = torch.randn(3, 4, requires_grad=True)
    compiled = _check_grads(fn, [x])
    a, b = compiled(x)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.storage_offset() - a.storage_offset() == 4


def test_output_that_is_also_a_mutated_value():
    def fn(x, buf):
        y = x * 2
        buf.copy_(y.detach())
        return y

    x, buf_e, buf_a = torch.randn(3, requires_grad=True), torch.zeros(3), torch.zeros(3)
    y = _compile(fn)(x, buf_a)
    assert y.requires_grad
    torch.testing.assert_close(buf_a, fn(x, buf_e).detach())
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_unused_differentiable_output_gets_zero_tangent():
    def fn(x):
        return x.sin(), x.cos()

    x = torch.randn(4, requires_grad=True)
    s, _ = _compile(fn)(x)
    s.sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_autocast_region_inside_the_program():
    def fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x @ w
        return h.float().relu().sum()

    torch.manual_seed(0)
    x, w = torch.randn(4, 6), torch.randn(6, 8, requires_grad=True)
    compiled = _check_grads(fn, [x, w], atol=1e-2, rtol=1e-2)
    joint = compiled.last_graphs["joint"]
    dtypes = {
        n.meta["ember_meta"].dtype
        for n in joint.graph.nodes
        if hasattr(n.meta.get("ember_meta"), "dtype")
    }
    assert torch.bfloat16 in dtypes


def test_mutated_input_aliasing_another_input_raises():
    def fn(a, b):
        a.add_(1)
        return b * 2

    x = torch.zeros(3)
    with pytest.raises(NotImplementedError, match="shares its storage"):
        _compile(fn)(x, x)


def test_aliasing_is_found_through_views_and_between_mutated_inputs():
    def one(a, b, c):
        c.add_(1)
        return a + b

    def both(a, b, c):
        a.add_(1)
        c.mul_(2)
        return b

    x = torch.zeros(4)
    with pytest.raises(NotImplementedError, match="input 2 is mutated"):
        _compile(one)(torch.ones(2), x[1:3], x[:2])  # a view at another offset
    with pytest.raises(NotImplementedError, match="input 0 is mutated"):
        _compile(both)(x[:2], torch.ones(2), x[2:])  # two mutated inputs, one storage
    _compile(one)(torch.ones(2), torch.ones(2), x[:2])  # no alias: runs


def test_aot_module_lifts_parameters():
    from ember.aot_autograd import aot_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    compiled = aot_module(model, run_as_fx)
    x = torch.randn(3, 4)
    compiled(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for p_a, p_e in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p_a.grad, p_e.grad)
    assert dict(compiled.named_parameters()).keys() == {
        f"orig_module.{k}" for k, _ in model.named_parameters()
    }


def test_closed_over_tensor_becomes_an_input():
    table = torch.randn(5)

    def fn(x):
        return x * table

    x = torch.randn(5, requires_grad=True)
    compiled = _check_grads(fn, [x])
    joint = compiled.last_graphs["joint"]
    names = [n.name for n in joint.graph.nodes if n.op == "placeholder"]
    assert names == ["primals_1", "lifted_0", "tangents_1"]
    assert not any(n.op == "get_attr" for n in joint.graph.nodes)


def test_closed_over_tensor_requiring_grad_raises():
    w = torch.randn(3, requires_grad=True)

    def fn(x):
        return x * w

    with pytest.raises(NotImplementedError, match="closes over"):
        _compile(fn)(torch.randn(3, requires_grad=True))


def test_dropout_with_closure_and_seed_order():
    table = torch.ones(64)

    def fn(x):
        return torch.nn.functional.dropout(x, 0.5) * table

    compiled = _compile(fn)
    x = torch.ones(64, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 2)
    names = [n.name for n in compiled.last_graphs["forward"].graph.nodes if n.op == "placeholder"]
    assert names == ["primals_1", "lifted_0", "rng_seed_0"]
