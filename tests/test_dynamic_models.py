"""Dynamic sequence lengths and batch sizes on small GPT-2, BERT, ViT and ResNet configurations.

ember.compile's automatic dynamic compiles the first size static and, at the first change, one
symbolic program (aot_autograd traces with SymbolicTensors; inductor generates kernels whose sizes
are arguments) that serves every later size: at most two compiles over six sizes, every output
(and, in training, every gradient) equal to eager's, and no new kernels after the symbolic one.
The models have what the benchmark suite's do: 3-d Linears, views with symbolic sizes, a causal
mask sliced from a buffer, an additive padding mask, tied embeddings, GELU, LayerNorm, dropout,
`torch.arange(t)` positions and scaled_dot_product_attention.
"""

import copy

import pytest
import torch
import torch.nn as nn

import aot_models
import ember
from ember.inductor import metrics

SEQ_LENS = (3, 5, 7, 9, 12, 16)
BATCH_SEQ = ((2, 3), (3, 5), (2, 7), (4, 9), (3, 12), (5, 16))


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


M = aot_models.load()  # the small GPT-2, BERT, ViT and ResNet of aot_autograd's tests


def _inputs(name, b, t):
    ids = torch.randint(0, 50, (b, t))
    if name.startswith("gpt2"):
        return (ids,)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, t - 2 :] = 0  # the last sequence is padded
    return ids, mask


MODELS = {
    "gpt2": lambda **kw: M.GPT2(**kw),
    "gpt2_sdpa": lambda **kw: M.GPT2(sdpa=True, **kw),
    "bert": lambda **kw: M.BertEncoder(**kw),
    "bert_sdpa": lambda **kw: M.BertEncoder(sdpa=True, **kw),
}


def _compile_counting(model, backend):
    calls = []

    def counting(gm, example_inputs):
        calls.append(bool(gm.meta.get("ember_symbols")))
        return ember.dynamo.lookup_backend(backend)(gm, example_inputs)

    counting.ember_supports_dynamic = True
    return ember.compile(model, backend=counting), calls


def _loss(out):
    if isinstance(out, tuple):
        return out[0].square().mean() + out[1].sum()
    return out.float().square().mean()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_six_sizes_compile_at_most_twice(name, backend):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    compiled, calls = _compile_counting(model, backend)
    with torch.no_grad():
        for i, (b, t) in enumerate((2, t) for t in SEQ_LENS):
            args = _inputs(name, b, t)
            torch.testing.assert_close(compiled(*args), model(*args), atol=1e-4, rtol=1e-4)
            if i == 1:
                kernels = metrics.generated_kernel_count
    assert calls == [False, True], calls  # static first, then one symbolic program
    assert metrics.generated_kernel_count == kernels  # later sizes reuse the symbolic kernels


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_batch_and_sequence_vary_together(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    compiled, calls = _compile_counting(model, "inductor")
    with torch.no_grad():
        for b, t in BATCH_SEQ:
            args = _inputs(name, b, t)
            torch.testing.assert_close(compiled(*args), model(*args), atol=1e-4, rtol=1e-4)
    assert calls == [False, True], calls


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["gpt2", "bert_sdpa"])
def test_training_gradients_match_eager_for_six_sizes(name, backend):
    torch.manual_seed(0)
    model = MODELS[name]()
    ref = copy.deepcopy(model)
    compiled, calls = _compile_counting(model, backend)
    for t in SEQ_LENS:
        args = _inputs(name, 2, t)
        out = compiled(*args)
        _loss(out).backward()
        want = ref(*args)
        _loss(want).backward()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)
        model.zero_grad()
        ref.zero_grad()
    assert calls == [False, True], calls


@pytest.mark.slow
@pytest.mark.parametrize("model_cls", [M.ResNet, M.ViT], ids=["resnet", "vit"])
def test_training_batch_sizes_compile_at_most_twice(model_cls):
    """Batch sizes in training: BatchNorm's statistics and running-variance correction, and the
    gradients, with the batch size symbolic."""
    torch.manual_seed(0)
    model = model_cls()
    ref = copy.deepcopy(model)
    compiled, calls = _compile_counting(model, "inductor")
    for b in (2, 3, 4, 5, 7, 9):
        x = torch.randn(b, 3, 16, 16)
        out, want = compiled(x), ref(x)
        out.square().mean().backward()
        want.square().mean().backward()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)
        for (n, b1), b2 in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b1, b2, atol=1e-5, rtol=1e-5, msg=n)  # running statistics
        model.zero_grad()
        ref.zero_grad()
    assert calls == [False, True], calls


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_training_with_dropout_compiles_at_most_twice(name):
    """Dropout draws from the compiled program's own generator, so values differ from eager's;
    what must hold is one symbolic program, finite losses and gradients for every size."""
    torch.manual_seed(0)
    model = MODELS[name](dropout=0.1)
    no_dropout = copy.deepcopy(model).eval()
    compiled, calls = _compile_counting(model, "inductor")
    for t in SEQ_LENS:
        args = _inputs(name, 2, t)
        out = compiled(*args)
        with torch.no_grad():
            want = no_dropout(*args)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (out, want))):
            assert a.shape == b.shape and not torch.allclose(a, b)  # dropout did drop
        loss = _loss(out)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        model.zero_grad()
    assert calls == [False, True], calls


def test_huggingface_bert_sequence_lengths_compile_at_most_twice():
    """A tiny transformers BertModel (sdpa attention) when transformers is installed."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=16)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = transformers.BertModel(config).eval()
    compiled, calls = _compile_counting(model, "inductor")
    with torch.no_grad():
        for t in SEQ_LENS:
            ids, mask = _inputs("bert", 2, t)
            got = compiled(input_ids=ids, attention_mask=mask)
            want = model(input_ids=ids, attention_mask=mask)
            torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    assert calls == [False, True], calls
