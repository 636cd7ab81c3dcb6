"""The module test_input_updates.py and its CUDA counterpart run: a static KV cache written a row
per step, and a counter of whole-tensor copies."""

import torch
from torch import nn


class Cache(nn.Module):
    """Attention over a static cache of 8 slots, written at `pos` (two ways)."""

    def __init__(self, read_old=False, accumulate=False, rounds=1):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 8, 4))
        self.register_buffer("v", torch.zeros(1, 2, 8, 4))
        self.read_old, self.accumulate, self.rounds = read_old, accumulate, rounds

    def forward(self, new, pos):
        before = self.k.sum() if self.read_old else 0.0
        self.k.index_copy_(2, pos, new)
        if self.accumulate:
            self.v.index_put_((torch.zeros_like(pos), torch.zeros_like(pos), pos), new[0, 0],
                              accumulate=True)  # fmt: skip
        else:
            self.v[:, :, pos] = new * 2
        out = new
        for _ in range(self.rounds):  # (more kernels: enough for a CUDA graph)
            out = (out @ self.k.transpose(-1, -2)).softmax(-1) @ self.v
        return out + before


class _CountCopies(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            self.n += 1
        return func(*args, **(kwargs or {}))
