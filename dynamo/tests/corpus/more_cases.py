"""More programs: stores into slices and attributes, closures in comprehensions, nested data,
methods on built-in values, and combinations of the constructs above."""

import collections
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import case, module_case


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(4, 4),)


@case(one)
def comprehension_closure(x):
    k = 3
    return [x * k + i for i in range(2)]


@case(one)
def dict_comprehension_from_items(x):
    d = {"a": x, "b": x + 1}
    return {k: v * 2 for k, v in d.items() if k != "b"}


@case(one)
def nested_function_returning_tensor_list(x):
    def parts(t):
        return [t[:, i] for i in range(t.shape[1])]

    return torch.stack(parts(x), dim=1)


@case(one)
def tensor_slice_store(x):
    y = torch.zeros(4, 4)
    y[1:3] = x[1:3]
    y[:, :2] = 1.0
    return y


@case(one)
def zip_enumerate_combined(x):
    out = []
    for i, (a, b) in enumerate(zip(x, x.flip(0))):
        out.append(a * b + i)
    return torch.stack(out)


@case(one)
def reversed_range_loop(x):
    for i in reversed(range(3)):
        x = x - i
    return x


@case(one)
def itertools_free_product(x):
    pairs = [(i, j) for i in range(2) for j in range(2)]
    return sum(x[i, j] for i, j in pairs) if False else x[0, 0] + len(pairs)


@case(one)
def sum_with_start(x):
    return sum([x, x], torch.zeros(4, 4))


@case(one)
def max_over_consts_and_shapes(x):
    return x[: max(1, x.shape[0] - 2)]


@case(one)
def list_index_count(x):
    names = ["a", "b", "a"]
    return x * names.index("b") + names.count("a")


@case(one)
def string_join_keys(x):
    keys = sorted({"b": 1, "a": 2})
    return x * len("".join(keys))


@case(one)
def tuple_of_tensor_unpack_star(x):
    a, *rest = x.unbind(0)
    return a + sum(rest)


@case(one)
def return_nested_dict_of_lists(x):
    return {"layers": [{"w": x}, {"w": x.t()}], "n": 2}


@case(one)
def inplace_list_add(x):
    items = [x]
    items += [x * 2]
    return torch.stack(items)


@case(one)
def tuple_concat_in_loop(x):
    shapes = ()
    for t in (x, x[0]):
        shapes = shapes + (t.dim(),)
    return x * sum(shapes)


@case(one)
def optional_arg_default_none(x, mask=None, scale=1.0):
    if mask is None:
        mask = torch.ones_like(x)
    return x * mask * scale


@case(one)
def kwargs_passthrough(x):
    def inner(t, **kw):
        return t * kw.get("a", 1) + kw.get("b", 0)

    return inner(x, a=2, b=3)


@case(one)
def args_passthrough(x):
    def inner(*ts):
        return sum(ts)

    return inner(x, x, x)


@case(one)
def recursive_list_flatten(x):
    def flat(v):
        if isinstance(v, (list, tuple)):
            out = []
            for i in v:
                out.extend(flat(i))
            return out
        return [v]

    return sum(flat([x, [x, (x,)]]))


@case(one)
def namedtuple_created_inside(x):
    P = POINT
    p = P(x, x * 2)
    return p.x + p.y, p[1]


POINT = collections.namedtuple("Point", "x y")


@case(one)
def chained_getattr_on_module_global(x):
    return F.relu(torch.nn.functional.softplus(x))


@case(one)
def getattr_default(x):
    return getattr(x, "missing_attr", 5) * x


@case(one)
def isinstance_tuple_classes(x):
    return x * 2 if isinstance(x, (int, torch.Tensor)) else x


@case(one)
def len_of_dict_and_str(x):
    return x * (len({"a": 1}) + len("abc"))


@case(one)
def all_any_generators(x):
    return x * 2 if all(d > 0 for d in x.shape) and any(d > 3 for d in x.shape) else x


@case(one)
def min_max_of_shape(x):
    return x.view(-1)[: min(x.shape) * max(x.shape)]


@case(one)
def torch_functions_with_kwargs(x):
    return torch.sum(x, dim=(0, 1)), torch.mean(x, dim=-1, keepdim=True), torch.cumprod(x, dim=0)


@case(one)
def mixed_python_and_tensor_math(x):
    n = x.shape[0]
    scale = (n**0.5) / 2
    return x * scale - n % 3


@case(one, graphs=0)
def chained_comparisons_shapes(x):
    return x if 1 < x.shape[0] < 10 < 100 else -x


@case(one)
def del_local(x):
    y = x * 2
    z = y + 1
    del y
    return z


@case(lambda: (r(2, 4, 4),))
def batched_matmul_softmax(x):
    return torch.softmax(x @ x.transpose(-1, -2) / 2.0, dim=-1) @ x


@case(lambda: (r(4, 4), 2))
def int_arg_used_in_shape(x, n):
    return x.repeat(n, 1)


@case(lambda: (r(4, 4), (2, 8)))
def tuple_arg_as_shape(x, shape):
    return x.reshape(shape)


@case(lambda: (r(4, 4), [1, 3]))
def list_arg_as_index(x, idx):
    return x[idx]


@module_case(lambda: (r(2, 4),))
class ModuleWithConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = collections.namedtuple("Cfg", "hidden act")(8, "gelu")
        self.fc = nn.Linear(4, self.cfg.hidden)

    def forward(self, x):
        y = self.fc(x)
        return F.gelu(y) if self.cfg.act == "gelu" else F.relu(y)


@module_case(lambda: (r(2, 4),))
class ModuleCallsFunctionalWithParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias).softmax(-1)


@module_case(lambda: (r(2, 4),))
class ModuleNamedChildrenLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    def forward(self, x):
        for name in self.blocks:
            x = self.blocks[name](x)
        return x


@module_case(lambda: (r(2, 4),))
class ModuleSequentialIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.seq[2](self.seq[0](x)), len(self.seq)


@module_case(lambda: (r(2, 4),))
class ResidualScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return x + self.alpha * self.lin(x)


@case(one)
def itertools_chain(x):
    return sum(itertools.chain([1, 2], [3])) * x if False else x * 6
