"""Small CPU configurations of the benchmark architectures (ResNet, ViT, BERT, GPT-2), torch.nn only.

Shapes are tiny so a training step traces and runs in well under a second on a shared CPU; the
structure (BatchNorm, attention, LayerNorm, GELU, dropout, tied embeddings) is what matters.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- ResNet with BatchNorm --------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(8, 16), num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, stride=1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


# --- attention shared by the transformers -----------------------------------------------------
class SelfAttention(nn.Module):
    """Multi-head self-attention: explicit softmax(q k^T) v, or F.scaled_dot_product_attention
    (`sdpa`, without attention dropout)."""

    def __init__(
        self, dim: int, heads: int, dropout: float = 0.0, causal: bool = False, max_len: int = 64,
        sdpa: bool = False,
    ):  # fmt: skip
        super().__init__()
        self.heads, self.causal, self.sdpa = heads, causal, sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        if causal:
            mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def forward(self, x, attn_bias=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, is_causal=self.causal)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.causal:
                att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            if attn_bias is not None:
                att = att + attn_bias
            y = self.attn_drop(F.softmax(att, dim=-1)) @ v
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


# --- ViT --------------------------------------------------------------------------------------
class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, image=16, patch=4, dim=32, depth=2, heads=4, mlp=64, num_classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads, mlp) for _ in range(depth)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.ln(self.blocks(x))
        return self.head(x[:, 0])


# --- BERT encoder -----------------------------------------------------------------------------
class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, dropout: float, sdpa: bool = False):
        super().__init__()
        self.attn = SelfAttention(dim, heads, dropout, sdpa=sdpa)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, bias):
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.drop(self.ffn(x)))


class BertEncoder(nn.Module):
    def __init__(self, vocab=50, dim=32, depth=2, heads=4, ffn=64, max_len=16, dropout=0.0,
                 sdpa=False):  # fmt: skip
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.typ = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            BertLayer(dim, heads, ffn, dropout, sdpa) for _ in range(depth)
        )
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids, attention_mask):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.tok(ids) + self.pos(pos)[None] + self.typ(torch.zeros_like(ids))
        x = self.drop(self.ln(x))
        # Additive mask over keys: 0 where attended, a large negative where padded.
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x, torch.tanh(self.pool(x[:, 0]))


# --- GPT-2 ------------------------------------------------------------------------------------
class GPT2MLP(nn.Module):
    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class GPT2Block(nn.Module):
    def __init__(self, dim=32, heads=4, dropout=0.0, max_len=64, sdpa=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, dropout, causal=True, max_len=max_len, sdpa=sdpa)
        self.mlp = GPT2MLP(dim, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    def __init__(self, vocab=64, dim=32, depth=2, heads=4, max_len=16, dropout=0.0, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            GPT2Block(dim, heads, dropout, max_len, sdpa) for _ in range(depth)
        )
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(pos)[None])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --- inputs and losses ------------------------------------------------------------------------
def make(name: str, dropout: float = 0.0):
    """(model, example inputs, loss(outputs) -> scalar) for one architecture, seeded."""
    torch.manual_seed(0)
    if name == "resnet":
        model, inputs = ResNet(), (torch.randn(2, 3, 16, 16),)
        target = torch.randint(0, 10, (2,))
        return model, inputs, lambda out: F.cross_entropy(out, target)
    if name == "vit":
        model, inputs = ViT(), (torch.randn(2, 3, 16, 16),)
        target = torch.randint(0, 10, (2,))
        return model, inputs, lambda out: F.cross_entropy(out, target)
    if name == "bert":
        model = BertEncoder(dropout=dropout)
        ids = torch.randint(0, 50, (2, 8))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 6:] = 0
        return model, (ids, mask), lambda out: out[0].float().pow(2).mean() + out[1].float().sum()
    if name == "gpt2":
        model = GPT2(dropout=dropout)
        ids = torch.randint(0, 64, (2, 8))
        target = torch.randint(0, 64, (2, 8))
        return (
            model,
            (ids,),
            lambda out: F.cross_entropy(out.float().flatten(0, 1), target.flatten()),
        )
    raise KeyError(name)


ARCHITECTURES = ("resnet", "vit", "bert", "gpt2")
