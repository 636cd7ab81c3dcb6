"""Small versions of resnet50, vit_base, bert-base and gpt2, built with torch.nn (random weights).

They keep each architecture's op mix (BatchNorm + bottlenecks; patch embedding + pre-norm blocks;
post-norm encoder with embeddings; causal decoder with dropout and tanh-gelu) at toy sizes so that
tracing forward and backward stays fast on a CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- ResNet --------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.down is None else self.down(x)
        return F.relu(out + identity)


class ResNet(nn.Module):
    """ResNet-50's structure (stem, max pool, bottleneck stages, avg pool, fc) at toy widths."""

    def __init__(self, widths=(4, 8), blocks=(1, 1), num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 8
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.stem(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- ViT -----------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim, heads, dropout=0.0, causal=False, use_sdpa=True):
        super().__init__()
        self.heads, self.causal, self.use_sdpa = heads, causal, use_sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.use_sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            if self.causal:
                causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
                scores = scores.masked_fill(~causal, float("-inf"))
            if mask is not None:
                scores = scores + mask
            out = self.drop(scores.softmax(-1)) @ v
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, d)))


class Mlp(nn.Module):
    def __init__(self, dim, hidden, approximate="none", dropout=0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.approximate = approximate
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(F.gelu(self.fc1(x), approximate=self.approximate)))


class PreNormBlock(nn.Module):
    def __init__(self, dim, heads, approximate="none", dropout=0.0, causal=False, use_sdpa=True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout, causal, use_sdpa)
        self.mlp = Mlp(dim, 4 * dim, approximate, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """vit_base's structure (conv patch embedding, cls token, position embedding, pre-norm)."""

    def __init__(self, image=16, patch=4, dim=32, depth=2, heads=4, num_classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[PreNormBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# --- BERT ----------------------------------------------------------------------------------------


class BertLayer(nn.Module):
    def __init__(self, dim, heads, use_sdpa):
        super().__init__()
        self.attn = Attention(dim, heads, use_sdpa=use_sdpa)
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-12), nn.LayerNorm(dim, eps=1e-12)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x, mask):
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    """bert-base's encoder: word/position/type embeddings, post-norm layers, pooler, MLM head.

    Even layers use F.scaled_dot_product_attention, odd layers the explicit softmax form.
    """

    def __init__(self, vocab=50, dim=32, depth=2, heads=4, max_len=16):
        super().__init__()
        self.word = nn.Embedding(vocab, dim, padding_idx=0)
        self.position = nn.Embedding(max_len, dim)
        self.token_type = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(dim, heads, i % 2 == 0) for i in range(depth)])
        self.pooler = nn.Linear(dim, dim)
        self.mlm = nn.Linear(dim, vocab)

    def forward(self, ids, token_types, attention_mask):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.ln(self.word(ids) + self.position(pos) + self.token_type(token_types))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        logits = self.mlm(x)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), ignore_index=0
        )
        return loss + pooled.sum() * 0.0 + pooled.pow(2).mean()


# --- GPT-2 ---------------------------------------------------------------------------------------


class GPT2(nn.Module):
    """gpt2's decoder: token + position embeddings, causal pre-norm blocks with dropout and
    tanh-gelu, final layer norm, LM head tied to the token embedding, shifted cross-entropy."""

    def __init__(self, vocab=64, dim=32, depth=2, heads=4, max_len=16, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [
                PreNormBlock(dim, heads, "tanh", dropout, causal=True, use_sdpa=i % 2 == 1)
                for i in range(depth)
            ]
        )
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def make(name: str, seed: int = 0, **config):
    """(model, example inputs) for "resnet50", "vit_base", "bert", "gpt2" (config: constructor
    keyword arguments, e.g. dropout=0.0 for gpt2)."""
    torch.manual_seed(seed)
    if name == "resnet50":
        return ResNet(**config), (torch.randn(2, 3, 32, 32),)
    if name == "vit_base":
        return ViT(**config), (torch.randn(2, 3, 16, 16),)
    if name == "bert":
        ids = torch.randint(1, 50, (2, 8))
        ids[1, 6:] = 0
        types = torch.zeros_like(ids)
        types[:, 4:] = 1
        mask = (ids != 0).long()
        return Bert(**config), (ids, types, mask)
    if name == "gpt2":
        model = GPT2(**config)
        return model, (torch.randint(0, 64, (2, 12)),)
    raise ValueError(name)


MODELS = ("resnet50", "vit_base", "bert", "gpt2")
