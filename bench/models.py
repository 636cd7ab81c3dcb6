"""The benchmark models: each is built from a config with random weights (no downloads) and comes
with a function that makes its example inputs.

`MODELS[name]` is a `ModelSpec`. `build()` returns an `nn.Module` (or, for the overhead and
roofline kernels, a plain function) on the CPU; the caller seeds torch first so every backend sees
the same weights. Modules return one tensor: transformers models are wrapped in `HFAdapter`, which
maps positional tensors to keyword inputs and returns the logits.
"""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

import small_models
import torch
from torch import nn

IMAGE = 224


@dataclass(frozen=True)
class ModelSpec:
    """How to build one benchmark model and its inputs."""

    name: str
    build: Callable[[], object]
    make_inputs: Callable[[int, int, torch.Generator], tuple]
    batch: int
    seq: int = 0
    requires: tuple = ()
    kernel: bool = False  # a bare kernel (roofline/overhead): casts inputs instead of autocast
    note: str = ""
    tags: frozenset = field(default_factory=frozenset)
    family: str = ""  # architecture family (models_broad.FAMILIES); --list groups by it

    def describe(self, batch=None, seq=None):
        """A short shape note for the table, e.g. 'b=32' or 'b=8 s=512'."""
        b, s = batch or self.batch, seq or self.seq
        if self.kernel:
            return f"{b}x{s}" if s else f"n={b}"
        return f"b={b}" + (f" s={s}" if s else "")


def missing_requirements(spec):
    """The names of the packages `spec` needs that cannot be imported here."""
    missing = []
    for name in spec.requires:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
                continue
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - there but broken (timm without torchvision)
            missing.append(f"{name} ({type(e).__name__}: {str(e)[:80]})")
    return missing


def disable_dropout(module):
    """Zero every dropout/drop-path probability, so outputs are deterministic across backends."""
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        if isinstance(getattr(m, "drop_prob", None), float):
            m.drop_prob = 0.0
    return module


def _images(res=IMAGE):
    def make(batch, seq, gen):
        return (torch.randn(batch, 3, res, res, generator=gen),)

    return make


def _tokens(vocab, n_inputs=1, decoder_div=4):
    """Token ids (batch, seq); a second tensor of decoder ids (batch, seq // decoder_div)."""

    def make(batch, seq, gen):
        ids = torch.randint(2, vocab, (batch, seq), generator=gen)
        if n_inputs == 1:
            return (ids,)
        return ids, torch.randint(2, vocab, (batch, max(1, seq // decoder_div)), generator=gen)

    return make


# --------------------------------------------------------------------------------------------
# timm


def _timm(name, **kwargs):
    def build():
        import timm

        return disable_dropout(timm.create_model(name, pretrained=False, **kwargs))

    return build


def _timm_spec(name, batch=32, res=IMAGE, short=None, **kwargs):
    return ModelSpec(
        short or name,
        _timm(name, **kwargs),
        _images(res),
        batch,
        requires=("timm",),
        tags=frozenset({"vision"}),
    )


# --------------------------------------------------------------------------------------------
# transformers


class HFAdapter(nn.Module):
    """Calls a transformers model with keyword inputs and returns its first output (the logits)."""

    def __init__(self, model, input_names):
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)

    def forward(self, *tensors):
        return self.model(**dict(zip(self.input_names, tensors)))[0]


def _hf_config(cls_name, **kwargs):
    import transformers

    config = getattr(transformers, cls_name)(**kwargs)
    for key, value in list(config.to_dict().items()):
        # Every *dropout*, *pdrop* and *layerdrop* probability: dropout would make backends differ.
        if "drop" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    config.use_cache = False
    return config


def _hf(model_cls, config_cls, inputs=("input_ids",), **config):
    def build():
        import transformers

        model = getattr(transformers, model_cls)(_hf_config(config_cls, **config))
        return HFAdapter(disable_dropout(model), inputs)

    return build


def _hf_spec(name, model_cls, config_cls, vocab, batch=8, seq=512, encdec=False, **config):
    inputs = ("input_ids", "decoder_input_ids") if encdec else ("input_ids",)
    return ModelSpec(
        name,
        _hf(model_cls, config_cls, inputs, vocab_size=vocab, **config),
        _tokens(vocab, len(inputs)),
        batch,
        seq,
        requires=("transformers",),
        tags=frozenset({"text"}),
    )


BART_BASE = {
    "d_model": 768,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 12,
    "decoder_attention_heads": 12,
    "encoder_ffn_dim": 3072,
    "decoder_ffn_dim": 3072,
}
ALBERT_BASE = {
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "embedding_size": 128,
}
LLAMA_4L = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
ROBERTA_BASE = {
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "pad_token_id": 1,
    "layer_norm_eps": 1e-5,
}

# Small configs of the same architectures, for the CPU suite.
TINY_ENC = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 512,
}
TINY = {
    "hf_bert": ("BertForMaskedLM", "BertConfig", 1000, TINY_ENC, False),
    "hf_gpt2": (
        "GPT2LMHeadModel",
        "GPT2Config",
        1000,
        {"n_embd": 128, "n_layer": 2, "n_head": 2},
        False,
    ),
    "hf_distilbert": (
        "DistilBertForMaskedLM",
        "DistilBertConfig",
        1000,
        {"dim": 128, "n_layers": 2, "n_heads": 2, "hidden_dim": 512},
        False,
    ),
    "hf_t5": (
        "T5ForConditionalGeneration",
        "T5Config",
        1000,
        {"d_model": 128, "d_kv": 32, "d_ff": 512, "num_layers": 2, "num_heads": 4},
        True,
    ),
    "hf_bart": (
        "BartForConditionalGeneration",
        "BartConfig",
        1000,
        {
            "d_model": 128,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 512,
            "decoder_ffn_dim": 512,
        },
        True,
    ),
    "hf_llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        1000,
        {
            "hidden_size": 128,
            "intermediate_size": 352,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        False,
    ),
}


# --------------------------------------------------------------------------------------------
# overhead and roofline kernels (plain functions; the names show up in tables)


def add_one(x):
    """The one-op function of the overhead suite."""
    return x + 1


def pointwise(x, y):
    """Roofline: one fused pointwise kernel reads x and y and writes one output."""
    return x * 2 + y


def row_sum(x):
    """Roofline: a reduction over the last dimension."""
    return x.sum(dim=-1)


def softmax(x):
    """Roofline: softmax over the last dimension."""
    return torch.softmax(x, dim=-1)


def layer_norm(x, weight, bias):
    """Roofline: layer norm over the last dimension."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias)


def _rows(n_extra=0):
    """(rows, cols) tensor, plus `n_extra` vectors of length cols (e.g. layer-norm weight, bias)."""

    def make(rows, cols, gen):
        x = torch.randn(rows, cols, generator=gen)
        return (x,) + tuple(torch.randn(cols, generator=gen) for _ in range(n_extra))

    return make


def _pair(rows, cols, gen):
    n = rows * cols
    return torch.randn(n, generator=gen), torch.randn(n, generator=gen)


def _kernel(name, fn, make, rows, cols):
    return ModelSpec(name, lambda: fn, make, rows, cols, kernel=True, tags=frozenset({"kernel"}))


def _specs():
    specs = [
        # timm vision models: batch 32 at 224x224
        _timm_spec("resnet50"),
        _timm_spec("vit_base_patch16_224"),
        _timm_spec("mobilenetv3_large_100"),
        _timm_spec("efficientnet_b0"),
        _timm_spec("convnext_tiny"),
        _timm_spec("swin_tiny_patch4_window7_224"),
        _timm_spec("deit_small_patch16_224"),
        _timm_spec("regnety_016"),
        _timm_spec("mobilevit_s", res=256),
        _timm_spec("efficientformer_l1"),
        # transformers: 8 sequences of 512 tokens (decoder inputs of encoder-decoders: 128)
        _hf_spec("bert-base-uncased", "BertForMaskedLM", "BertConfig", 30522),
        _hf_spec("gpt2", "GPT2LMHeadModel", "GPT2Config", 50257),
        _hf_spec("distilbert-base-uncased", "DistilBertForMaskedLM", "DistilBertConfig", 30522),
        _hf_spec("roberta-base", "RobertaForMaskedLM", "RobertaConfig", 50265, **ROBERTA_BASE),
        _hf_spec("t5-small", "T5ForConditionalGeneration", "T5Config", 32128, encdec=True),
        _hf_spec(
            "bart-base",
            "BartForConditionalGeneration",
            "BartConfig",
            50265,
            encdec=True,
            **BART_BASE,
        ),
        _hf_spec("llama-4l-1024", "LlamaForCausalLM", "LlamaConfig", 32000, **LLAMA_4L),
        _hf_spec("albert-base-v2", "AlbertForMaskedLM", "AlbertConfig", 30000, **ALBERT_BASE),
        _hf_spec("electra-small", "ElectraForPreTraining", "ElectraConfig", 30522),
        # small plain-torch models (no dependencies): the CPU suite and its smoke subset
        ModelSpec("small_resnet", small_models.SmallResNet, _images(32), 8),
        ModelSpec("small_vit", small_models.SmallViT, _images(32), 8),
        ModelSpec("small_bert", small_models.SmallBert, _tokens(1000), 4, 64),
        ModelSpec("small_gpt2", small_models.SmallGPT2, _tokens(1000), 4, 64),
        # timm at small sizes for the CPU suite
        _timm_spec("resnet18", batch=4, res=64),
        _timm_spec("mobilenetv3_small_050", batch=4, res=64),
        _timm_spec("deit_tiny_patch16_224", batch=2, short="deit_tiny"),
        # overhead suite: per-call cost
        ModelSpec(
            "add_one",
            lambda: add_one,
            lambda b, s, g: (torch.randn(b, generator=g),),
            16,
            kernel=True,
            note="x + 1, x of 16 floats",
        ),
        ModelSpec(
            "mlp8_w256_b1",
            lambda: small_models.MLP(256, 8),
            lambda b, s, g: (torch.randn(b, 256, generator=g),),
            1,
            note="8 x (Linear(256, 256) + ReLU), batch 1",
        ),
        # roofline kernels: rows x cols elements (pointwise: rows*cols elements in each of x, y)
        _kernel("pointwise_x2_plus_y", pointwise, _pair, 65536, 4096),
        _kernel("row_sum", row_sum, _rows(), 65536, 4096),
        _kernel("softmax", softmax, _rows(), 65536, 4096),
        _kernel("layer_norm", layer_norm, _rows(2), 65536, 4096),
    ]
    for name, (model_cls, config_cls, vocab, config, encdec) in TINY.items():
        specs.append(
            _hf_spec(name, model_cls, config_cls, vocab, batch=4, seq=64, encdec=encdec, **config)
        )
    return {s.name: s for s in specs}


def _all_specs():
    """models.py's specs with gpu-core's families, then gpu-broad's new models (whose builders
    come from this module, hence the late import)."""
    import dataclasses

    import models_broad

    specs = {
        name: dataclasses.replace(spec, family=models_broad.CORE_FAMILIES.get(name, spec.family))
        for name, spec in _specs().items()
    }
    for name, spec in models_broad.specs().items():
        assert name not in specs, f"model {name} is defined twice"
        specs[name] = spec
    return specs


MODELS = _all_specs()
