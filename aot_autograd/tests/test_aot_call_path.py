"""The per-call fast paths (keyed and guarded) against eager: retrace, mutation, aliasing, modes."""

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from ember.aot_autograd import aot_function, aot_module, aot_module_simplified, run_as_fx
from ember.aot_autograd import module_call
from ember.aot_autograd.module_call import GUARDED_INPUTS_META, GuardViolation


class Affine(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return (x * self.weight * self.scale + 1,)


def _simplified(module, example, **kwargs):
    return aot_module_simplified(module, [example], fw_compiler=run_as_fx, **kwargs)


@pytest.mark.parametrize("guarded", [False, True])
def test_repeated_calls_reuse_one_trace(guarded):
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x, guarded=guarded)
    for _ in range(3):
        torch.testing.assert_close(run(x), m(x))
    assert run.aot_function.trace_count == 1


def test_signature_changes_after_fast_calls_retrace():
    torch.manual_seed(0)
    m = Affine()
    run = _simplified(m, torch.randn(4))
    x = torch.randn(4)
    run(x)
    run(x)
    variants = [
        torch.randn(3, 4),  # sizes (broadcast against the weight)
        torch.randn(4, 3).t(),  # strides
        torch.randn(4, dtype=torch.float64),  # dtype
        torch.randn(4, requires_grad=True),  # requires_grad
    ]
    for v in variants:
        (out,) = run(v)
        torch.testing.assert_close(out, m(v)[0])
    assert run.aot_function.trace_count == 5
    out = run(variants[-1])[0]
    out.sum().backward()
    assert variants[-1].grad is not None and m.weight.grad is not None


def test_grad_mode_and_autocast_changes_retrace():
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x)
    assert run(x)[0].requires_grad  # the weight requires grad: a training runtime
    with torch.no_grad():
        out = run(x)[0]
        assert not out.requires_grad
        torch.testing.assert_close(out, m(x)[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run(x)
    assert run.aot_function.trace_count == 3
    assert torch.is_grad_enabled()


def test_parameter_state_is_read_each_call():
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x)
    run(x)
    m.weight = nn.Parameter(torch.full((4,), 5.0))  # reassigned: the new tensor is used
    m.scale = torch.tensor(3.0)
    torch.testing.assert_close(run(x)[0], x * 15.0 + 1)
    with torch.no_grad():
        m.weight.fill_(1.0)  # written in place: seen as well
    torch.testing.assert_close(run(x)[0], x * 3.0 + 1)
    m.weight.requires_grad_(False)  # a signature change on the state: an inference graph
    assert not run(x)[0].requires_grad
    assert run.aot_function.trace_count == 2


def test_state_registered_after_creation_is_picked_up():
    class Late(nn.Module):
        def forward(self, x):
            return x * getattr(self, "k", torch.tensor(1.0))

    m = Late()
    x = torch.randn(3)
    run = _simplified(m, x)
    torch.testing.assert_close(run(x), x)
    m.register_buffer("k", torch.tensor(4.0))
    torch.testing.assert_close(run(x), x * 4.0)
    torch.testing.assert_close(run(x), x * 4.0)


def test_mutated_buffer_through_fast_path_matches_eager():
    torch.manual_seed(0)
    eager, compiled = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(8, 3)
    run = _simplified(compiled, x)
    for _ in range(3):
        torch.testing.assert_close(run(x), eager(x))
    torch.testing.assert_close(compiled.running_mean, eager.running_mean)
    torch.testing.assert_close(compiled.running_var, eager.running_var)
    assert compiled.num_batches_tracked.item() == 3
    assert run.aot_function.trace_count == 1


def test_mutated_input_aliasing_another_after_fast_calls_raises():
    def fn(a, b):
        a.add_(1)
        return b * 2

    compiled = aot_function(fn, run_as_fx)
    a, b = torch.zeros(3), torch.ones(3)
    compiled(a, b)
    compiled(a, b)
    torch.testing.assert_close(a, torch.full((3,), 2.0))
    x = torch.zeros(3)
    with pytest.raises(NotImplementedError, match="shares its storage"):
        compiled(x, x)  # same signature, so the cached trace is found, then refused
    base = torch.zeros(6)
    view_a, view_b = base[:3], base[3:]  # one storage, as eager would see it
    with pytest.raises(NotImplementedError, match="shares its storage"):
        compiled(view_a, view_b)


def test_aliased_inputs_without_mutation_share_the_trace():
    compiled = aot_function(lambda a, b: a + b, run_as_fx)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(compiled(x, y), x + y)
    torch.testing.assert_close(compiled(x, x), x + x)
    assert compiled.trace_count == 1


def test_output_aliases_input_through_fast_path():
    class View(nn.Module):
        def forward(self, x):
            return x.t(), x * 2

    x = torch.randn(2, 3)
    run = _simplified(View(), x)
    run(x)
    xt, y = run(x)
    assert xt.data_ptr() == x.data_ptr() and xt.stride() == (1, 3)
    torch.testing.assert_close(y, x * 2)


def test_non_tensor_and_keyword_arguments_take_the_general_path():
    class Scale(nn.Module):
        def forward(self, x, k, bias=None):
            return x * k if bias is None else x * k + bias

    m = aot_module(Scale(), run_as_fx)
    x = torch.randn(3)
    torch.testing.assert_close(m(x, 2.0), x * 2.0)
    torch.testing.assert_close(m(x, 3.0), x * 3.0)
    torch.testing.assert_close(m(x, 3.0, bias=x), x * 4.0)
    torch.testing.assert_close(m(x, 2.0), x * 2.0)
    assert m._compiled.trace_count == 3


def test_random_ops_draw_a_seed_per_fast_call():
    class Drop(nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, training=True)

    x = torch.ones(64)
    run = _simplified(Drop(), x)
    torch.manual_seed(1)
    a, b = run(x), run(x)
    assert not torch.equal(a, b)
    torch.manual_seed(1)
    torch.testing.assert_close(run(x), a)


def test_inference_call_restores_grad_mode_after_an_error():
    def failing_compiler(gm, example):
        def call(*args):
            raise ValueError("boom")

        return call

    compiled = aot_function(lambda x: x + 1, failing_compiler)
    with pytest.raises(ValueError, match="boom"):
        compiled(torch.randn(2))
    assert torch.is_grad_enabled()


def test_hot_path_does_not_flatten(monkeypatch):
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x)
    f = aot_function(lambda a, b: a * b, run_as_fx)
    run(x)
    f(x, x)

    def no_flatten(*a, **k):
        raise AssertionError("pytree flatten on a cache hit")

    monkeypatch.setattr(pytree, "tree_flatten", no_flatten)
    run(x)
    f(x, x)
    with torch.no_grad():
        with pytest.raises(AssertionError, match="flatten"):
            run(x)  # a new signature does go through the general path


def test_inference_graph_skips_autograd_function():
    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return (self.lin(x).relu(),)

    m = Lin().requires_grad_(False)
    x = torch.randn(2, 4)
    run = _simplified(m, x)
    (out,) = run(x)  # grad mode on, nothing requires grad: the inference graph, called directly
    assert out.grad_fn is None and not out.requires_grad
    assert set(run.aot_function.last_graphs) == {"inference"}
    torch.testing.assert_close(out, m(x)[0])


def test_training_mixed_requires_grad_through_fast_path():
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x)
    for _ in range(2):
        m.weight.grad = None
        run(x)[0].sum().backward()
        torch.testing.assert_close(m.weight.grad, x * 2.0)


def test_guarded_mode_still_follows_grad_mode():
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x, guarded=True)
    assert run.guarded
    assert run(x)[0].requires_grad
    with torch.no_grad():
        assert not run(x)[0].requires_grad
    assert run(x)[0].requires_grad
    assert run.aot_function.trace_count == 2


def test_guarded_mode_checks_aliasing_of_mutated_inputs():
    class Acc(nn.Module):
        def forward(self, acc, x):
            acc.add_(x)
            return (x * 2,)

    acc, x = torch.zeros(3), torch.ones(3)
    run = aot_module_simplified(Acc(), [acc, x], fw_compiler=run_as_fx, guarded=True)
    run(acc, x)
    run(acc, x)
    torch.testing.assert_close(acc, torch.full((3,), 2.0))
    with pytest.raises(NotImplementedError, match="shares its storage"):
        run(acc, acc)


def test_guarded_mode_verification_catches_a_broken_promise(monkeypatch):
    monkeypatch.setattr(module_call.config, "verify_guarded", True)
    torch.manual_seed(0)
    m = Affine()
    x = torch.randn(4)
    run = _simplified(m, x, guarded=True)
    run(x)
    with pytest.raises(GuardViolation, match="flat input 2"):
        run(torch.randn(3, 4))
    with pytest.raises(GuardViolation, match="strides"):
        run(torch.randn(8)[::2])


def test_guarded_marker_on_the_graph_module():
    gm = fx.symbolic_trace(lambda x: (x.sin(),))
    gm.meta[GUARDED_INPUTS_META] = True
    x = torch.randn(3)
    run = aot_module_simplified(gm, [x], fw_compiler=run_as_fx)
    assert run.guarded
    torch.testing.assert_close(run(x)[0], x.sin())
    plain = aot_module_simplified(fx.symbolic_trace(lambda x: (x.sin(),)), [x], run_as_fx)
    assert not plain.guarded


def test_compile_freezes_the_heap_only_while_it_runs():
    """The collector skips the pre-existing heap during a compile (gc.freeze) and gets it back
    after; garbage made unreachable during the compile is still collected; a heap the process
    froze itself stays frozen."""
    import gc
    import weakref

    seen = []

    def compiler(gm, inputs):
        seen.append(gc.get_freeze_count())
        return run_as_fx(gm, inputs)

    class Cycle:
        pass

    def f(x):
        return (x.sin() * 2,)

    assert gc.get_freeze_count() == 0
    old = Cycle()
    old.me = old  # a cycle made before the compile, dropped during it
    ref = weakref.ref(old)

    def dropping_compiler(gm, inputs):
        nonlocal old
        old = None
        return compiler(gm, inputs)

    x = torch.randn(3, requires_grad=True)
    out = aot_function(f, fw_compiler=dropping_compiler, bw_compiler=compiler)(x)
    out[0].sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    assert seen and all(n > 0 for n in seen)  # frozen while compiling
    assert gc.get_freeze_count() == 0  # and given back
    gc.collect()
    assert ref() is None  # the dropped cycle was collected after all

    gc.freeze()  # a process that froze its own heap keeps it frozen
    try:
        frozen = gc.get_freeze_count()
        aot_function(lambda y: (y.cos(),), fw_compiler=compiler)(torch.randn(2))
        # still frozen (an unfreeze would leave 0); frozen objects freed by their reference
        # counts meanwhile leave the count a little lower (CI: 313469 of 313471)
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
