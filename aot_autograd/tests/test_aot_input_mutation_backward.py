"""Training programs that mutate an input in place, then use it: values, gradients and the
mutated input against eager (the copy-back must not touch a tensor saved for the backward)."""

import pytest
import torch
import torch.nn as nn

from ember.aot_autograd import aot_function, aot_module, default_partition, min_cut_partition
from ember.aot_autograd import run_as_fx

PARTITIONERS = [min_cut_partition, default_partition]


def _copies(inputs):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]


def _compare(fn, inputs, partition_fn, calls=2):
    """Eager and compiled on separate copies, `calls` steps each: outputs, grads, the inputs."""
    eager_in, aot_in = _copies(inputs), _copies(inputs)
    compiled = aot_function(fn, run_as_fx, partition_fn=partition_fn)
    for _ in range(calls):
        expected, actual = fn(*eager_in), compiled(*aot_in)
        torch.testing.assert_close(actual, expected)
        expected.sum().backward()
        actual.sum().backward()
    for e, a in zip(eager_in, aot_in):
        torch.testing.assert_close(a.detach(), e.detach())  # mutated exactly as in eager
        if e.requires_grad:
            torch.testing.assert_close(a.grad, e.grad)
    assert compiled.trace_count == 1
    return compiled


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True),
            torch.randn(4, 3)]  # fmt: skip


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_mutated_input_used_after_the_mutation(partition_fn):
    def fn(x, w, buf):
        buf.add_(1)
        return (x @ w).tanh() * buf

    compiled = _compare(fn, _inputs(), partition_fn)
    # The backward reads the mutation's result, never the input the copy-back overwrites.
    fw = compiled.last_graphs["forward"]
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    saved = list(fw.graph.output_node().args[0])[2:]
    assert placeholders[2] not in saved


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_mutated_input_used_before_the_mutation(partition_fn):
    # Eager saves the (4, 3) exp; the min-cut partitioner would rather save the (3,) buf and
    # recompute the exp, but the copy-back overwrites buf: the forward saves a copy of it.
    def fn(x, w, buf):
        y = (x @ w) * (buf + torch.zeros(4, 1)).exp()
        buf.mul_(2)
        return y.sin() + buf

    torch.manual_seed(0)
    inputs = [torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True),
              torch.randn(3)]  # fmt: skip
    compiled = _compare(fn, inputs, partition_fn)
    if partition_fn is min_cut_partition:
        assert "prims_clone(primals_3)" in compiled.last_graphs["forward"].code


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_view_of_mutated_input_saved(partition_fn):
    # Views of the input feed a matmul whose backward needs them (eager saves the sums).
    def fn(x, w, buf):
        y = x @ (w * buf.t()[:2].t()[:, :1].sum())
        z = x[:, :3] @ (buf.t() + 1)
        buf.add_(0.5)
        return y.sum(1, keepdim=True) * z

    torch.manual_seed(0)
    inputs = [torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True),
              torch.randn(4, 3)]  # fmt: skip
    _compare(fn, inputs, partition_fn)


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_input_mutated_through_a_view(partition_fn):
    def fn(x, w, buf):
        buf[:, 1:].mul_(3)
        buf.t()[0].add_(1)
        return (x @ w) * buf

    _compare(fn, _inputs(), partition_fn)


def test_module_buffer_mutated_then_used():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 3)
            self.register_buffer("scale", torch.ones(3))

        def forward(self, x):
            self.scale.mul_(1.5)
            return self.lin(x).tanh() * self.scale

    torch.manual_seed(0)
    eager = Scaled()
    model = Scaled()
    model.load_state_dict(eager.state_dict())
    compiled = aot_module(model, run_as_fx)
    x = torch.randn(4, 5)
    for _ in range(2):
        expected, actual = eager(x), compiled(x)
        torch.testing.assert_close(actual, expected)
        expected.sum().backward()
        actual.sum().backward()
    torch.testing.assert_close(model.scale, eager.scale)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
