"""Small plain-torch.nn versions of the gpu-core architectures, for CPU runs that need no timm or
transformers: a ResNet with BatchNorm, a ViT, a BERT-style encoder and a GPT-2-style decoder.

They are written to exercise the same operator mix as the real models (conv+BN+ReLU with
residuals, patch embedding, multi-head attention, LayerNorm, GELU, causal masks, tied embeddings)
at sizes that run in milliseconds on two CPU cores.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm and a residual (projected when the shape changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.proj is None else self.proj(x)
        return F.relu(out + skip)


class SmallResNet(nn.Module):
    """A ResNet-18-shaped network (stem, 4 stages, global pool, classifier) with narrow widths."""

    def __init__(self, widths=(16, 32, 64, 128), blocks=(1, 1, 1, 1), num_classes=100):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A transformer block: pre-LN (ViT, GPT-2) or post-LN (BERT)."""

    def __init__(self, dim, heads, causal=False, pre_norm=True):
        super().__init__()
        self.pre_norm = pre_norm
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class SmallViT(nn.Module):
    """A ViT: conv patch embedding, class token, learned positions, pre-LN blocks, linear head."""

    def __init__(self, image=32, patch=4, dim=64, depth=2, heads=4, num_classes=100):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class SmallBert(nn.Module):
    """A BERT-style masked-LM: token+position+type embeddings, post-LN encoder, tied LM head."""

    def __init__(self, vocab=1000, dim=64, depth=2, heads=4, max_len=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.typ = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, pre_norm=False) for _ in range(depth)])
        self.transform = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(pos) + self.typ(torch.zeros_like(ids)))
        x = self.transform(self.blocks(x))
        return x @ self.tok.weight.t() + self.bias


class SmallGPT2(nn.Module):
    """A GPT-2-style causal LM: token+position embeddings, pre-LN causal blocks, tied LM head."""

    def __init__(self, vocab=1000, dim=64, depth=2, heads=4, max_len=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, causal=True) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.blocks(self.tok(ids) + self.pos(pos))
        return self.ln_f(x) @ self.tok.weight.t()


class MLP(nn.Module):
    """`depth` Linear+ReLU layers of one width: the overhead suite's small multi-kernel model."""

    def __init__(self, width=256, depth=8):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
