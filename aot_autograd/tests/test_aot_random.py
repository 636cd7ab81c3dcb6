"""Random ops: per-call seeds from torch's RNG; the backward sees the forward's random values."""

import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F

from ember.aot_autograd import (
    aot_eager,
    aot_function,
    default_partition,
    min_cut_partition,
    run_as_fx,
)
from ember.aot_autograd.partition import op_tags

_spec = importlib.util.spec_from_file_location(
    "ember_aot_test_models", pathlib.Path(__file__).with_name("models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


@pytest.mark.parametrize("partition_fn", [min_cut_partition, default_partition])
def test_dropout_mask_agrees_between_forward_and_backward(partition_fn):
    def fn(x, w):
        return F.dropout(x @ w, p=0.5, training=True)

    torch.manual_seed(0)
    x, w = torch.randn(16, 8), torch.randn(8, 32, requires_grad=True)
    compiled = aot_function(fn, run_as_fx, partition_fn=partition_fn)
    y = compiled(x, w)
    y.sum().backward()
    kept = (y != 0).to(x.dtype)
    assert 0.35 < kept.mean().item() < 0.65
    torch.testing.assert_close(y, (x @ w.detach()) * kept * 2.0)
    # d(sum y)/dw = x^T (2 * mask): the backward used the very mask the forward drew.
    torch.testing.assert_close(w.grad, x.t() @ (kept * 2.0))
    if partition_fn is min_cut_partition:
        bw = compiled.last_graphs["backward"]
        assert any("random" in op_tags(n) for n in bw.graph.nodes), "mask was not recomputed"


def test_calls_differ_and_manual_seed_replays():
    def fn(x):
        return F.dropout(x, p=0.5, training=True)

    compiled = aot_function(fn, run_as_fx)
    x = torch.ones(256, requires_grad=True)
    torch.manual_seed(3)
    a, b = compiled(x), compiled(x)
    torch.manual_seed(3)
    c = compiled(x)
    assert not torch.equal(a, b)
    assert torch.equal(a, c)
    assert compiled.trace_count == 1


def test_rand_like_and_inference():
    def fn(x):
        return x + torch.rand_like(x)

    compiled = aot_function(fn, run_as_fx)
    x = torch.zeros(1000)
    with torch.no_grad():
        y = compiled(x)
    assert 0.0 <= y.min().item() and y.max().item() < 1.0
    assert abs(y.mean().item() - 0.5) < 0.05


def test_gpt2_with_dropout_trains_deterministically_per_seed():
    model, inputs, loss_fn = models.make("gpt2", dropout=0.1)
    model.train()
    compiled = aot_eager(model, list(inputs))

    def step(seed):
        torch.manual_seed(seed)
        loss = loss_fn(compiled(*inputs))
        model.zero_grad()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_a, grads_a = step(0)
    loss_b, grads_b = step(0)
    loss_c, _ = step(1)
    assert torch.equal(loss_a, loss_b)
    for ga, gb in zip(grads_a, grads_b):
        assert torch.equal(ga, gb)
    assert not torch.equal(loss_a, loss_c)
    model.eval()  # without dropout the compiled model matches eager
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=2e-4, rtol=2e-4)
