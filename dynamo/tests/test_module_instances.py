"""One compiled frame for every layer of a stack: a module's forward that is its own frame (a graph
break at each layer's call, as FSDP2's fully_shard layers give) is traced for any instance once a
second instance of the same class reaches it, with types and parameter shapes guarded instead of
identities; a loop's resume function between layers compiles nothing and does not use up the
cache limit."""

import warnings

import torch
import torch.nn as nn

import ember
from ember.dynamo import CompileCounter, convert


class Layer(nn.Module):
    def __init__(self, d, bias=True):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d, bias=bias)
        self.scale = 0.5

    def forward(self, x):
        return x + self.scale * torch.tanh(self.fc(self.norm(x)))


def _hooked(layer):
    # a module with a backward hook is called eagerly (a graph break at the call, as at a
    # fully_shard layer's), and its forward is captured as its own frame
    layer.register_full_backward_hook(lambda *a: None)
    return layer


class Stack(nn.Module):
    def __init__(self, layers, d=8, **kw):
        super().__init__()
        self.layers = nn.ModuleList(_hooked(Layer(d, **kw)) for _ in range(layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        x = x * 2
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum(-1)


def _compiled_codes():
    return {c.co_name: s for c, s in convert._touched_codes.items() if s.graphs or s.graphless}


def test_twelve_layers_share_one_entry_and_match_eager():
    ember.reset()
    torch.manual_seed(0)
    model, x = Stack(12), torch.randn(3, 8)
    cnt = CompileCounter()
    cm = ember.compile(model, backend=cnt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cache-limit warning
        for _ in range(3):
            assert torch.allclose(cm(x), model(x), atol=1e-6)
    codes = _compiled_codes()
    # the first layer's entry, then one for any instance; every layer ran compiled
    layer_state = next(s for c, s in convert._touched_codes.items()
                       if c is Layer.forward.__code__)  # fmt: skip
    assert (layer_state.graphs, layer_state.generic) == (2, True)
    resume = next(s for name, s in codes.items() if "resume" in name)
    assert resume.graphs == 1 and resume.graphless == 11  # the head after the last layer
    frames = cnt.frame_count
    cm(x)
    assert cnt.frame_count == frames  # the next call compiles nothing


def test_an_instance_that_differs_gets_its_own_entry():
    ember.reset()
    torch.manual_seed(0)
    model = Stack(4)
    model.layers[2] = _hooked(Layer(8, bias=False))  # no bias: the generic entry's guard refuses it
    model.layers[3].scale = 2.0  # an attribute read as a constant
    model.layers[1].fc.weight = nn.Parameter(torch.randn(8, 8).t())  # other strides
    x = torch.randn(3, 8)
    cm = ember.compile(model, backend="eager")
    for _ in range(2):
        assert torch.allclose(cm(x), model(x), atol=1e-6)
    model.layers[0].fc.weight.data.mul_(3)  # values are read at each call, not traced in
    assert torch.allclose(cm(x), model(x), atol=1e-6)


def test_parameters_swapped_in_place_are_read_at_each_call():
    # FSDP2 swaps a layer's registered parameters (sharded <-> gathered) around each forward
    ember.reset()
    torch.manual_seed(0)
    model, x = Stack(3), torch.randn(3, 8)
    cm = ember.compile(model, backend="eager")
    cm(x)
    for layer in model.layers:
        layer.fc._parameters["weight"] = nn.Parameter(torch.randn(8, 8))
    assert torch.allclose(cm(x), model(x), atol=1e-6)
