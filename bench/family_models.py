"""Small representative modules of the model families where Ember lags torch.compile.

Each builder returns (module, inputs) at realistic sizes (batch 32 images, 8x512 tokens) or, with
`small=True`, at sizes a CPU runs in seconds. The op sequences follow timm's and transformers'
own code (MLP-Mixer's token MLP over `x.transpose(1, 2)`, DenseNet's concatenated features, ...);
the transformers families build the library's own layers from a small config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Mlp(nn.Module):
    def __init__(self, dim, hidden, act=nn.GELU):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), act(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MixerBlock(nn.Module):
    """timm's MixerBlock: a token MLP over the transposed sequence, then a channel MLP."""

    def __init__(self, dim, tokens):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.mlp_tokens, self.mlp_channels = Mlp(tokens, tokens // 2), Mlp(dim, dim * 4)

    def forward(self, x):
        x = x + self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp_channels(self.norm2(x))


class Affine(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x)


class ResBlock(nn.Module):
    """timm's ResMLP block: Affine norm, a single token Linear over the transposed sequence."""

    def __init__(self, dim, tokens):
        super().__init__()
        self.norm1, self.norm2 = Affine(dim), Affine(dim)
        self.linear_tokens, self.mlp_channels = nn.Linear(tokens, tokens), Mlp(dim, dim * 4)
        self.ls1 = nn.Parameter(1e-4 * torch.ones(dim))
        self.ls2 = nn.Parameter(1e-4 * torch.ones(dim))

    def forward(self, x):
        x = x + self.ls1 * self.linear_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ls2 * self.mlp_channels(self.norm2(x))


class Stacked(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        return self.blocks(x)


class DenseLayer(nn.Module):
    """torchvision/timm DenseLayer: cat(features) -> BN-ReLU-conv1x1 -> BN-ReLU-conv3x3."""

    def __init__(self, cin, growth, bn_size=4):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features):
        x = torch.cat(features, 1)
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, cin, growth, layers):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def conv_bn(cin, cout, k=1, stride=1, groups=1, relu=True):
    conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
    layers = [conv, nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class HRFuse(nn.Module):
    """HRNet's fuse layer over two resolutions: conv1x1-BN then nearest upsample + add, and a
    strided conv3x3-BN down + add, each followed by ReLU; then an Inception-style cat of
    branches."""

    def __init__(self, c):
        super().__init__()
        self.hi, self.lo = conv_bn(c, c, 3), conv_bn(2 * c, 2 * c, 3)
        self.up, self.down = conv_bn(2 * c, c, 1, relu=False), conv_bn(c, 2 * c, 3, 2, relu=False)
        self.b1, self.b3 = conv_bn(c, c // 2, 1), conv_bn(c, c // 2, 3)
        self.b5 = nn.Sequential(conv_bn(c, c // 4, 1), conv_bn(c // 4, c // 2, 3))
        self.pool = conv_bn(c, c // 2, 1)

    def forward(self, x):
        hi, lo = self.hi(x), self.lo(F.avg_pool2d(torch.cat([x, x], 1), 2))
        hi2 = F.relu(hi + F.interpolate(self.up(lo), scale_factor=2, mode="nearest"))
        lo2 = F.relu(lo + self.down(hi))
        pooled = F.avg_pool2d(hi2, 3, 1, 1)
        cat = torch.cat([self.b1(hi2), self.b3(hi2), self.b5(hi2), self.pool(pooled)], 1)
        return cat, lo2


class Bottleneck(nn.Module):
    """ResNeXt/RegNet bottleneck: conv1x1-BN-ReLU, grouped conv3x3-BN-ReLU, conv1x1-BN, + x."""

    def __init__(self, c, width, groups):
        super().__init__()
        self.a, self.b = conv_bn(c, width, 1), conv_bn(width, width, 3, groups=groups)
        self.c = conv_bn(width, c, 1, relu=False)

    def forward(self, x):
        return F.relu(x + self.c(self.b(self.a(x))))


class LayerNorm2dChannelsLast(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return self.norm(x)


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXt block (channels-last MLP): dwconv7x7, permute, LN, MLP, scale, permute."""

    def __init__(self, c):
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm, self.mlp = nn.LayerNorm(c, eps=1e-6), Mlp(c, 4 * c)
        self.gamma = nn.Parameter(1e-6 * torch.ones(c))

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.mlp(self.norm(x)) * self.gamma
        return x.permute(0, 3, 1, 2) + shortcut


def _transformers_encoder(kind, small):
    """Two layers of a transformers encoder, built from a config (random weights)."""
    import transformers

    hidden, heads = (64, 4) if small else (768, 12)
    if kind == "deberta_v2":
        cfg = transformers.DebertaV2Config(
            hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
            intermediate_size=4 * hidden, relative_attention=True, position_buckets=256,
            pos_att_type=["p2c", "c2p"], max_relative_positions=-1, norm_rel_ebd="layer_norm",
            position_biased_input=False, vocab_size=1000)  # fmt: skip
        model = transformers.DebertaV2Model(cfg)
    elif kind == "mobilebert":
        cfg = transformers.MobileBertConfig(
            num_hidden_layers=2, vocab_size=1000, **({} if not small else dict(
                hidden_size=64, embedding_size=32, intra_bottleneck_size=32,
                intermediate_size=64, num_attention_heads=4, true_hidden_size=32)))  # fmt: skip
        model = transformers.MobileBertModel(cfg, add_pooling_layer=False)
    else:
        cfg = transformers.SqueezeBertConfig(
            hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
            intermediate_size=4 * hidden, embedding_size=hidden, vocab_size=1000)  # fmt: skip
        model = transformers.SqueezeBertModel(cfg)
    model.config.use_cache = False
    return model


class HFEncoder(nn.Module):
    """A transformers model called on input ids, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def build(name: str, small: bool = False):
    """(module, inputs) of one family."""
    torch.manual_seed(0)
    b_img, b_tok, seq = (2, 2, 64) if small else (32, 8, 512)
    if name in ("mixer", "resmlp"):
        dim, tokens = (64, 16) if small else (768, 196)
        block = MixerBlock if name == "mixer" else ResBlock
        return Stacked([block(dim, tokens) for _ in range(2)]), (torch.randn(b_img, tokens, dim),)
    if name == "densenet":
        c, hw = (16, 8) if small else (64, 56)
        return DenseBlock(c, 8 if small else 32, 4), (torch.randn(b_img, c, hw, hw),)
    if name == "hrnet":
        c, hw = (16, 8) if small else (64, 56)
        return HRFuse(c), (torch.randn(b_img, c, hw, hw),)
    if name == "resnext":
        c, width, groups, hw = (32, 32, 4, 8) if small else (256, 256, 32, 56)
        blocks = Stacked([Bottleneck(c, width, groups) for _ in range(2)])
        return blocks, (torch.randn(b_img, c, hw, hw),)
    if name == "convnext":
        c, hw = (32, 8) if small else (96, 56)
        return Stacked([ConvNeXtBlock(c) for _ in range(2)]), (torch.randn(b_img, c, hw, hw),)
    if name in ("deberta_v2", "mobilebert", "squeezebert"):
        model = HFEncoder(_transformers_encoder(name, small))
        return model, (torch.randint(0, 1000, (b_tok, seq)),)
    raise KeyError(name)


FAMILIES = ("mixer", "resmlp", "deberta_v2", "densenet", "hrnet", "resnext", "mobilebert",
            "squeezebert", "convnext")  # fmt: skip
