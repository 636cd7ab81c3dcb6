"""Max and average pooling as chains of strided views: values, indices and gradients match eager,
and the graphs hold no stacked window (prims.cat) or scatter."""

import pytest
import torch
import torch.nn.functional as F

from ember.primtorch import is_prim, trace_to_prims

aten = torch.ops.aten

# (kernel, stride, padding, dilation, ceil_mode)
CONFIGS = [
    (2, 2, 0, 1, False),
    (3, 2, 1, 1, False),  # the ResNet stem
    (3, 1, 1, 1, False),
    (3, 2, 1, 2, True),
    ((2, 3), (2, 1), (1, 1), (2, 1), True),
    (3, 3, 1, 1, True),  # ceil_mode with a last window hanging over the input
]
DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _prims(gm):
    return {n.target.name for n in gm.graph.nodes if n.op == "call_function" and is_prim(n.target)}


def _input(dtype, shape=(2, 3, 9, 8)):
    torch.manual_seed(0)
    if dtype == torch.int64:
        return torch.randint(-4, 4, shape)  # ties everywhere, negative values
    return torch.randn(shape).mul(2).round().to(dtype)  # ties


def _same(got, expected):
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_max_pool2d_values_and_indices_match_eager(cfg, dtype):
    x = _input(dtype)
    fn = lambda a: F.max_pool2d(a, *cfg, return_indices=True)  # noqa: E731
    gm = trace_to_prims(fn, x)
    _same(gm(x), fn(x))
    assert not _prims(gm) & {"cat", "amax", "argmax", "gather"}, _prims(gm)


def test_nan_and_infinite_windows_follow_torch():
    x = torch.randn(1, 2, 6, 7)
    x[0, 0, 1, 1] = x[0, 0, 1, 3] = float("nan")  # several NaNs in a window: the last one wins
    x[0, 1] = -float("inf")  # all -inf: the index is the window's first element inside the input
    x[0, 0, 4, :] = float("inf")
    for cfg in CONFIGS[:5]:
        fn = lambda a: F.max_pool2d(a, *cfg, return_indices=True)  # noqa: E731
        _same(trace_to_prims(fn, x)(x), fn(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_max_pool1d_and_3d_match_eager(dtype):
    x1, x3 = _input(dtype, (2, 3, 11)), _input(dtype, (1, 2, 5, 6, 7))
    f1 = lambda a: F.max_pool1d(a, 3, 2, 1, 1, True, return_indices=True)  # noqa: E731
    f3 = lambda a: F.max_pool3d(  # noqa: E731
        a, (2, 3, 3), (1, 2, 2), 1, (1, 1, 2), return_indices=True
    )
    _same(trace_to_prims(f1, x1)(x1), f1(x1))
    _same(trace_to_prims(f3, x3)(x3), f3(x3))


def test_values_only_graph_has_no_index_math():
    gm = trace_to_prims(lambda a: F.max_pool2d(a, 3, 2, 1), torch.randn(2, 3, 8, 8))
    assert "iota" not in _prims(gm)
    assert sum(n.target is not None and getattr(n.target, "name", "") == "where"
               for n in gm.graph.nodes) == 8  # fmt: skip


def test_large_windows_keep_the_reduction():
    x = torch.randn(1, 2, 12, 12)
    fn = lambda a: F.max_pool2d(a, 6, 1, 0, return_indices=True)  # noqa: E731
    gm = trace_to_prims(fn, x)
    _same(gm(x), fn(x))
    assert "argmax" in _prims(gm)


def _grad_step(pool):
    def step(a, w):
        a = a.detach().requires_grad_()
        return torch.autograd.grad((pool(a) * w).sum(), a)

    return step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_max_pool2d_backward_matches_eager(cfg, dtype):
    x = _input(dtype)  # ties: windows overlapping on one element accumulate its gradient
    pool = lambda a: F.max_pool2d(a, *cfg)  # noqa: E731
    w = torch.randn(pool(x).shape).to(dtype)
    step = _grad_step(pool)
    gm = trace_to_prims(step, x, w)
    assert "scatter_add" not in _prims(gm)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(gm(x, w), step(x, w), **tol)


def test_max_pool3d_backward_matches_eager():
    x = _input(torch.float32, (1, 2, 5, 6, 7))
    pool = lambda a: F.max_pool3d(a, (2, 3, 3), (1, 2, 1), 1)  # noqa: E731
    w = torch.randn(pool(x).shape)
    step = _grad_step(pool)
    gm = trace_to_prims(step, x, w)
    assert "scatter_add" not in _prims(gm)
    torch.testing.assert_close(gm(x, w), step(x, w))


def test_backward_with_many_overlapping_windows_scatters():
    x = torch.randn(1, 1, 16, 16)
    pool = lambda a: F.max_pool2d(a, 6, 1)  # noqa: E731  (36 windows cover an element)
    w = torch.randn(pool(x).shape)
    step = _grad_step(pool)
    gm = trace_to_prims(step, x, w)
    assert "scatter_add" in _prims(gm)
    torch.testing.assert_close(gm(x, w), step(x, w))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("cfg", [(2, 2, 0, False), (3, 2, 1, True), ((3, 2), 1, (1, 0), False)])
def test_avg_pool2d_is_a_sum_of_views(cfg, count_include_pad, dtype):
    x = _input(dtype)
    fn = lambda a: F.avg_pool2d(a, *cfg, count_include_pad)  # noqa: E731
    gm = trace_to_prims(fn, x)
    _same([gm(x)], [fn(x)])
    assert not _prims(gm) & {"cat", "sum"}, _prims(gm)


def test_avg_pool_divisor_override_and_backward():
    x = torch.randn(2, 3, 9, 8)
    fn = lambda a: F.avg_pool2d(a, 3, 2, 1, True, False, 5)  # noqa: E731
    torch.testing.assert_close(trace_to_prims(fn, x)(x), fn(x))
    pool = lambda a: F.avg_pool3d(a, 2, 1, 1, False, False)  # noqa: E731
    x3 = torch.randn(1, 2, 4, 5, 3)
    w = torch.randn(pool(x3).shape)
    step = _grad_step(pool)
    torch.testing.assert_close(trace_to_prims(step, x3, w)(x3, w), step(x3, w))

