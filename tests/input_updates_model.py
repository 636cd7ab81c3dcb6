"""The module test_input_updates.py, test_indexed_writes.py and the CUDA counterpart run: a
static KV cache written a row per step, a counter of whole-tensor copies, the steps against
eager, and a fixture recording the index_put extern's calls."""

import copy

import pytest
import torch
from torch import nn

import ember
import ember.inductor.lowering_views as lowering_views


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


@pytest.fixture
def in_place_calls(monkeypatch):
    """The in_place flag of every index_put extern call."""
    calls = []
    real = lowering_views.EXTERN_KERNELS["prims.index_put"]

    def spy(a, indices, values, accumulate=False, in_place=False):
        calls.append(in_place)
        return real(a, indices, values, accumulate, in_place)

    monkeypatch.setitem(lowering_views.EXTERN_KERNELS, "prims.index_put", spy)
    ember.reset()
    yield calls
    ember.reset()


def _steps(model, n=5):
    """Ember against eager (a copy of `model`) over `n` steps; (copies per later call, buffer
    addresses kept)."""
    ref = copy.deepcopy(model)
    compiled = ember.compile(model)
    addresses = (model.k.data_ptr(), model.v.data_ptr())
    copies = []
    torch.manual_seed(0)
    with torch.no_grad():
        for i in range(n):
            new, pos = torch.randn(1, 2, 1, 4), torch.tensor([i])
            counter = _CountCopies()
            with counter:
                got = compiled(new, pos)
            copies.append(counter.n)
            torch.testing.assert_close(got, ref(new, pos))
            torch.testing.assert_close(model.k, ref.k)
            torch.testing.assert_close(model.v, ref.v)
    return copies[-1], (model.k.data_ptr(), model.v.data_ptr()) == addresses
