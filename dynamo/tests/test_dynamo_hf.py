"""Tiny HuggingFace models (when transformers is installed): one graph each, same outputs, a
real ModelOutput back, and gradients through the graph."""

import warnings

import pytest
import torch

import ember
from ember.dynamo import CompileCounter, convert

T = pytest.importorskip("transformers")


def _configs():
    small = dict(vocab_size=100, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=16, hidden_size=32)  # fmt: skip
    return [
        ("gpt2", lambda: T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=16), T.GPT2LMHeadModel),  # fmt: skip
        ("bert", lambda: T.BertConfig(**small), T.BertModel),
        ("llama", lambda: T.LlamaConfig(num_key_value_heads=2, **small), T.LlamaForCausalLM),
    ]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name,make_config,cls", _configs(), ids=[c[0] for c in _configs()])
def test_hf_model_one_graph(name, make_config, cls, attn):
    ember.reset()
    torch.manual_seed(0)
    config = make_config()
    config._attn_implementation = attn
    model = cls(config).eval()
    ids = torch.randint(0, 100, (2, 8))
    inputs = {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    if name != "bert":
        inputs["labels"] = ids
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(**inputs)
        ref = model(**inputs)
        again = compiled(**inputs)
    assert type(out) is type(ref)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(again[0], ref[0])
    assert cnt.frame_count == 1, convert.stats.breaks + convert.stats.failures
    assert not convert.stats.breaks and not convert.stats.failures
    if name != "bert":
        out.loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        ref.loss.backward()
        for g, p in zip(grads, [p for p in model.parameters() if p.grad is not None]):
            torch.testing.assert_close(g, p.grad)
