"""Objects created or copied while tracing: copy.copy/deepcopy, classes with their own
__getattribute__/__setattr__/__delattr__/__getattr__, properties, `del`, `id()` as a key,
dispatch tables keyed by classes, cached and constant-result functions. The model: transformers'
`config.get_text_config(decoder=True)`, which deep-copies a config and renames its fields."""

import copy
import dataclasses
import functools

import torch

from . import case


def one():
    return (torch.randn(4, 3),)


class Config:
    """A config in the style of transformers' PreTrainedConfig: names are remapped through a
    class-level `attribute_map` on every read and write."""

    attribute_map = {"hidden_size": "d_model", "num_layers": "n_layer"}

    def __init__(self, d_model, n_layer, decoder_layers, decoder_heads):
        self.d_model = d_model
        self.n_layer = n_layer
        self.decoder_layers = decoder_layers
        self.decoder_heads = decoder_heads
        self.names = ["a", "b"]

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def to_dict(self):
        return copy.deepcopy(self.__dict__)

    def decoder_config(self):
        out = copy.deepcopy(self)
        for key in out.to_dict():
            if key.startswith("decoder_"):
                new_key = {"decoder_layers": "num_layers"}.get(key, key[len("decoder_"):])
                value = getattr(out, key)
                delattr(out, key)
                setattr(out, new_key, value)
        return out


CONFIG = Config(8, 4, 2, 3)


@case(one)
def deepcopy_and_rename_fields(x):
    dec = CONFIG.decoder_config()
    assert not hasattr(dec, "decoder_layers")
    return x * dec.num_layers + dec.heads + dec.hidden_size + CONFIG.num_layers


@case(one)
def deepcopy_result_returned(x):
    dec = CONFIG.decoder_config()
    dec.names.append("c")  # the copy's list, not CONFIG's
    return x + len(CONFIG.names), dec


@case(one)
def deepcopy_keeps_shared_references(x):
    shared = [1, 2]
    tree = {"a": shared, "b": (shared, 3), "c": CONFIG}
    new = copy.deepcopy(tree)
    new["a"].append(5)
    return x * len(new["b"][0]) + len(shared) + (new["c"] is not CONFIG) + new["c"].n_layer


@case(one)
def shallow_copy_shares_values(x):
    c = copy.copy(CONFIG)
    c.d_model = 100
    same_list = c.names is CONFIG.names
    return x * c.hidden_size + CONFIG.hidden_size + same_list


class Logged:
    """Every write goes through __setattr__ (which doubles numbers) and is logged."""

    def __init__(self, v):
        object.__setattr__(self, "log", [])
        self.v = v

    def __setattr__(self, name, value):
        self.log.append(name)
        object.__setattr__(self, name, value * 2 if isinstance(value, int) else value)

    def __delattr__(self, name):
        self.log.append("-" + name)
        super().__delattr__(name)


@case(one)
def custom_setattr_and_delattr_on_new_object(x):
    o = Logged(3)
    o.w = 5
    del o.w
    missing = not hasattr(o, "w")
    return x * o.v + len(o.log) + missing, o.log


class Defaults:
    """Missing attributes come from __getattr__; `scale` is a property with a setter."""

    def __init__(self):
        self._scale = 1

    def __getattr__(self, name):
        if name.startswith("opt_"):
            return len(name)
        raise AttributeError(name)

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value + 1


@case(one)
def getattr_fallback_and_property_setter(x):
    d = Defaults()
    d.scale = 2
    has_other = hasattr(d, "other")
    return x * d.scale + d.opt_abc + has_other


@case(one)
def id_of_new_objects_as_dict_keys(x):
    a, b = Logged(1), Logged(2)
    seen = {id(a): x, id(b): x * 2}
    seen[id(CONFIG)] = x * 3
    same = id(a) == id(a) and id(a) != id(b)
    return seen[id(b)] + seen[id(CONFIG)] + same, id(a) in seen


@dataclasses.dataclass(frozen=True)
class Frozen:
    n: int


@case(one)
def frozen_dataclass_write_raises(x):
    f = Frozen(2)
    try:
        f.n = 5
    except dataclasses.FrozenInstanceError:
        return x * f.n
    return x


def _double(x):
    return x * 2


def _negate(x):
    return -x


DISPATCH = {int: _double, float: _negate, list: torch.relu}


@case(one)
def dispatch_table_keyed_by_class(x):
    fn = DISPATCH.get(type(1.5))
    return DISPATCH[int](fn(x)) + DISPATCH[list](x), DISPATCH.get(str) is None


@functools.lru_cache
def _cached_scale(k):
    return k * 3


def _probe():
    import importlib.util

    return importlib.util.find_spec("torch") is not None


_probe._dynamo_marked_constant = True  # what torch._dynamo.assume_constant_result sets


@case(one)
def cached_and_constant_result_functions(x):
    return x * _cached_scale(2) + _probe()


class CustomCopy:
    def __init__(self):
        self.v = 2

    def __deepcopy__(self, memo):
        out = CustomCopy()
        out.v = self.v + 1
        return out


CUSTOM = CustomCopy()


@case(one, graphs=1, breaks=1)
def deepcopy_with_own_deepcopy_breaks(x):
    return x * copy.deepcopy(CUSTOM).v


class Slotted:
    __slots__ = ("v",)

    def __init__(self):
        self.v = 2


SLOTTED = Slotted()


@case(one, graphs=1, breaks=1)
def deepcopy_of_slots_object_breaks(x):
    return x * copy.deepcopy(SLOTTED).v


@case(one, graphs=2, breaks=1)
def id_value_used_as_a_number_breaks(x):
    y = x + 1
    return y * len(str(id(CONFIG)))


class SlottedPair:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __eq__(self, other):  # for the comparison with eager (no __dict__ to compare)
        return type(other) is SlottedPair and torch.equal(self.a, other.a) and self.b == other.b


@case(one)
def slotted_object_made_and_returned(x):
    p = SlottedPair(x, 2)
    p.b += 1
    return p.a * p.b, p, hasattr(p, "c")


@case(lambda: (torch.randn(4, 3), Config(8, 4, 2, 3), Logged(1)))
def writes_into_a_pre_existing_objects_dict_are_read_back(x, c, o):
    c.__dict__["d_model"] = 5
    o.__dict__["v"] = 7
    return x * c.hidden_size + Config.__getattribute__(c, "n_layer") + o.v


@case(one)
def writing_to_a_bare_object_raises(x):
    sentinel = object()
    try:
        sentinel.flag = 1
    except AttributeError:
        return x - 1
    return x + 1
