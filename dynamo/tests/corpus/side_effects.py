"""Mutations of Python state the graph cannot hold, replayed after it runs."""

import torch
import torch.nn as nn

from . import case, module_case


def r(*shape):
    return torch.randn(*shape)


class Holder:
    def __init__(self):
        self.value = 0
        self.items = []


STATE = {"calls": 0}
COUNTER = [0]


@case(lambda: (r(3), []))
def append_to_input_list(x, out):
    out.append(x * 2)
    out.append(x + 1)
    return len(out)


@case(lambda: (r(3), {"a": 1}))
def write_input_dict(x, d):
    d["b"] = x * 3
    d["a"] = d["a"] + 1
    return x


@case(lambda: (r(3), Holder()))
def setattr_on_object(x, h):
    h.value = h.value + 1
    h.last = x * 2
    return x + h.value


@case(lambda: (r(3), Holder()))
def mutate_object_list(x, h):
    h.items.append(x)
    return x * len(h.items)


# The global's value is guarded: each call sees a new value and recompiles.
@case(lambda: (r(3),), graphs=2)
def global_dict_counter(x):
    STATE["calls"] = STATE["calls"] + 1
    return x * 2


# The global's value is guarded: each call sees a new value and recompiles.
@case(lambda: (r(3),), graphs=2)
def global_list_item(x):
    COUNTER[0] += 1
    return x + 1


_total = 0


# The global's value is guarded: each call sees a new value and recompiles.
@case(lambda: (r(3),), graphs=2)
def global_assignment(x):
    global _total
    _total = _total + 1
    return x * 3


@case(lambda: (r(3), [1, 2, 3]))
def list_pop_input(x, items):
    v = items.pop()
    return x * v


@case(lambda: (r(3), {"k": 1, "j": 2}), graphs=0)
def dict_pop_input(x, d):
    d.pop("k")
    return x, len(d)


@module_case(lambda: (r(2, 4),))
class ModuleAttributeWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.last_norm = None

    def forward(self, x):
        y = self.lin(x)
        self.last_norm = y.norm()
        self.steps = getattr(self, "steps", 0) + 1
        return y


# The cache list grows each call and its length is guarded: one graph per call.
@module_case(lambda: (r(2, 4),), graphs=2)
class ModuleCacheTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = []

    def forward(self, x):
        self.cache.append(x * 2)
        return x + len(self.cache)


@case(lambda: (r(3), Holder()))
def read_after_write(x, h):
    h.value = 5
    return x * h.value


@case(lambda: (r(3), [r(3), r(3)]))
def list_of_tensors_input(x, ts):
    ts[0] = ts[0] + x
    return sum(ts)


@case(lambda: (r(3), [r(3)]), graphs=2, breaks=1)
def side_effect_then_break(x, out):
    out.append(x + 1)
    print("after append")
    out.append(x + 2)
    return out[0] * 2


_LOG = __import__("logging").getLogger("ember.dynamo.corpus")


@case(lambda: (r(3),))
def logger_call_replayed(x):
    y = x * 2
    _LOG.debug("value %s", 3)
    return y + 1


@case(lambda: (r(3), {}))
def exception_handled_in_trace(x, d):
    try:
        v = d["missing"]
    except KeyError:
        v = 2
    try:
        raise ValueError("boom")
    except (TypeError, ValueError) as e:
        v = v + len(e.args)
    return x * v


class Scaled:
    """A context manager written in Python that flips a flag and restores it (transformers'
    configs do this around attribute reads)."""

    def __init__(self, holder, factor):
        self.holder, self.factor = holder, factor

    def __enter__(self):
        self.saved = self.holder.value
        self.holder.value = self.factor
        return self

    def __exit__(self, *exc):
        self.holder.value = self.saved
        return False


@case(lambda: (r(3), Holder()))
def with_user_context_manager(x, h):
    with Scaled(h, 3) as s:
        y = x * h.value + s.factor
    return y * (h.value + 1)


SCALE = Scaled(Holder(), 5)


@case(lambda: (r(3),))
def with_global_context_manager(x):
    with SCALE:
        y = x * SCALE.holder.value
    return y + SCALE.holder.value


class Flag:
    def __init__(self):
        self.on = False
        self.value = None


FLAG = Flag()


@case(lambda: (r(3),))
def attribute_set_then_restored(x):
    # The net effect on FLAG is nothing (transformers' compile-time context variables do this):
    # no write is replayed, and a guard keeps the restored values true.
    FLAG.value = x.shape[0]
    FLAG.on = True
    y = x * FLAG.value
    FLAG.value = None
    FLAG.on = False
    return y
