"""The constructs PyTorch 2.1-2.3 users write, compiled for CUDA by inductor: a user Triton kernel,
a custom operator, torch.cond and a custom autograd.Function, each one graph, matching eager
(forward and gradients); user Triton kernels also from the C++ wrapper and a standalone package
(compiled ahead of time, ember.inductor.user_triton). Skipped without CUDA."""

import subprocess

import numpy as np
import pytest
import torch

import ember
from ember.cpp_wrapper import install_run_package, load_package, package

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _scaled_add(x_ptr, y_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale + y, mask=mask)


@torch.library.custom_op("ember_cuda_test::twice_sin", mutates_args=())
def twice_sin(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.sin()


@twice_sin.register_fake
def _(x):
    return torch.empty_like(x)


class ExpWithHalvedGrad(torch.autograd.Function):
    """exp, with a backward that returns half the true gradient: the user's backward must run."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * 0.5


def _one_graph(fn, *args):
    out = ember.explain(fn)(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out


def test_user_triton_kernel_in_a_compiled_cuda_function():
    def fn(x, y):
        a = x.relu()
        out = torch.empty_like(a)
        n = a.numel()
        _scaled_add[(triton.cdiv(n, 256),)](a, y, out, n, 3.0, BLOCK=256)
        return out.tanh()

    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    _one_graph(fn, x, y)
    got = ember.compile(fn, backend="inductor")(x, y)
    torch.testing.assert_close(got, fn(x, y))


def test_custom_op_in_a_compiled_cuda_function():
    def fn(x):
        return twice_sin(x * 3) + 1

    x = torch.randn(64, 32, device="cuda")
    _one_graph(fn, x)
    torch.testing.assert_close(ember.compile(fn, backend="inductor")(x), fn(x))


def test_cond_on_cuda_takes_either_branch():
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() - 1, (x,))

    compiled = ember.compile(fn, backend="inductor")
    for sign in (1, -1):
        x = sign * torch.rand(16, 8, device="cuda")
        torch.testing.assert_close(compiled(x), fn(x))


def test_autograd_function_backward_on_cuda():
    def fn(x):
        return ExpWithHalvedGrad.apply(x * 2).sum()

    x = torch.randn(32, 16, device="cuda", requires_grad=True)
    _one_graph(fn, x)
    ember.compile(fn, backend="inductor")(x).backward()
    ref = x.detach().clone().requires_grad_()
    fn(ref).backward()
    torch.testing.assert_close(x.grad, ref.grad)


@triton.jit
def _times_two(v):
    return v * 2.0


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                          triton.Config({"BLOCK": 512}, num_warps=8)], key=["n"])  # fmt: skip
@triton.jit
def _tuned_axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _times_two(alpha * x) + y, mask=mask)


def _with_user_kernel(x, y):
    a = x.relu()
    out = torch.empty_like(a)
    n = a.numel()
    _scaled_add[(triton.cdiv(n, 256),)](a, y, out, n, 3.0, BLOCK=256)
    return out.tanh() + y


def _with_tuned_kernel(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    _tuned_axpy[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x.sin(), y, out, n, -0.5)
    return out * 2


def test_user_triton_kernel_in_a_cuda_package_runs_standalone(tmp_path):
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    path = package(ember.export(_with_user_kernel, (x, y)), tmp_path / "pkg", device="cuda")
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")  # new values
    want = _with_user_kernel(x, y)
    torch.testing.assert_close(load_package(path)(x, y)[0], want)
    exe = install_run_package(tmp_path / "bin")
    np.save(tmp_path / "x.npy", x.cpu().numpy())
    np.save(tmp_path / "y.npy", y.cpu().numpy())
    r = subprocess.run([str(exe), str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"),
                        str(tmp_path / "o.npy")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "o.npy")), want.cpu())


def test_autotuned_user_kernel_calling_a_helper_in_a_cuda_package(tmp_path):
    x, y = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    path = package(ember.export(_with_tuned_kernel, (x, y)), tmp_path / "pkg", device="cuda")
    x, y = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    torch.testing.assert_close(load_package(path)(x, y)[0], _with_tuned_kernel(x, y))


def test_user_triton_kernel_from_the_cpp_wrapper_option():
    ember.reset()
    compiled = ember.compile(_with_user_kernel, options={"cpp_wrapper": True})
    for _ in range(2):
        x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
        torch.testing.assert_close(compiled(x, y), _with_user_kernel(x, y))
