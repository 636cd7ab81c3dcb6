"""transformers' GPT-2 and BERT under `ember.compile(dynamic=True)`: one symbolic program for
every sequence length (no static fallback, no recompile), outputs equal to eager's.

What these models needed: a hidden size read as a symbol but fixed by the weights (LayerNorm,
Conv1D's addmm) is pinned to its constant in the graph the backend gets; GPT-2's empty
key/value cache tensors (all at storage pointer 0) are not outputs aliasing one another;
`(-1,) + shape[1:]` stays traceable; and attention on torch's math path (what CUDA picks for
BERT's boolean mask) keeps its sizes symbolic.
"""

import contextlib

import pytest
import torch

import ember

transformers = pytest.importorskip("transformers")

LENGTHS = (7, 12, 19, 33)


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _compile_counting(model):
    calls = []

    def counting(gm, example_inputs):
        calls.append(bool(gm.meta.get("ember_symbols")))
        return ember.dynamo.lookup_backend("inductor")(gm, example_inputs)

    counting.ember_supports_dynamic = True
    return ember.compile(model, backend=counting, dynamic=True), calls


def _check_lengths(model, compiled, batch=2):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in LENGTHS:
            ids = torch.randint(2, 100, (batch, t), generator=gen)
            got, want = compiled(input_ids=ids).logits, model(input_ids=ids).logits
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_gpt2_lm_head_one_symbolic_program():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4,
                                     n_positions=64)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled, calls = _compile_counting(model)
    _check_lengths(model, compiled)
    assert calls == [True], calls


@pytest.mark.parametrize("math_attention", [False, True], ids=["default", "math"])
def test_bert_masked_lm_one_symbolic_program(math_attention):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64)  # fmt: skip
    model = transformers.BertForMaskedLM(config).eval()
    compiled, calls = _compile_counting(model)
    with sdpa_kernel([SDPBackend.MATH]) if math_attention else contextlib.nullcontext():
        _check_lengths(model, compiled)
    assert calls == [True], calls


def test_math_attention_with_a_mask_stays_symbolic():
    """Attention with a boolean mask on torch's math path (CUDA's choice for BERT's mask): its C++
    matmuls read the hint sizes in some torch versions; the Python rule keeps them symbolic."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 96)

    def f(x):
        b, t = x.shape[0], x.shape[1]
        q, k, v = lin(x).view(b, t, 3, 2, 16).permute(2, 0, 3, 1, 4)
        mask = (torch.arange(t)[None, None, :, None] >= 1).expand(b, -1, t, t)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (q @ k.transpose(-1, -2)).sum(-1), o.transpose(1, 2).reshape(b, t, -1)

    compiled, calls = _compile_counting(f)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        for t in (5, 9, 12):
            x = torch.randn(3, t, 32)
            torch.testing.assert_close(compiled(x), f(x), atol=1e-5, rtol=1e-5)
    assert calls == [True], calls
