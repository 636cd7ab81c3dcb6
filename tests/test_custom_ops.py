"""User operators and user Triton kernels through aot_eager and inductor (CPU), end to end."""

import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel below is decorated

import ember
import ember.cpp_wrapper
from ember.dynamo import GraphBreakError

BACKENDS = ["aot_eager", "inductor"]
# User Triton kernels run on the GPU where there is one; on the CPU, in Triton's interpreter.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@torch.library.custom_op("ember_e2e::mysin", mutates_args=())
def mysin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@mysin.register_fake
def _(x):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


mysin.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("ember_e2e::no_grad_formula", mutates_args=())
def no_grad_formula(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@no_grad_formula.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ember_e2e::accumulate", mutates_args=("acc",))
def accumulate(acc: torch.Tensor, x: torch.Tensor) -> None:
    acc.add_(x)


@accumulate.register_fake
def _(acc, x):
    return None


@torch.library.custom_op("ember_e2e::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return x**3


@cube.register_fake
def _(x):
    return torch.empty_like(x)


def _cube_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    out = torch.zeros_like(grad)
    accumulate(out, 3 * x * x * grad)  # a mutating user operator inside the backward formula
    return out


cube.register_autograd(_cube_backward, setup_context=_setup)

_LIB = torch.library.Library("ember_e2e_lib", "DEF")
_LIB.define("axpy(Tensor x, Tensor y, float a) -> Tensor")
_LIB.impl("axpy", lambda x, y, a: a * x + y, "CPU")
with warnings.catch_warnings():  # impl_abstract: the older name of register_fake, still used
    warnings.simplefilter("ignore", FutureWarning)
    torch.library.impl_abstract("ember_e2e_lib::axpy", lambda x, y, a: torch.empty_like(x),
                                lib=_LIB)  # fmt: skip
_LIB.define("clamp_into(Tensor x, Tensor(a!) out, float hi) -> ()")


def _clamp_into(x, out, hi):
    out.copy_(x.clamp(max=hi))


_LIB.impl("clamp_into", _clamp_into, "CPU")
torch.library.register_fake("ember_e2e_lib::clamp_into", lambda x, out, hi: None, lib=_LIB)
torch.library.register_autograd(
    "ember_e2e_lib::axpy",
    lambda ctx, g: (g * ctx.a, g, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "a", inputs[2]),
    lib=_LIB,
)


def _run(fn, backend, *args):
    ember.reset()
    explained = ember.explain(fn)(*[a.detach().clone().requires_grad_(a.requires_grad)
                                    for a in args])  # fmt: skip
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    ember.reset()
    return ember.compile(fn, backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_op_forward_and_backward_with_register_autograd(backend):
    def f(x, w):
        return (mysin(x * w) * 2 + torch.ops.ember_e2e_lib.axpy(x, w, 3.0)).sum()

    x, w = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    compiled = _run(f, backend, x, w)
    got = compiled(x, w)
    got_grads = torch.autograd.grad(got, (x, w))
    expected = f(x, w)
    expected_grads = torch.autograd.grad(expected, (x, w))
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutating_custom_op_updates_inputs_and_intermediates(backend):
    def f(acc, x):
        accumulate(acc, x)  # an input, written as eager writes it
        tmp = torch.zeros_like(x)
        accumulate(tmp, x * 2)
        view = tmp[:3]
        accumulate(view, x[:3])  # a view of an intermediate: its base sees the write
        return tmp + acc

    compiled = _run(f, backend, torch.randn(5), torch.randn(5))
    for _ in range(2):
        acc, x = torch.randn(5), torch.randn(5)
        acc_eager = acc.clone()
        torch.testing.assert_close(compiled(acc, x), f(acc_eager, x))
        torch.testing.assert_close(acc, acc_eager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutating_custom_op_in_a_training_graph_and_in_a_backward_formula(backend):
    def f(x):
        acc = torch.zeros_like(x)
        accumulate(acc, x.detach())
        return (cube(x) * acc).sum()

    x = torch.randn(7, requires_grad=True)
    compiled = _run(f, backend, x)
    got, expected = compiled(x), f(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(expected, x)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutating_library_op_through_torch_ops(backend):
    def f(x, out):
        torch.ops.ember_e2e_lib.clamp_into(x * 2, out, 0.5)
        return out + 1

    compiled = _run(f, backend, torch.randn(6), torch.randn(6))
    x, out = torch.randn(6), torch.randn(6)
    out_eager = out.clone()
    torch.testing.assert_close(compiled(x, out), f(x, out_eager))
    torch.testing.assert_close(out, out_eager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_library_op_through_torch_ops_in_inference(backend):
    def f(x, y):
        return torch.ops.ember_e2e_lib.axpy(x.relu(), y, -0.5).exp()

    x, y = torch.randn(4, 3), torch.randn(4, 3)
    compiled = _run(f, backend, x, y)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), f(x, y))


def test_custom_op_without_autograd_formula_needing_gradients_raises_naming_it():
    compiled = ember.compile(lambda x: no_grad_formula(x) + 1, backend="inductor", fullgraph=True)
    ember.reset()
    with pytest.raises(GraphBreakError, match="ember_e2e::no_grad_formula needs a gradient"):
        compiled(torch.randn(3, requires_grad=True))


def test_packaging_a_custom_op_names_it(tmp_path):
    def f(x):
        return mysin(x) * 2

    ep = ember.export(f, (torch.randn(4),))
    torch.testing.assert_close(ep(torch.ones(4)), torch.sin(torch.ones(4)) * 2)
    with pytest.raises(NotImplementedError, match="custom operator ember_e2e::mysin.default"):
        ember.cpp_wrapper.package(ep, str(tmp_path / "pkg"))


def _triton():
    triton = pytest.importorskip("triton")
    return triton, pytest.importorskip("triton.language")


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_triton_kernel_runs_from_the_python_wrapper(backend):
    triton, tl = _triton()

    @triton.jit
    def shifted_square(x_ptr, out_ptr, n, shift, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x_ptr + offs, mask=mask) + shift
        tl.store(out_ptr + offs, v * v, mask=mask)

    def f(x):
        y = x.exp()
        out = torch.empty_like(y)
        n = y.numel()
        shifted_square[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](
            y, out, n, 1.5, BLOCK=16)
        return out.sum(0) + y.mean()

    compiled = _run(f, backend, torch.randn(40, device=DEV))
    for _ in range(2):
        x = torch.randn(40, device=DEV)
        torch.testing.assert_close(compiled(x), f(x))


def test_inductor_wrapper_calls_the_operator_by_name_between_generated_kernels():
    from ember.inductor import compile_prims
    from ember.primtorch import trace_to_prims

    def f(x):
        return mysin(x * 2).relu() + 1

    x = torch.randn(8)
    compiled = compile_prims(trace_to_prims(f, x), [x])
    assert "extern_custom_op('ember_e2e::mysin.default'" in compiled.source
    assert [s.target for s in compiled.artifact.steps if s.kind == "extern"] == ["extern.custom_op"]
    torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_triton_kernel_in_a_training_graph(backend):
    triton, tl = _triton()

    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    def f(x):
        out = torch.empty_like(x)
        double_kernel[(2,)](x, out, x.numel(), BLOCK=8)
        return (out * x).sum()  # the kernel's output is a constant to autograd, as in eager

    x = torch.randn(13, device=DEV, requires_grad=True)
    compiled = _run(f, backend, x)
    got, expected = compiled(x), f(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(expected, x)[0])


def test_packaging_a_user_triton_kernel_names_it(tmp_path):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CPU package: the kernel runs on CPU tensors only in Triton's interpreter")
    triton, tl = _triton()

    @triton.jit
    def negate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=mask), mask=mask)

    def f(x):
        out = torch.empty_like(x)
        negate_kernel[(1,)](x, out, x.numel(), BLOCK=16)
        return out + 1

    x = torch.randn(10)
    ep = ember.export(f, (x,))
    torch.testing.assert_close(ep(x), 1 - x)
    with pytest.raises(NotImplementedError, match=r"user Triton kernel \S*negate_kernel"):
        ember.cpp_wrapper.package(ep, str(tmp_path / "pkg"))


@torch.library.custom_op("ember_e2e::doubled_rows", mutates_args=())
def doubled_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x * 2])


@doubled_rows.register_fake
def _(x):
    return x.new_empty((x.shape[0] * 2, *x.shape[1:]))  # a size the fake kernel computes


def _doubled_rows_setup(ctx, inputs, output):
    ctx.rows = inputs[0].shape[0]  # symbolic while traced with dynamic sizes


def _doubled_rows_backward(ctx, grad):
    return grad[: ctx.rows] + 2 * grad[ctx.rows :]


doubled_rows.register_autograd(_doubled_rows_backward, setup_context=_doubled_rows_setup)


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_operators_take_dynamic_sizes(backend):
    """A stream of row counts: static, then one symbolic graph; each fake kernel runs on the
    trace's symbolic sizes (doubled_rows' output has 2 * s0 rows), gradients through
    register_autograd, a Library op and a mutating op included."""
    from ember.dynamo import convert

    def f(x, w, acc):
        h = doubled_rows(mysin(x * w))
        accumulate(acc, x.detach())
        return torch.ops.ember_e2e_lib.axpy(h, h, 2.0).sum(0) + acc.sum(0)

    ember.reset()  # forget the sizes another backend's run saw (automatic dynamic)
    g0, f0 = len(convert.stats.graphs), len(convert.stats.failures)
    compiled = ember.compile(f, backend=backend, fullgraph=True)
    for n in (3, 5, 8, 12):
        x, w = torch.randn(n, 4, requires_grad=True), torch.randn(4, requires_grad=True)
        acc = torch.randn(n, 4)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        acc_e = acc.clone()
        got, expected = compiled(x, w, acc), f(xe, we, acc_e)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(acc, acc_e)
        got.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(w.grad, we.grad)
    assert not convert.stats.failures[f0:]
    graphs = convert.stats.graphs[g0:]
    assert len(graphs) == 2 and graphs[1].gm.meta["ember_symbols"]
