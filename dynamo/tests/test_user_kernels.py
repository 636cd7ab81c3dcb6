"""User Triton kernels and user operators captured by dynamo: one graph, no break, eager values."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel below is decorated

import ember
from ember.dynamo import CompileCounter, GraphBreakError
from ember.dynamo.user_kernels import written_arguments

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
# The kernels run on the GPU where there is one; on the CPU, in Triton's interpreter.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 16})], key=["n"],
                 do_bench=lambda fn, quantiles=None: [1.0, 1.0, 1.0])  # fmt: skip
@triton.jit
def scale_in_place_kernel(x_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ptrs = x_ptr + offs  # written through a derived pointer
    tl.store(ptrs, tl.load(ptrs, mask=mask) * scale, mask=mask)


def add_one(x):
    y = torch.empty_like(x)
    n = x.numel()
    add_one_kernel[((n + 7) // 8,)](x, y, n, BLOCK=8)
    return y


def _compile(fn):
    ember.reset()
    cnt = CompileCounter()
    return ember.compile(fn, backend=cnt), cnt


def _check_one_graph(fn, *args):
    compiled, cnt = _compile(fn)
    for _ in range(2):
        fresh = [a.clone() for a in args]
        expected, eager_args = fn(*[a.clone() for a in args]), [a.clone() for a in args]
        fn(*eager_args)
        got = compiled(*fresh)
        torch.testing.assert_close(got, expected)
        for a, b in zip(fresh, eager_args):
            torch.testing.assert_close(a, b)
    assert (cnt.frame_count, cnt.op_count > 0) == (1, True)
    return compiled, cnt


def test_kernel_with_constant_grid_is_one_node():
    def f(x):
        return add_one(x * 2) * 3

    _check_one_graph(f, torch.randn(37, device=DEV))
    graph = ember.explain(f)(torch.randn(37, device=DEV))
    assert (graph.graph_count, graph.graph_break_count) == (1, 0)
    assert "ember.triton_kernel" in graph.graphs[0].code


def test_autotuned_kernel_with_meta_grid_writes_its_argument():
    def f(x):
        z = x + 1
        n = z.numel()
        scale_in_place_kernel[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](z, n, 3.0)
        return z.sum()

    _check_one_graph(f, torch.randn(50, device=DEV))


def test_kernel_writing_an_input_mutates_it_as_eager_does():
    def f(x):
        n = x.numel()
        scale_in_place_kernel[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, n, -2.0)
        return x + 1

    _check_one_graph(f, torch.randn(20, device=DEV))


def test_written_arguments_follow_pointers_to_stores():
    # offsets reach the stores too; only the tensor arguments among these are copied back
    assert written_arguments(add_one_kernel.fn) & {"x_ptr", "y_ptr"} == {"y_ptr"}
    assert written_arguments(scale_in_place_kernel.fn.fn) & {"x_ptr"} == {"x_ptr"}


def test_kernel_reading_a_tensor_that_requires_grad_matches_eager():
    def f(x):
        return add_one(x) * x

    compiled, cnt = _compile(f)
    x = torch.randn(9, device=DEV, requires_grad=True)
    got, expected = compiled(x), f(x)
    torch.testing.assert_close(got, expected)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(got_grad, expected_grad)  # the kernel's output has no gradient
    assert cnt.frame_count == 1


def test_kernel_writing_a_tensor_that_requires_grad_breaks_naming_it():
    def f(x):
        n = x.numel()
        scale_in_place_kernel[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, n, 2.0)
        return x

    ember.reset()
    compiled = ember.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakError, match="scale_in_place_kernel may write x_ptr"):
        compiled(torch.randn(4, device=DEV, requires_grad=True))


@torch.library.custom_op("ember_dynamo_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ember_dynamo_test::triple", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@triple.register_fake
def _(x):
    return torch.empty_like(x)


OP = double


def test_custom_op_is_guarded_by_identity():
    def f(x):
        return OP(x) + 1

    global OP
    compiled, cnt = _compile(f)
    x = torch.randn(5, device=DEV)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    try:
        OP = triple
        torch.testing.assert_close(compiled(x), x * 3 + 1)
    finally:
        OP = double
    assert cnt.frame_count == 2


def test_custom_op_without_autograd_raises_under_fullgraph_naming_it():
    ember.reset()
    compiled = ember.compile(lambda x: double(x) + 1, backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakError, match="ember_dynamo_test::double needs a gradient"):
        compiled(torch.randn(3, requires_grad=True))


def test_kernel_writing_memory_another_argument_reads_breaks():
    def f(x):
        add_one_kernel[(1,)](x[:4], x[2:6], 4, BLOCK=8)  # overlapping: reads what it writes
        return x * 2

    ember.reset()
    compiled = ember.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakError, match="shares memory"):
        compiled(torch.randn(8, device=DEV))
