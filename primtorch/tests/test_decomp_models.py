"""Forward + backward of small resnet50 / vit_base / bert / gpt2 traced to prims, against eager."""

from __future__ import annotations

import operator

import pytest
import torch

import models
from ember.primtorch import Tracer, is_extern, is_prim
from ember.primtorch.prims.extern import ATEN_TO_EXTERN


def _loss(out):
    return out if out.ndim == 0 else out.float().sum()


def trace_train_step(model, inputs):
    """Trace loss and parameter grads (and new buffer values) into one graph of prims."""
    params = list(model.parameters())
    buffers = list(model.buffers())
    tracer = Tracer()
    for i, t in enumerate(params + buffers + list(inputs)):
        tracer.placeholder(t, f"in{i}")
    with tracer:
        loss = _loss(model(*inputs))
        grads = torch.autograd.grad(loss, params)
    mutated = [t for node, t in tracer.inputs.items() if node in tracer.mutated_inputs]
    mutated_index = [next(i for i, b in enumerate(buffers) if b is t) for t in mutated]
    gm = tracer.output((loss, grads, mutated))
    return gm, len(params), mutated_index


def eager_train_step(model, inputs):
    loss = _loss(model(*inputs))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return loss, grads, [b.clone() for b in model.buffers()]


def _fresh(name, **overrides):
    model, inputs = models.make(name, **overrides)
    return model.train(), inputs


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _replay(gm, model, inputs):
    return gm(*list(model.parameters()), *list(model.buffers()), *inputs)


@pytest.mark.parametrize("name", ["resnet50", "vit_base", "bert", "gpt2_no_dropout"])
def test_model_matches_eager(name):
    base = name.removesuffix("_no_dropout")
    kwargs = {"dropout": 0.0} if name.endswith("_no_dropout") else {}
    model, inputs = _fresh(base, **kwargs)
    gm, _, mutated_index = trace_train_step(model, inputs)
    for target in _targets(gm):
        assert is_prim(target) or is_extern(target) or target is operator.getitem, target
    externs = {t.name for t in _targets(gm) if is_extern(t)}
    assert externs <= {p.name for p, _ in ATEN_TO_EXTERN.values()}

    model_r, inputs_r = _fresh(base, **kwargs)
    loss, grads, new_buffers = _replay(gm, model_r, inputs_r)
    model_e, inputs_e = _fresh(base, **kwargs)
    loss_e, grads_e, buffers_e = eager_train_step(model_e, inputs_e)
    torch.testing.assert_close(loss, loss_e, rtol=1e-4, atol=1e-5)
    for g, e in zip(grads, grads_e, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-5)
    for value, i in zip(new_buffers, mutated_index, strict=True):
        torch.testing.assert_close(value, buffers_e[i], rtol=1e-4, atol=1e-6)
    if base == "resnet50":
        assert len(mutated_index) > 0  # BatchNorm running statistics are returned, not lost


def test_gpt2_dropout_is_counter_based():
    model, inputs = _fresh("gpt2")
    gm, _, _ = trace_train_step(model, inputs)
    names = [t.name for t in _targets(gm) if is_prim(t)]
    assert "philox_rand" in names
    # The graph is a pure function: two replays give the same loss and grads.
    first = _replay(gm, *_fresh("gpt2"))
    second = _replay(gm, *_fresh("gpt2"))
    torch.testing.assert_close(first[0], second[0], rtol=0, atol=0)
    for a, b in zip(first[1], second[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Dropout is active: the loss differs from the dropout-free model's.
    no_drop = eager_train_step(*_fresh("gpt2", dropout=0.0))[0]
    assert torch.isfinite(first[0]) and not torch.equal(first[0], no_drop)


def test_native_dropout_statistics():
    from ember.primtorch import trace_to_prims

    x = torch.ones(64, 64)
    gm = trace_to_prims(lambda t: torch.ops.aten.native_dropout(t, 0.25, True), x)
    out, mask = gm(x)
    kept = mask.float().mean().item()
    assert 0.70 < kept < 0.80
    torch.testing.assert_close(out, mask.float() / 0.75)
