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


def _cache_tensors(cache):
    out = []
    for part in (cache.self_attention_cache, cache.cross_attention_cache):
        for layer in part.layers:
            out += [layer.keys, layer.values]
    return out


_SEQ2SEQ = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100,
                max_position_embeddings=32, use_cache=True)  # fmt: skip


def _seq2seq_cases():
    text = lambda: {"input_ids": torch.randint(3, 100, (2, 8)),  # noqa: E731
                    "decoder_input_ids": torch.randint(3, 100, (2, 4))}  # fmt: skip
    speech = lambda: {"input_features": torch.randn(2, 8, 32),  # noqa: E731
                      "decoder_input_ids": torch.randint(3, 100, (2, 4))}  # fmt: skip
    whisper = dict(_SEQ2SEQ, num_mel_bins=8, max_source_positions=16, max_target_positions=16,
                   pad_token_id=1, bos_token_id=2, eos_token_id=2,
                   decoder_start_token_id=2)  # fmt: skip
    return [
        ("mbart", lambda: T.MBartConfig(**_SEQ2SEQ), T.MBartForConditionalGeneration, text),
        ("whisper", lambda: T.WhisperConfig(**whisper), T.WhisperModel, speech),
    ]


@pytest.mark.parametrize("name,make_config,cls,make_inputs", _seq2seq_cases(),
                         ids=[c[0] for c in _seq2seq_cases()])  # fmt: skip
def test_hf_encoder_decoder_with_cache_one_graph(name, make_config, cls, make_inputs):
    """With use_cache=True the model builds a DynamicCache from
    `config.get_text_config(decoder=True)`: a deep copy of the config whose fields are renamed
    through its own __getattribute__/__setattr__ and delattr, all traced into the one graph."""
    ember.reset()
    torch.manual_seed(0)
    model = cls(make_config()).eval()
    inputs = make_inputs()
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ref = model(**inputs)
        out = compiled(**inputs)
        again = compiled(**inputs)
    assert cnt.frame_count == 1, convert.stats.breaks + convert.stats.failures
    assert not convert.stats.breaks and not convert.stats.failures
    for got in (out, again):
        assert type(got) is type(ref)
        torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0)
        for g, r in zip(_cache_tensors(got.past_key_values), _cache_tensors(ref.past_key_values)):
            torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_hf_wav2vec2_one_graph():
    """transformers' install probes (lru_cache'd, marked as constant results) are answered
    while tracing instead of breaking the graph."""
    ember.reset()
    torch.manual_seed(0)
    config = T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, conv_dim=(8, 8), conv_stride=(5, 2),
                              conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                              num_conv_pos_embedding_groups=2)  # fmt: skip
    model = T.Wav2Vec2Model(config).eval()
    x = torch.randn(2, 800)
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ref = model(x)
        out = compiled(x)
    assert cnt.frame_count == 1, convert.stats.breaks + convert.stats.failures
    assert not convert.stats.breaks and not convert.stats.failures
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=0, atol=0)
