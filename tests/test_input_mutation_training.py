"""Compiled training steps that mutate an input (an argument, a view of one, a module buffer) and
then use it: outputs, gradients and the mutated tensors against eager, under ember.compile."""

import pytest
import torch
import torch.nn as nn

import ember


def mutate_then_use(x, w, buf):
    buf.add_(1)
    return (x @ w).tanh() * buf


def mutate_view_then_use(x, w, buf):
    buf[:, 1:].mul_(2)
    return (x @ w).tanh() * buf


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True),
            torch.randn(4, 3)]  # fmt: skip


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [mutate_then_use, mutate_view_then_use])
def test_mutated_argument_then_backward(backend, fn):
    eager_in, comp_in = _inputs(), _inputs()
    compiled = ember.compile(fn, backend=backend)
    for _ in range(2):
        want, got = fn(*eager_in), compiled(*comp_in)
        torch.testing.assert_close(got, want)
        want.sum().backward()
        got.sum().backward()
    for e, c in zip(eager_in, comp_in):
        torch.testing.assert_close(c.detach(), e.detach())
        if e.requires_grad:
            torch.testing.assert_close(c.grad, e.grad)


class ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x):
        self.scale.mul_(1.5)
        return self.lin(x).tanh() * self.scale


def test_mutated_buffer_then_backward_inductor():
    torch.manual_seed(0)
    eager, model = ScaledLinear(), ScaledLinear()
    model.load_state_dict(eager.state_dict())
    compiled = ember.compile(model, backend="inductor")
    x = torch.randn(4, 5)
    for _ in range(2):
        want, got = eager(x), compiled(x)
        torch.testing.assert_close(got, want)
        want.sum().backward()
        got.sum().backward()
    torch.testing.assert_close(model.scale, eager.scale)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad)
    torch.testing.assert_close(model.lin.bias.grad, eager.lin.bias.grad)
