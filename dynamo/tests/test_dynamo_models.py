"""Small CPU models of four families are each captured as one graph with no break, and train."""

import copy

import pytest
import torch

import ember
from ember.dynamo import CompileCounter, convert
from dynamo_models import model_cases


@pytest.mark.parametrize("name,build,inputs", model_cases(), ids=[c[0] for c in model_cases()])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_model_one_graph(name, build, inputs, train):
    ember.reset()
    torch.manual_seed(0)
    model = build().train(train)
    ref = copy.deepcopy(model)
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt, fullgraph=True)
    args = inputs()
    torch.manual_seed(1)
    out = compiled(*args)
    torch.manual_seed(1)
    expected = ref(*args)
    flat_out = torch.utils._pytree.tree_leaves(out)
    flat_exp = torch.utils._pytree.tree_leaves(expected)
    for a, b in zip(flat_out, flat_exp):
        torch.testing.assert_close(a, b)
    assert cnt.frame_count == 1
    assert not convert.stats.breaks and not convert.stats.failures
    if train:  # gradients reach the original parameters through the compiled graph
        loss = sum(t.float().sum() for t in flat_out if t.requires_grad)
        loss.backward()
        ref_loss = sum(t.float().sum() for t in flat_exp if t.requires_grad)
        ref_loss.backward()
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=n)
    compiled(*inputs())  # same shapes: a cache hit
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_named_backend_end_to_end(backend):
    """A backend another component provides, found by name (skipped when not installed)."""
    try:
        ember.dynamo.lookup_backend(backend)
    except RuntimeError as e:
        pytest.skip(str(e))
    ember.reset()
    name, build, inputs = model_cases()[3]  # GPT-2-like, with a loss
    torch.manual_seed(0)
    model = build()
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend=backend)
    args = inputs()
    (logits, loss), (ref_logits, ref_loss) = compiled(*args), ref(*args)
    torch.testing.assert_close(logits, ref_logits)
    loss.backward()
    ref_loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
