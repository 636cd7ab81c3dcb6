"""Pooling compiles to one fused pointwise kernel: k*k loads, no (..., k*k) window buffer, no
scatter fallback in the backward."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from ember.inductor import compile_fx, config, metrics
from inductor_helpers import check
from torch import nn


def _buffers(source):
    """The sizes of every buffer the wrapper allocates."""
    return [
        tuple(int(s) for s in m.group(1).split(",") if s.strip())
        for m in re.finditer(r"empty_strided\(\(([\d, ]*)\)", source)
    ]


def _loads(source, arg="in_ptr0"):
    return len(re.findall(rf"\b{arg}\[", source))


def test_max_pool2d_values_is_one_kernel_with_k_squared_loads():
    x = torch.randn(2, 4, 12, 11)
    compiled = check(lambda a: F.max_pool2d(a, 3, 2, 1), x, kernels=1)
    assert _buffers(compiled.source) == [(2, 4, 6, 6)], compiled.source
    assert _loads(compiled.source) == 9, compiled.source  # each padded slice read once
    # Only values asked for: the index chain is dead, one select per offset after the first remains.
    assert len(re.findall(r"\? tmp\d+ : tmp\d+", compiled.source)) == 8, compiled.source


def test_max_pool2d_with_indices_is_one_kernel():
    x = torch.randn(2, 4, 12, 11)
    compiled = check(lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True), x, kernels=1)
    assert sorted(_buffers(compiled.source)) == [(2, 4, 6, 6)] * 2, compiled.source
    assert _loads(compiled.source) == 9, compiled.source


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation,ceil_mode",
    [
        (2, 2, 0, 1, False),
        (3, 1, 1, 1, False),
        (3, 2, 1, 2, True),
        ((2, 3), (2, 1), (1, 1), 1, True),
    ],
)
def test_max_pool2d_configs_match_eager(kernel, stride, padding, dilation, ceil_mode):
    x = torch.randn(2, 3, 9, 8).round()  # ties: the first maximum wins
    x[0, 0, 3, 3] = float("nan")
    fn = lambda a: F.max_pool2d(a, kernel, stride, padding, dilation, ceil_mode, True)  # noqa: E731
    check(fn, x, kernels=1)
    check(fn, torch.randint(-5, 5, (2, 3, 9, 8)), kernels=1)


def test_max_pool3d_and_avg_pool_are_one_kernel():
    check(lambda a: F.max_pool3d(a, 2, 2, 1, return_indices=True), torch.randn(1, 2, 5, 6, 4),
          kernels=1)  # fmt: skip
    # 3x3x3 with ties (int64): first maxima, as torch picks them
    check(lambda a: F.max_pool3d(a, 3, 2, 1, 1, True, True), torch.randint(-9, 9, (1, 2, 3, 6, 5)),
          kernels=1)  # fmt: skip
    compiled = check(lambda a: F.avg_pool2d(a, 3, 2, 1, count_include_pad=False),
                     torch.randn(2, 3, 9, 8), kernels=1)  # fmt: skip
    assert _buffers(compiled.source) == [(2, 3, 5, 4)], compiled.source


def _max_pool_grad(kernel, stride, padding, dilation=1, ceil_mode=False):
    def step(a, w):
        a = a.detach().requires_grad_()
        out = F.max_pool2d(a, kernel, stride, padding, dilation, ceil_mode)
        return torch.autograd.grad((out * w).sum(), a)

    return step


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation,ceil_mode",
    [(3, 2, 1, 1, False), (3, 1, 1, 1, True), (2, 2, 0, 1, False), (3, 2, 0, 2, True)],
)
def test_max_pool2d_backward_gathers_without_scatter(kernel, stride, padding, dilation, ceil_mode):
    x = torch.randn(2, 3, 9, 8).round()  # ties and overlapping windows picking one element
    out = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
    w = torch.randn(out.shape)
    compiled = check(_max_pool_grad(kernel, stride, padding, dilation, ceil_mode), x, w)
    assert tuple(x.shape) not in [b[:4] for b in _buffers(compiled.source) if len(b) == 5]
    assert metrics.fallbacks == []


def test_conv_bn_relu_maxpool_training_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(4 * 5 * 5, 3),
    )  # fmt: skip
    x = torch.randn(2, 3, 10, 10)
    twin = copy.deepcopy(model)
    metrics.reset()
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x])
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for _ in range(2):
        for m, o, run in ((model, opt, compiled), (twin, opt_ref, twin)):
            o.zero_grad()
            run(x).square().mean().backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)
    assert metrics.fallbacks == []


def test_triton_max_pool_is_one_kernel_with_k_squared_loads(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    x = torch.randn(1, 2, 6, 5)
    compiled = check(lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True), x, kernels=1)
    assert len(re.findall(r"tl\.load\(in_ptr0", compiled.source)) == 9, compiled.source
