"""Small CPU configurations of four model families, written with torch.nn for the capture tests."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))  # fmt: skip

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNetTiny(nn.Module):
    """ResNet-18-like: stem, four stages of basic blocks, global pooling, classifier."""

    def __init__(self, widths=(8, 16, 16, 32), num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())  # fmt: skip
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            blocks.append(BasicBlock(w, w))
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = [z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        if self.causal:
            causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~causal, float("-inf"))
        if mask is not None:
            att = att + mask
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads, causal=False, pre_norm=True):
        super().__init__()
        self.pre_norm = pre_norm
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask=None):
        if self.pre_norm:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class ViTTiny(nn.Module):
    """ViT-like: patch embedding, class token, position embedding, pre-norm blocks, head."""

    def __init__(self, image=16, patch=4, dim=32, depth=2, heads=4, num_classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class BertTiny(nn.Module):
    """BERT-like: token, position and type embeddings, post-norm encoder, pooler."""

    def __init__(self, vocab=100, dim=32, depth=2, heads=4, max_len=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.typ = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([Block(dim, heads, pre_norm=False) for _ in range(depth)])
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask=None):
        b, t = input_ids.shape
        pos = torch.arange(t, device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(pos) + self.typ(torch.zeros_like(input_ids)))
        mask = None
        if attention_mask is not None:
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -1e4
        for layer in self.layers:
            x = layer(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pooler(x[:, 0]))}


class GPT2Tiny(nn.Module):
    """GPT-2-like: token and position embeddings, causal pre-norm blocks, tied LM head."""

    def __init__(self, vocab=100, dim=32, depth=2, heads=4, max_len=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.h = nn.ModuleList([Block(dim, heads, causal=True) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def model_cases():
    """(name, model builder, inputs builder) for each family."""
    ids = lambda: torch.randint(0, 100, (2, 8))  # noqa: E731
    return [
        ("resnet", ResNetTiny, lambda: (torch.randn(2, 3, 16, 16),)),
        ("vit", ViTTiny, lambda: (torch.randn(2, 3, 16, 16),)),
        ("bert", BertTiny, lambda: (ids(), torch.ones(2, 8, dtype=torch.long))),
        ("gpt2", GPT2Tiny, lambda: (ids(), ids())),
    ]
