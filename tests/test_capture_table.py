"""The program classes a new PyTorch 2.1-2.3 user writes (issue #25's table), each as the user
would try it on the CPU: `ember.explain` counts one graph and no break, and `ember.compile` with
inductor matches eager, forward and backward where the program has one, over calls whose sizes
change (static, then one dynamic graph, except where a size is baked in by design)."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel below is decorated

import ember
from ember.dynamo import convert

# the corpus's Functions (setup_context with needs_input_grad; a float output marked
# non-differentiable with a once_differentiable backward)
sys.path.insert(0, str(Path(__file__).parents[1] / "dynamo" / "tests"))
from corpus.autograd_functions import FloatNonDifferentiable, NeedsInputGradMarked  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def one_graph_no_break(fn, *args):
    out = ember.explain(fn)(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    ember.reset()
    return out


def leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def check_training(fn, make_args, sizes):
    """fn compiled by inductor against eager on fresh copies: outputs and the gradients of
    every input that requires grad; returns the number of graphs compiled."""
    g0, f0 = len(convert.stats.graphs), len(convert.stats.failures)
    compiled = ember.compile(fn, backend="inductor", fullgraph=True)
    for n in sizes:
        args = make_args(n)
        args_e = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        got, expected = compiled(*args), fn(*args_e)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        if expected.requires_grad:
            got.sum().backward()
            expected.sum().backward()
            for a, e in zip(args, args_e):
                if e.requires_grad:
                    torch.testing.assert_close(a.grad, e.grad, rtol=1e-5, atol=1e-5)
    assert not convert.stats.failures[f0:]
    return len(convert.stats.graphs) - g0


# -- NumPy: np.sin, np.exp, np.sum(axis=1) on float32 arrays ----------------------------------
def numpy_program(a):
    return np.sum(np.exp(np.sin(a)), axis=1)


def test_numpy_program():
    a = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    out = one_graph_no_break(numpy_program, a)
    assert out.ops_per_graph[0] == ["sin", "exp", "sum"]
    g0 = len(convert.stats.graphs)
    compiled = ember.compile(numpy_program, backend="inductor", fullgraph=True)
    for n, dtype in ((4, np.float32), (6, np.float32), (9, np.float32), (7, np.int32)):
        a = np.random.default_rng(n).standard_normal((n, 5)) * 3
        a = a.astype(dtype)
        got, expected = compiled(a), numpy_program(a)
        assert type(got) is np.ndarray and got.dtype == expected.dtype  # int32 -> float64
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    # static, dynamic rows, then int32 arrays (another dtype: their own graph)
    assert len(convert.stats.graphs) - g0 == 3


# -- a torch.library.custom_op with a fake (meta) implementation and an autograd formula ------
@torch.library.custom_op("ember_table::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _save_x(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x) * ctx.scale, None


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_save_x)


def custom_op_program(x, w):
    return scaled_sin(x @ w, 0.5).relu() + x.sum(1, keepdim=True)


def test_custom_op_program():
    one_graph_no_break(custom_op_program, leaf(4, 3), leaf(3, 3))
    graphs = check_training(custom_op_program, lambda n: (leaf(n, 3), leaf(3, 3)), (4, 6, 9, 13))
    assert graphs == 2  # static, then the rows dynamic (the fake kernel gives symbolic sizes)


# -- a @triton.jit kernel launched from the compiled function ----------------------------------
def _kernel():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def scale_shift(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale + 1.0, mask=mask)

    return scale_shift


def test_triton_kernel_program():
    kernel = _kernel()

    def triton_program(x):
        y = x.exp()
        out = torch.empty_like(y)
        n = y.numel()
        kernel[lambda meta: (triton_cdiv(n, meta["BLOCK"]),)](y, out, n, 3.0, BLOCK=16)
        return out * x  # the kernel is a constant to autograd, in eager as here

    out = one_graph_no_break(triton_program, leaf(20))
    assert "triton_kernel.default" in out.ops_per_graph[0]  # one node for the launch
    graphs = check_training(triton_program, lambda n: (leaf(n),), (20, 20, 33, 47))
    assert graphs == 3  # the grid reads the size: each size is its own graph, by design


def triton_cdiv(a, b):
    return (a + b - 1) // b


# -- an autograd.Function with a custom backward on inputs that need gradients ------------------
def autograd_function_program(x, y):
    a, b = FloatNonDifferentiable.apply(x)
    return NeedsInputGradMarked.apply(a, y) + b


@pytest.mark.parametrize("y_needs_grad", [True, False])
def test_autograd_function_program(y_needs_grad):
    def make(n):
        return leaf(n, 3), torch.randn(n, 3, requires_grad=y_needs_grad)

    one_graph_no_break(autograd_function_program, *make(4))
    assert check_training(autograd_function_program, make, (4, 6, 9)) == 2
    _, b = ember.compile(lambda x: FloatNonDifferentiable.apply(x), backend="inductor")(leaf(4))
    assert not b.requires_grad  # mark_non_differentiable holds in the compiled graph


# -- torch.cond -----------------------------------------------------------------------------------
def cond_program(x, w):
    return torch.cond(x.sum() > 0, lambda x, w: (x @ w).sin(), lambda x, w: (x * 2) @ w.cos(),
                      (x, w))  # fmt: skip


def test_cond_program():
    out = one_graph_no_break(cond_program, leaf(4, 3), leaf(3, 3))
    assert "cond" in out.ops_per_graph[0]

    def make(n):  # the sign alternates with the size: both branches run
        x = torch.rand(n, 3) + 0.1
        return (x if n % 2 else -x).requires_grad_(), leaf(3, 3)

    assert check_training(cond_program, make, (4, 5, 6, 7, 9)) == 2
