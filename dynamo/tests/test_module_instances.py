"""One compiled frame for every layer of a stack: a module's forward that is its own frame (a graph
break at each layer's call, as FSDP2's fully_shard layers give) is traced for any instance once a
second instance of the same class reaches it, with types and parameter shapes guarded instead of
identities; a loop's resume function between layers compiles nothing and does not use up the
cache limit."""

import functools
import warnings

import pytest
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


# -- what one instance holds differently must not reach another through the generic entry ------
class _Cfg:
    k = 1.0  # a class default one layer's config sets for itself


class _Desc:  # a descriptor computing from the instance
    def __get__(self, obj, cls):
        return self if obj is None else obj.k * 3


class _Experts(nn.Module):  # a length read from instance state
    def __init__(self):
        super().__init__()
        self.n = 1

    def __len__(self):
        return self.n


_FIRST: list = []
_SCALE: dict = {}


class Odd(nn.Module):
    scale = 0.5
    desc = _Desc()

    def __init__(self, mode):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 1.0
        self.cfg = _Cfg()
        self.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)
        self.opt = nn.ModuleDict({"a": nn.Identity(), "b": None})
        self.mode = mode
        self.tied = self.fc
        self.other = nn.Linear(4, 4)
        self.experts = _Experts()

    @functools.cached_property
    def twice(self):
        return self.k * 2

    def forward(self, x):
        m = self.mode  # each layer of the test reads one feature
        if m == "shadow":
            return x + self.scale * self.fc(x)
        if m == "hasattr":
            return x + (self.extra if hasattr(self, "extra") else 1.0) * self.fc(x)
        if m == "forward":
            return x + self.fc(x)
        if m == "dict_key":
            return x + _SCALE[self] * self.fc(x)
        if m == "is":
            return self.fc(x) if self is _FIRST[0] else x + self.fc(x)
        if m == "tied":
            return self.fc(x) if self.tied is self.fc else x + self.tied(self.fc(x))
        if m == "len":
            return x + len(self.experts) * self.fc(x)
        if m == "param_is":
            w = self.fc.weight is self.other.weight
            return self.fc(x) * 10 if w else x + self.other(self.fc(x))
        if m == "partial":
            return x + self.act(self.fc(x))
        if m == "none_entry":
            b = self.opt["b"]
            return self.fc(x) if b is None else b(self.fc(x))
        if m == "config":
            return x + self.cfg.k * self.fc(x)
        if m == "cached":
            return x + self.twice * self.fc(x)
        if m == "descriptor":
            return x + self.desc * self.fc(x)
        return x + self.__dict__.get("k") * self.fc(x)  # "instance_dict"


_ODD = {
    "shadow": lambda m: setattr(m, "scale", 3.0),
    "hasattr": lambda m: setattr(m, "extra", 10.0),
    "forward": lambda m: setattr(m.fc, "forward", lambda x: x * 100),
    "dict_key": lambda m: _SCALE.__setitem__(m, 9.0),
    "is": lambda m: _FIRST.__setitem__(0, m),
    "tied": lambda m: setattr(m, "tied", nn.Linear(4, 4)),
    "len": lambda m: setattr(m.experts, "n", 4),
    "param_is": lambda m: setattr(m.other, "weight", m.fc.weight),
    "partial": lambda m: setattr(m, "act", functools.partial(
        torch.nn.functional.leaky_relu, negative_slope=5.0)),
    "none_entry": lambda m: m.opt.__setitem__("b", nn.Linear(4, 4)),
    "config": lambda m: setattr(m.cfg, "k", 5.0),
    "cached": lambda m: setattr(m, "k", 7.0),
    "descriptor": lambda m: setattr(m, "k", 7.0),
    "instance_dict": lambda m: setattr(m, "k", 7.0),
}


@pytest.mark.parametrize("mode", sorted(_ODD))
def test_what_the_third_instance_holds_differently_is_seen(mode):
    ember.reset()
    torch.manual_seed(0)
    model = Stack(0)
    model.layers = nn.ModuleList(_hooked(Odd(mode)) for _ in range(3))
    layers = model.layers
    _FIRST[:] = [None]
    _SCALE.clear()
    _SCALE.update({layer: 1.0 for layer in layers})
    _ODD[mode](layers[2])  # the first two share the generic entry's trace; the third differs
    x = -torch.randn(3, 8).abs()[:, :4].contiguous()
    model.head = nn.Identity()
    cm = ember.compile(model, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(cm(x), model(x))
