"""Every layer of a stack through one compiled program (dynamo's generic module frames), trained
through aot_autograd and inductor: each layer's call runs eagerly (a backward hook, as FSDP2's
fully_shard layers' hooks do) and its forward is its own frame; the layers after the first share
one cache entry whose parameters are read at each call. Parameters after three SGD steps equal
eager's."""

import copy
import warnings

import torch
import torch.nn as nn

import ember
from ember.dynamo import convert


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.out = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.out(torch.nn.functional.gelu(self.fc(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, layers=10, d=16):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.layers = nn.ModuleList(Layer(d) for _ in range(layers))
        for layer in self.layers:
            layer.register_full_backward_hook(lambda *a: None)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).square().mean()


def _train(model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam would scale rounding up
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        model(torch.randn(4, 8, generator=g)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_ten_layers_train_through_two_programs_and_match_eager():
    ember.reset()
    torch.manual_seed(0)
    eager = Stack()
    model = copy.deepcopy(eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no cache-limit fallback to eager
        _train(ember.compile(model))
    _train(eager)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)
    state = next(s for c, s in convert._touched_codes.items() if c is Layer.forward.__code__)
    assert (state.graphs, state.generic) == (2, True)


class Normed(nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.a = nn.BatchNorm1d(4)
        self.b = self.a if shared else nn.BatchNorm1d(4)

    def forward(self, x):
        return self.b(self.a(x) * 3 + 1)


def test_a_layer_sharing_a_module_the_others_do_not_is_traced_for_itself():
    # a generic trace writes running statistics in place: where one layer's two BatchNorms are
    # one module, the two buffers the trace kept apart are one (the trace falls back to the
    # layer's own instead of failing on an input written and aliased)
    ember.reset()
    layers = [Normed(False), Normed(False), Normed(True)]
    for layer in layers:
        layer.register_full_backward_hook(lambda *a: None)
    model = nn.Sequential(*layers)
    eager = copy.deepcopy(model)
    compiled = ember.compile(model)
    x = torch.randn(8, 4) * 5 + 3
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))
    for got, want in zip(model.modules(), eager.modules()):
        if isinstance(got, nn.BatchNorm1d):
            torch.testing.assert_close(got.running_mean, want.running_mean)
