"""The gpu-broad suite's models beyond gpu-core: 45 timm and transformers architectures, each
built from a config with random weights (no downloads) and tagged with its family.

Ember was never tuned on these: they are the held-out half of the inference race against
torch.compile's CUDA graphs. Configs name only fields that exist in transformers 5.17 and timm
1.0.29 (the GPU host's versions): rope settings, for one, keep their defaults, because 5.x moved
them into `rope_parameters` and the old keywords are accepted only for some models.
"""

import torch

# One family per model (`ModelSpec.family`); `--list` groups by it. Traits a model shares with
# another family (GQA in a sliding-window decoder, say) go into its tags.
FAMILIES = {
    "cnn-plain": "plain convolutional networks (dense 3x3 convolutions, residual or not)",
    "cnn-grouped": "grouped convolutions (ResNeXt, RegNet, split attention)",
    "cnn-depthwise": "depthwise-separable and inverted-residual convolutions",
    "cnn-dense": "densely connected / aggregating convolutions (DenseNet, DLA)",
    "cnn-multibranch": "multi-branch and multi-resolution convolutions (HRNet, Inception)",
    "vit-absolute": "vision transformers with absolute position embeddings",
    "vit-relative": "vision transformers with relative position bias or rotary embeddings",
    "vit-windowed": "vision transformers with windowed (shifted-window) attention",
    "mlp-only": "all-MLP vision models (token mixing by MLPs or spatial gating)",
    "hybrid": "hybrid convolution + attention vision models",
    "text-encoder": "BERT-like encoders",
    "text-encoder-disentangled": "encoders with disentangled content/position attention",
    "text-encoder-bottleneck": "encoders with bottleneck or grouped-convolution layers",
    "text-encoder-local": "encoders with local (sliding-window or convolutional) mixing",
    "text-decoder": "decoders with learned absolute positions",
    "text-decoder-rotary": "decoders with rotary position embeddings",
    "text-decoder-alibi": "decoders with ALiBi attention biases",
    "text-decoder-gqa": "decoders with grouped- or multi-query attention (fewer KV heads)",
    "text-decoder-sliding": "decoders with sliding-window attention",
    "text-encoder-decoder": "encoder-decoder (seq2seq) language models",
    "speech-encoder": "speech encoders on raw audio or log-mel features",
}

# gpu-core's models, by family (their specs live in models.py).
CORE_FAMILIES = {
    "resnet50": "cnn-plain",
    "vit_base_patch16_224": "vit-absolute",
    "mobilenetv3_large_100": "cnn-depthwise",
    "efficientnet_b0": "cnn-depthwise",
    "convnext_tiny": "cnn-depthwise",
    "swin_tiny_patch4_window7_224": "vit-windowed",
    "deit_small_patch16_224": "vit-absolute",
    "regnety_016": "cnn-grouped",
    "mobilevit_s": "hybrid",
    "efficientformer_l1": "hybrid",
    "bert-base-uncased": "text-encoder",
    "gpt2": "text-decoder",
    "distilbert-base-uncased": "text-encoder",
    "roberta-base": "text-encoder",
    "t5-small": "text-encoder-decoder",
    "bart-base": "text-encoder-decoder",
    "llama-4l-1024": "text-decoder-gqa",
    "albert-base-v2": "text-encoder",
    "electra-small": "text-encoder",
}

# (timm name, family, native resolution): batch 32 at that resolution, like gpu-core.
TIMM = (
    ("vgg16_bn", "cnn-plain", 224),
    ("cspdarknet53", "cnn-plain", 256),
    ("resnext50_32x4d", "cnn-grouped", 224),
    ("resnest50d", "cnn-grouped", 224),
    ("mobilenetv2_100", "cnn-depthwise", 224),
    ("ghostnet_100", "cnn-depthwise", 224),
    ("mixnet_s", "cnn-depthwise", 224),
    ("densenet121", "cnn-dense", 224),
    ("dla34", "cnn-dense", 224),
    ("hrnet_w18_small_v2", "cnn-multibranch", 224),
    ("inception_v3", "cnn-multibranch", 299),
    ("vit_small_patch16_224", "vit-absolute", 224),
    ("cait_xxs24_224", "vit-absolute", 224),
    ("xcit_tiny_12_p16_224", "vit-absolute", 224),
    ("beit_base_patch16_224", "vit-relative", 224),
    ("vit_relpos_small_patch16_224", "vit-relative", 224),
    ("eva02_tiny_patch14_224", "vit-relative", 224),
    ("swinv2_tiny_window8_256", "vit-windowed", 256),
    ("swin_small_patch4_window7_224", "vit-windowed", 224),
    ("mixer_b16_224", "mlp-only", 224),
    ("resmlp_12_224", "mlp-only", 224),
    ("gmlp_s16_224", "mlp-only", 224),
    ("coatnet_0_rw_224", "hybrid", 224),
    ("levit_128", "hybrid", 224),
    ("mobilevitv2_100", "hybrid", 256),
    ("convit_tiny", "hybrid", 224),
    ("efficientformerv2_s1", "hybrid", 224),
    ("maxvit_tiny_tf_224", "hybrid", 224),
)

# transformers: name -> (model class, config class, vocab, family, extra tags, encdec, config).
# Decoders that would take minutes to compile at full depth keep their width and get 4-12
# layers (the name says so); vocabularies above ~100k are cut to GPT-2's, so the logits of
# 8 x 512 tokens (and their float64 reference) stay a few GiB.
HF = {
    "deberta-v3-base": ("DebertaV2ForMaskedLM", "DebertaV2Config", 128100,
                        "text-encoder-disentangled", (), False,
                        {"relative_attention": True, "max_relative_positions": -1,
                         "position_buckets": 256, "pos_att_type": ["p2c", "c2p"],
                         "norm_rel_ebd": "layer_norm", "share_att_key": True,
                         "position_biased_input": False, "type_vocab_size": 0,
                         "layer_norm_eps": 1e-7}),
    "mobilebert-uncased": ("MobileBertForMaskedLM", "MobileBertConfig", 30522,
                           "text-encoder-bottleneck", (), False, {}),
    "squeezebert-uncased": ("SqueezeBertForMaskedLM", "SqueezeBertConfig", 30522,
                            "text-encoder-bottleneck", ("grouped-conv",), False, {}),
    "convbert-base": ("ConvBertForMaskedLM", "ConvBertConfig", 30522, "text-encoder-local",
                      ("conv",), False, {}),
    # ModernBERT: rotary, GeGLU, local attention (128) in two of three layers. Its own
    # torch.compile of the MLP (reference_compile) stays off: eager must be eager.
    "modernbert-base": ("ModernBertForMaskedLM", "ModernBertConfig", 50368,
                        "text-encoder-local", ("rotary", "sliding-window"), False,
                        {"reference_compile": False}),
    "pythia-160m": ("GPTNeoXForCausalLM", "GPTNeoXConfig", 50304, "text-decoder-rotary",
                    ("parallel-residual",), False,
                    {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                     "intermediate_size": 3072, "max_position_embeddings": 2048}),
    "phi-4l-2048": ("PhiForCausalLM", "PhiConfig", 51200, "text-decoder-rotary",
                    ("partial-rotary", "parallel-residual"), False,
                    {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4,
                     "num_attention_heads": 32, "max_position_embeddings": 2048}),
    "bloom-12l-1024": ("BloomForCausalLM", "BloomConfig", 50257, "text-decoder-alibi", (), False,
                       {"hidden_size": 1024, "n_layer": 12, "n_head": 16}),
    "mpt-12l-768": ("MptForCausalLM", "MptConfig", 50368, "text-decoder-alibi", (), False,
                    {"d_model": 768, "n_heads": 12, "n_layers": 12, "expansion_ratio": 4,
                     "max_seq_len": 2048}),
    "falcon-4l-2048-mqa": ("FalconForCausalLM", "FalconConfig", 65024, "text-decoder-gqa",
                           ("rotary", "multi-query", "parallel-attention"), False,
                           {"hidden_size": 2048, "num_hidden_layers": 4,
                            "num_attention_heads": 32, "multi_query": True,
                            "parallel_attn": True, "new_decoder_architecture": False,
                            "alibi": False, "bias": False}),
    "mistral-4l-1024-swa": ("MistralForCausalLM", "MistralConfig", 32000,
                            "text-decoder-sliding", ("rotary", "gqa"), False,
                            {"hidden_size": 1024, "intermediate_size": 3584,
                             "num_hidden_layers": 4, "num_attention_heads": 16,
                             "num_key_value_heads": 4, "sliding_window": 256,
                             "max_position_embeddings": 4096}),
    "opt-125m": ("OPTForCausalLM", "OPTConfig", 50272, "text-decoder", (), False, {}),
    "flan-t5-small": ("T5ForConditionalGeneration", "T5Config", 32128, "text-encoder-decoder",
                      ("gated-gelu",), True,
                      {"d_model": 512, "d_kv": 64, "d_ff": 1024, "num_layers": 8,
                       "num_decoder_layers": 8, "num_heads": 6,
                       "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}),
    "marian-6l-512": ("MarianMTModel", "MarianConfig", 58101, "text-encoder-decoder",
                      ("sinusoidal",), True,
                      {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
                       "encoder_attention_heads": 8, "decoder_attention_heads": 8,
                       "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
                       "max_position_embeddings": 512, "pad_token_id": 58100,
                       "decoder_start_token_id": 58100}),
    "pegasus-6l-768": ("PegasusForConditionalGeneration", "PegasusConfig", 96103,
                       "text-encoder-decoder", ("sinusoidal", "pre-norm"), True,
                       {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
                        "encoder_attention_heads": 12, "decoder_attention_heads": 12,
                        "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072,
                        "max_position_embeddings": 1024}),
}  # fmt: skip

AUDIO_SECONDS = 5  # wav2vec2: 8 clips of 5 s of 16 kHz audio (249 frames after its conv stack)
WHISPER_FRAMES = 3000  # whisper's encoder takes exactly 30 s of 10 ms log-mel frames


def _audio(batch, seq, gen):
    return (torch.randn(batch, seq, generator=gen),)


def _mel(batch, seq, gen):
    return (torch.randn(batch, 80, WHISPER_FRAMES, generator=gen),)


def _spec(name, build, make_inputs, batch, seq, family, tags, requires):
    from models import ModelSpec

    return ModelSpec(name, build, make_inputs, batch, seq, requires=requires,
                          tags=frozenset({family, *tags}), family=family)  # fmt: skip


def specs():
    """The new models' specs, by name, in suite order (timm, then transformers)."""
    import models as base  # here, not at the top: models.py imports this module while loading

    out = []
    for name, family, res in TIMM:
        # num_classes: every model ends in a 1000-class head (eva02_tiny defaults to none)
        build = base._timm(name, num_classes=1000)
        out.append(_spec(name, build, base._images(res), 32, 0, family,
                         ("vision",), ("timm",)))  # fmt: skip
    for name, (model_cls, config_cls, vocab, family, tags, encdec, config) in HF.items():
        inputs = ("input_ids", "decoder_input_ids") if encdec else ("input_ids",)
        build = base._hf(model_cls, config_cls, inputs, vocab_size=vocab, **config)
        out.append(_spec(name, build, base._tokens(vocab, len(inputs)), 8, 512, family,
                         ("text", *tags), ("transformers",)))  # fmt: skip
    out.append(_spec(
        "wav2vec2-base", base._hf("Wav2Vec2ForCTC", "Wav2Vec2Config", ("input_values",),
                                  mask_time_prob=0.0, mask_feature_prob=0.0),
        _audio, 8, 16000 * AUDIO_SECONDS, "speech-encoder", ("audio", "conv"),
        ("transformers",),
    ))  # fmt: skip
    out.append(_spec(
        "whisper-base-encoder",
        base._hf("WhisperForAudioClassification", "WhisperConfig", ("input_features",),
                 d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                 num_mel_bins=80, max_source_positions=1500),
        _mel, 8, 0, "speech-encoder", ("audio", "log-mel"), ("transformers",),
    ))  # fmt: skip
    return {s.name: s for s in out}
